"""Decoders, through real ONNX Runtime, on models whose outputs are known exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import cv2
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.errors import DecoderError
from edged.models.demo import DemoAssets
from edged.models.demo.video import FACES
from edged.models.package import DecoderSpec, InputSpec

Rows = Mapping[int, Sequence[tuple[int, float, Sequence[float]]]]
GRIDS = [{"cells": 4, "anchors": 1}, {"cells": 2, "anchors": 2}]  # 16 + 8 anchors on a 64x64 input
SPEC = InputSpec(name="x", shape=[3, 64, 64, 3], layout="NHWC", resize="letterbox")
DECODER = DecoderSpec(type="ssd_anchors", params={"grids": GRIDS, "scores": ["s1", "s2"], "boxes": ["b1", "b2"]})


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


def constant_model(path: Path, outputs: dict[str, np.ndarray], spec: InputSpec = SPEC) -> Path:
    """An ONNX model with input x whose outputs are the given constants (+ 0 * mean(x), so x is used).
    Integer constants come out as int32, as TensorRT's EfficientNMS gives num_dets and classes."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "raxes"], ["m"], keepdims=0),
        helper.make_node("Mul", ["m", "zero"], ["z"]),
    ]
    inits = [
        numpy_helper.from_array(np.zeros((), np.float32), "zero"),
        numpy_helper.from_array(np.arange(1, len(spec.shape), dtype=np.int64), "raxes"),
    ]
    outs = []
    for name, value in outputs.items():
        rank = value.ndim
        inits.append(numpy_helper.from_array(value.astype(np.float32), f"{name}_c"))
        inits.append(numpy_helper.from_array(np.arange(1, rank, dtype=np.int64), f"{name}_ax"))
        nodes.append(helper.make_node("Unsqueeze", ["z", f"{name}_ax"], [f"{name}_z"]))
        is_int = np.issubdtype(value.dtype, np.integer)
        nodes.append(helper.make_node("Add", [f"{name}_c", f"{name}_z"], [f"{name}_f" if is_int else name]))
        if is_int:
            nodes.append(helper.make_node("Cast", [f"{name}_f"], [name], to=TensorProto.INT32))
        elem = TensorProto.INT32 if is_int else TensorProto.FLOAT
        outs.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, spec.shape)
    g = helper.make_graph(nodes, "constant", [x], outs, inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def outputs_with(rows: Rows) -> dict[str, np.ndarray]:
    """Per batch row: (anchor index over all 24, probability, [dx, dy, w, h]); every other anchor scores ~0."""
    scores = np.full((3, 24, 1), -20.0, np.float32)
    boxes = np.zeros((3, 24, 16), np.float32)
    for row, entries in rows.items():
        for anchor, p, box in entries:
            scores[row, anchor, 0] = logit(p)
            boxes[row, anchor, :4] = box
    return {"s1": scores[:, :16], "s2": scores[:, 16:], "b1": boxes[:, :16], "b2": boxes[:, 16:]}


def run(tmp_path: Path, rows: Rows, frames: list[np.ndarray], opts: DecodeOptions | None = None):
    backend = OnnxRuntimeBackend(constant_model(tmp_path / "m.onnx", outputs_with(rows)), threads=1)
    decoder = build_decoder(DECODER, SPEC, ["face"], {o.name: o.shape for o in backend.outputs})
    pre = Preprocessor(SPEC)
    batch = np.zeros(SPEC.shape, np.float32)
    transforms = [pre.run(f, batch[i]) for i, f in enumerate(frames)]
    return decoder.decode(backend.infer({"x": batch}), transforms, opts or DecodeOptions())


def test_box_decoded_and_letterbox_undone(tmp_path: Path) -> None:
    # Anchor 6 = grid 1, row 1, col 2: centre ((2.5/4)*64, (1.5/4)*64) = (40, 24) in input pixels.
    # Offsets (+2, -4), size 16x8 -> [34, 16, 50, 24]. Source 200x100 letterboxed: scale 0.32, pad_y 16.
    dets = run(tmp_path, {0: [(6, 0.9, [2, -4, 16, 8])]}, [np.zeros((100, 200, 3), np.uint8)])
    assert len(dets) == 1 and len(dets[0]) == 1
    d = dets[0][0]
    assert d.label == "face" and d.class_id == 0 and d.score == pytest.approx(0.9, abs=1e-5)
    assert np.allclose(d.box, [106.25, 0.0, 156.25, 25.0], atol=1e-3)


def test_second_grid_anchor_order(tmp_path: Path) -> None:
    # Anchor 16 + 3 = grid 2, cell (row 0, col 1), second anchor: centre (48, 16). Square source, no padding.
    dets = run(tmp_path, {0: [(19, 0.8, [0, 0, 8, 8])]}, [np.zeros((64, 64, 3), np.uint8)])
    assert np.allclose(dets[0][0].box, [44, 12, 52, 20], atol=1e-3)


def test_nms_ties_thresholds_and_padding_rows(tmp_path: Path) -> None:
    rows = {
        0: [(5, 0.9, [0, 0, 10, 10]), (6, 0.8, [-14, 0, 10, 10])],  # same place (anchors 16 px apart): one kept
        1: [(0, 0.7, [0, 0, 6, 6]), (15, 0.7, [0, 0, 6, 6])],  # a score tie, far apart: both kept, stable order
        2: [(3, 0.95, [0, 0, 6, 6])],  # a padding row: never decoded
    }
    frames = [np.zeros((64, 64, 3), np.uint8)] * 2
    dets = run(tmp_path, rows, frames, DecodeOptions(score_threshold=0.5, iou_threshold=0.3))
    assert len(dets) == 2
    assert [round(d.score, 2) for d in dets[0]] == [0.9]
    assert [d.score for d in dets[1]] == pytest.approx([0.7, 0.7], abs=1e-5)
    assert dets[1][0].box[0] < dets[1][1].box[0]
    high = run(tmp_path, rows, frames, DecodeOptions(score_threshold=0.85))
    assert [len(r) for r in high] == [1, 0]


def test_empty_output_and_label_filter(tmp_path: Path) -> None:
    frames = [np.zeros((64, 64, 3), np.uint8)]
    assert run(tmp_path, {}, frames) == [[]]
    filtered = run(tmp_path, {0: [(6, 0.9, [0, 0, 8, 8])]}, frames, DecodeOptions(labels=frozenset({"person"})))
    assert filtered == [[]]


def test_decoder_refuses_mismatched_outputs(tmp_path: Path) -> None:
    backend = OnnxRuntimeBackend(constant_model(tmp_path / "m.onnx", outputs_with({})), threads=1)
    shapes = {o.name: o.shape for o in backend.outputs}
    wrong = DecoderSpec(
        type="ssd_anchors", params={"grids": [{"cells": 4, "anchors": 2}], "scores": ["s1"], "boxes": ["b1"]}
    )
    with pytest.raises(DecoderError, match="grids give 32 anchors, the outputs have 16 scores"):
        build_decoder(wrong, SPEC, ["face"], shapes)
    with pytest.raises(DecoderError, match="no output 'nope'"):
        build_decoder(
            DecoderSpec(type="ssd_anchors", params={**DECODER.params, "scores": ["nope", "s2"]}), SPEC, [], shapes
        )
    with pytest.raises(DecoderError, match="decoder 'yolov99' is not available"):
        build_decoder(DecoderSpec(type="yolov99"), SPEC, [], shapes)


def iou(a: list[float], b: tuple[float, ...] | list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.parametrize("photo", ["astronaut.png", "grace_hopper.jpg", "camera.png"])
def test_blazeface_finds_the_face_in_each_photograph(demo: DemoAssets, photo: str) -> None:
    pkg = demo.packages["blazeface-back"]
    m = pkg.manifest
    backend = OnnxRuntimeBackend(pkg.model_path, threads=1)
    decoder = build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in backend.outputs})
    image = cv2.imread(str(demo.root / "raw" / photo))
    assert image is not None
    batch = np.zeros(m.input.shape, np.float32)
    t = Preprocessor(m.input).run(image, batch[0])
    dets = decoder.decode(backend.infer({m.input.name: batch}), [t], DecodeOptions(score_threshold=0.7))[0]
    assert len(dets) == 1, dets
    assert iou(FACES[photo][0], dets[0].box) >= 0.7
