"""The `yolox` decoder and the top-left letterbox, on arrays whose answers are known."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from edged.daemon.capture.preprocess import Preprocessor, Transform
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec


def spec(h: int = 64, w: int = 64, **kw: object) -> InputSpec:
    return InputSpec.model_validate(
        {"name": "images", "shape": [1, 3, h, w], "layout": "NCHW", "color": "BGR", "pad_value": 114, **kw}
    )


def test_yolox_decodes_grid_offsets_with_objectness() -> None:
    # 64x64 at strides 8/16/32: 64 + 16 + 4 = 84 cells; stride 16's cell (x 1, y 2) is row 64 + 2*4 + 1
    out = np.zeros((2, 84, 7), np.float32)
    out[0, 73] = [0.5, 0.5, math.log(2.0), 0.0, 0.9, 0.1, 0.8]  # centre (24, 40), 32 x 16, obj 0.9, class 1
    out[0, 0] = [0.0, 0.0, 0.0, 0.0, 0.4, 0.9, 0.0]  # obj 0.4 x cls 0.9 = 0.36: below the threshold
    labels = ["a", "b"]
    dec = build_decoder(DecoderSpec(type="yolox"), spec(), labels, {"output": (2, 84, 7)})
    same = Transform(1.0, 1.0, 0.0, 0.0, 64, 64)
    [dets] = dec.decode({"output": out}, [same], DecodeOptions(score_threshold=0.5))  # the padding row: not decoded
    assert len(dets) == 1
    d = dets[0]
    assert (d.label, d.class_id) == ("b", 1) and d.score == pytest.approx(0.72)
    assert d.box == pytest.approx((8.0, 32.0, 40.0, 48.0))
    # a frame twice the size, letterboxed top left: the box scales back, no offset
    [[big]] = dec.decode({"output": out}, [Transform(0.5, 0.5, 0.0, 0.0, 128, 128)], DecodeOptions(0.5))
    assert big.box == pytest.approx((16.0, 64.0, 80.0, 96.0))


def test_yolox_checks_the_grid_and_the_classes() -> None:
    with pytest.raises(DecoderError, match=re.escape("has 80 cells; a 64x64 input at strides [8, 16, 32] has 84")):
        build_decoder(DecoderSpec(type="yolox"), spec(), [], {"output": (1, 80, 6)})
    with pytest.raises(DecoderError, match=re.escape("yolox: 2 classes in the output, 3 labels")):
        build_decoder(DecoderSpec(type="yolox"), spec(), ["a", "b", "c"], {"output": (1, 84, 7)})
    p6 = DecoderSpec(type="yolox", params={"strides": [8, 16, 32, 64]})
    build_decoder(p6, spec(128, 128), [], {"output": (1, 256 + 64 + 16 + 4, 6)})


@pytest.mark.parametrize("align", ["center", "topleft"])
def test_letterbox_alignment_maps_boxes_back_exactly(align: str) -> None:
    # page.png's size into a 416 square: 416 x 206.9 -> rounded 207 centred, truncated 206 at the top left
    s = spec(416, 416, **({"letterbox": "topleft"} if align == "topleft" else {}))
    frame = np.zeros((191, 384, 3), np.uint8)
    frame[40:120, 100:300] = 255  # a white block: rows 40-119, columns 100-299
    pre = Preprocessor(s)
    row = pre.new_row()
    t = pre.run(frame, row)
    nh = 206 if align == "topleft" else 207
    assert (t.pad_x, t.pad_y) == ((0.0, 0.0) if align == "topleft" else (0.0, float((416 - nh) // 2)))
    assert t.scale_y == pytest.approx(nh / 191) and t.scale_x == pytest.approx(416 / 384)
    grey = np.all(row == 114, axis=0)  # the padding, channel by channel
    if align == "topleft":
        assert grey[nh:].all() and not grey[:nh].all()
    else:
        assert grey[: int(t.pad_y)].all() and grey[int(t.pad_y) + nh :].all()
    # where the block landed in the model's input, mapped back through the transform: the block again
    ys, xs = np.nonzero(row[0] > 127)
    model_box = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
    back = t.to_source(model_box)[0]
    assert back == pytest.approx([100, 40, 300, 120], abs=1.0)
    exact = np.array([[100 * t.scale_x, 40 * t.scale_y + t.pad_y, 300 * t.scale_x, 120 * t.scale_y + t.pad_y]])
    assert t.to_source(exact.astype(np.float32))[0] == pytest.approx([100, 40, 300, 120], abs=1e-3)


def test_default_letterbox_stays_out_of_the_manifest() -> None:
    assert "letterbox" not in spec().model_dump(exclude_none=True) and spec().align == "center"
    assert spec(letterbox="topleft").model_dump(exclude_none=True)["letterbox"] == "topleft"
