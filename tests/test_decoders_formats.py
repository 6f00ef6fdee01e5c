"""The formats users bring (yolov8, yolov5, efficient_nms, picodet, classify), each through real
ONNX Runtime on a model whose outputs are known exactly; picodet also on the real PicoDet model
against an independent reference decode on a rendered document page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.decoders import DecodeOptions, Detection, build_decoder
from edged.errors import DecoderError
from edged.models.demo import DemoAssets
from edged.models.demo.documents import render_page
from edged.models.package import DecoderSpec, InputSpec

from .test_decoders import constant_model

YOLO_SPEC = InputSpec(name="x", shape=[2, 3, 64, 64], layout="NCHW", scale=1 / 255, pad_value=114)
WIDE = np.zeros((64, 128, 3), np.uint8)  # letterboxed into 64x64: scale 0.5, 16 rows of padding above


def decode(
    tmp_path: Path,
    spec: InputSpec,
    decoder: dict[str, Any],
    outputs: dict[str, np.ndarray],
    labels: list[str],
    frames: list[np.ndarray],
    opts: DecodeOptions | None = None,
) -> list[list[Detection]]:
    backend = OnnxRuntimeBackend(constant_model(tmp_path / "m.onnx", outputs, spec), threads=1)
    dec = build_decoder(DecoderSpec.model_validate(decoder), spec, labels, {o.name: o.shape for o in backend.outputs})
    pre = Preprocessor(spec)
    batch = np.zeros(spec.shape, np.float32)
    transforms = [pre.run(f, batch[i]) for i, f in enumerate(frames)]
    return dec.decode(backend.infer({"x": batch}), transforms, opts or DecodeOptions(0.5, 0.45))


def summary(dets: list[Detection]) -> list[tuple[str, float, list[float]]]:
    return [(d.label, round(d.score, 4), [round(v, 2) for v in d.box]) for d in dets]


def test_yolov8(tmp_path: Path) -> None:
    out = np.zeros((2, 7, 10), np.float32)  # [B, 4 + 3 classes, 10 anchors]
    out[0, :, 2] = [32, 20, 20, 10, 0.1, 0.9, 0.2]  # -> class b at 0.9
    out[0, :, 5] = [33, 20, 20, 10, 0.0, 0.8, 0.0]  # same place, same class, lower: suppressed
    out[0, :, 7] = [32, 20, 20, 10, 0.0, 0.0, 0.85]  # same place, another class: kept
    out[0, :, 8] = [10, 40, 8, 8, 0.9, 0.0, 0.0]  # a tie at 0.9 elsewhere: kept
    out[0, :, 9] = [50, 50, 8, 8, 0.0, 0.4, 0.0]  # below the threshold
    dets = decode(tmp_path, YOLO_SPEC, {"type": "yolov8"}, {"output0": out}, ["a", "b", "c"], [WIDE, WIDE])
    # input box [22, 15, 42, 25] -> source x / 0.5, (y - 16) / 0.5, clipped at 0
    assert sorted(summary(dets[0])) == sorted(
        [
            ("b", 0.9, [44.0, 0.0, 84.0, 18.0]),
            ("a", 0.9, [12.0, 40.0, 28.0, 56.0]),
            ("c", 0.85, [44.0, 0.0, 84.0, 18.0]),
        ]
    )
    assert [d.score for d in dets[0]] == sorted((d.score for d in dets[0]), reverse=True)
    assert dets[1] == []  # an all-zero row decodes to nothing
    transposed = decode(
        tmp_path,
        YOLO_SPEC,
        {"type": "yolov8", "params": {"transposed": True}},
        {"output0": out.transpose(0, 2, 1).copy()},
        ["a", "b", "c"],
        [WIDE],
    )
    assert sorted(summary(transposed[0])) == sorted(summary(dets[0]))


def test_yolov5(tmp_path: Path) -> None:
    out = np.zeros((2, 6, 7), np.float32)  # [B, 6 anchors, 5 + 2 classes]
    out[0, 0] = [32, 32, 16, 16, 0.9, 0.2, 0.8]  # 0.72, class 1
    out[0, 1] = [32, 32, 16, 16, 0.3, 1.0, 0.0]  # objectness too low
    out[0, 2] = [10, 20, 8, 8, 0.95, 0.9, 0.1]  # 0.855, class 0
    out[0, 3] = [40, 40, 8, 8, 0.9, 0.5, 0.5]  # 0.45: below 0.5 after multiplying
    out[1, 0] = [32, 32, 64, 64, 0.99, 0.0, 0.99]
    frames = [np.zeros((64, 64, 3), np.uint8), WIDE]
    dets = decode(tmp_path, YOLO_SPEC, {"type": "yolov5"}, {"out": out}, ["cat", "dog"], frames)
    assert summary(dets[0]) == [("cat", 0.855, [6.0, 16.0, 14.0, 24.0]), ("dog", 0.72, [24.0, 24.0, 40.0, 40.0])]
    assert summary(dets[1]) == [("dog", 0.9801, [0.0, 0.0, 128.0, 64.0])]


def test_efficient_nms_tensorrt_outputs(tmp_path: Path) -> None:
    k = 5
    num = np.array([[2], [0]], np.int32)
    boxes = np.zeros((2, k, 4), np.float32)
    scores = np.zeros((2, k), np.float32)
    classes = np.zeros((2, k), np.int32)
    boxes[0, 0], scores[0, 0], classes[0, 0] = [22, 15, 42, 25], 0.8, 2
    boxes[0, 1], scores[0, 1], classes[0, 1] = [0, 16, 10, 26], 0.6, 0
    boxes[0, 2:], scores[0, 2:] = [1, 17, 5, 20], 0.99  # past num_dets: must be ignored
    boxes[1, :], scores[1, :] = [1, 17, 5, 20], 0.99  # num_dets 0: nothing
    outs = {"num_dets": num, "det_boxes": boxes, "det_scores": scores, "det_classes": classes}
    dets = decode(tmp_path, YOLO_SPEC, {"type": "efficient_nms"}, outs, ["a", "b", "c"], [WIDE, WIDE])
    assert summary(dets[0]) == [("c", 0.8, [44.0, 0.0, 84.0, 18.0]), ("a", 0.6, [0.0, 0.0, 20.0, 20.0])]
    assert dets[1] == []
    high = decode(
        tmp_path,
        YOLO_SPEC,
        {"type": "efficient_nms"},
        outs,
        ["a", "b", "c"],
        [WIDE],
        DecodeOptions(score_threshold=0.7),
    )
    assert [d.label for d in high[0]] == ["c"]


def test_efficient_nms_ultralytics_single_output(tmp_path: Path) -> None:
    out = np.zeros((2, 4, 6), np.float32)  # [B, K, x1 y1 x2 y2 score class]
    out[0, 0] = [22, 15, 42, 25, 0.7, 1]
    out[0, 1] = [22, 15, 42, 25, 0.7, 0]  # a score tie: both kept, no NMS on our side
    dets = decode(tmp_path, YOLO_SPEC, {"type": "efficient_nms"}, {"output0": out}, ["a", "b"], [WIDE])
    assert sorted(summary(dets[0])) == [("a", 0.7, [44.0, 0.0, 84.0, 18.0]), ("b", 0.7, [44.0, 0.0, 84.0, 18.0])]


def test_classify(tmp_path: Path) -> None:
    logits = np.array([[0.0, 2.0, 1.0, -1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    spec = InputSpec(name="x", shape=[2, 3, 8, 8], layout="NCHW", resize="stretch")
    frames = [np.zeros((20, 30, 3), np.uint8)] * 2
    dets = decode(
        tmp_path,
        spec,
        {"type": "classify", "params": {"top_k": 2}},
        {"logits": logits},
        ["w", "x", "y", "z"],
        frames,
        DecodeOptions(score_threshold=0.2),
    )
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert summary(dets[0]) == [
        ("x", round(float(p[1]), 4), [0, 0, 30, 20]),
        ("y", round(float(p[2]), 4), [0, 0, 30, 20]),
    ]
    assert [d.label for d in dets[1]] == ["w"]
    sig = decode(
        tmp_path,
        spec,
        {"type": "classify", "params": {"activation": "sigmoid"}},
        {"logits": logits},
        ["w", "x", "y", "z"],
        frames[:1],
        DecodeOptions(score_threshold=0.7),
    )
    assert [d.label for d in sig[0]] == ["x", "y"]


def test_picodet_distributions(tmp_path: Path) -> None:
    spec = InputSpec(name="x", shape=[2, 3, 32, 32], layout="NCHW", resize="stretch")
    s8 = np.zeros((2, 16, 2), np.float32)  # stride 8: 4x4 cells, 2 classes
    s16 = np.zeros((2, 4, 2), np.float32)  # stride 16: 2x2 cells
    d8 = np.zeros((2, 16, 16), np.float32)  # reg_max 3: 4 sides x 4 bins
    d16 = np.zeros((2, 4, 16), np.float32)
    s8[0, 5] = [0.6, 0.9]  # cell (1, 1), centre (12, 12): two classes at once
    d8[0, 5] = np.tile([0, 20, 0, 0], 4)  # every side at bin 1 -> 8 px
    s16[0, 3, 0] = 0.7  # cell (1, 1), centre (24, 24)
    d16[0, 3] = np.concatenate([[0, 20, 0, 0], [0, 20, 0, 0], [20, 0, 0, 0], [20, 0, 0, 0]])  # l, t 16; r, b 0
    outs = {"s8": s8, "s16": s16, "d8": d8, "d16": d16}
    frames = [np.zeros((64, 64, 3), np.uint8), np.zeros((64, 64, 3), np.uint8)]
    dec = {"type": "picodet", "params": {"strides": [8, 16], "reg_max": 3}}
    dets = decode(tmp_path, spec, dec, outs, ["text", "title"], frames)
    assert sorted(summary(dets[0])) == sorted(
        [  # source is 2x the input
            ("title", 0.9, [8.0, 8.0, 40.0, 40.0]),
            ("text", 0.7, [16.0, 16.0, 48.0, 48.0]),
            ("text", 0.6, [8.0, 8.0, 40.0, 40.0]),
        ]
    )
    assert dets[1] == []
    with pytest.raises(DecoderError, match="reg_max 7 needs 32"):
        decode(tmp_path, spec, {"type": "picodet", "params": {"strides": [8, 16]}}, outs, ["a", "b"], frames)


def reference_picodet(
    outputs: list[np.ndarray],
    scale: tuple[float, float],
    thr: float,
    iou_thr: float,
    strides: list[int],
    input_hw: tuple[int, int],
) -> list[tuple[int, float, list[float]]]:
    """A plain re-implementation of rapid-layout's PicoDet post-processing (loops, its own hard NMS)."""
    n = len(outputs) // 2
    boxes_all, scores_all = [], []
    for stride, score, dist in zip(strides, outputs[:n], outputs[n:], strict=True):
        score, dist = score[0], dist[0]
        fh, fw = -(-input_hw[0] // stride), -(-input_hw[1] // stride)
        reg = dist.shape[1] // 4
        for idx in range(fh * fw):
            cy, cx = (idx // fw + 0.5) * stride, (idx % fw + 0.5) * stride
            side = []
            for k in range(4):
                logits = dist[idx, k * reg : (k + 1) * reg].astype(np.float64)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                side.append(float((p * np.arange(reg)).sum()) * stride)
            boxes_all.append([cx - side[0], cy - side[1], cx + side[2], cy + side[3]])
            scores_all.append(score[idx])
    boxes, scores = np.array(boxes_all), np.array(scores_all)
    picked: list[tuple[int, float, list[float]]] = []
    for c in range(scores.shape[1]):
        cand = [i for i in np.argsort(-scores[:, c], kind="stable") if scores[i, c] > thr]
        while cand:
            best = cand.pop(0)
            picked.append((c, float(scores[best, c]), list(boxes[best])))
            b = boxes[best]
            rest = []
            for i in cand:
                o = boxes[i]
                iw = max(0.0, min(b[2], o[2]) - max(b[0], o[0]))
                ih = max(0.0, min(b[3], o[3]) - max(b[1], o[1]))
                inter = iw * ih
                union = (b[2] - b[0]) * (b[3] - b[1]) + (o[2] - o[0]) * (o[3] - o[1]) - inter
                if inter / union <= iou_thr:
                    rest.append(i)
            cand = rest
    sx, sy = scale
    return [(c, s, [b[0] / sx, b[1] / sy, b[2] / sx, b[3] / sy]) for c, s, b in picked]


def test_picodet_real_model_matches_reference_on_a_rendered_page(demo: DemoAssets) -> None:
    pkg = demo.packages["picodet-layout"]
    m = pkg.manifest
    photos = {
        n: cv2.imread(str(demo.root / "raw" / n))
        for n in ("astronaut.png", "coffee.png", "camera.png", "grace_hopper.jpg")
    }
    page, regions = render_page(photos, 0)  # type: ignore[arg-type]
    backend = OnnxRuntimeBackend(pkg.model_path, threads=2)
    decoder = build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in backend.outputs})
    batch = np.zeros(m.input.shape, np.float32)
    t = Preprocessor(m.input).run(page, batch[0])
    outputs = backend.infer({m.input.name: batch})
    ours = decoder.decode(outputs, [t], DecodeOptions(score_threshold=0.5, iou_threshold=0.5))[0]
    ref = reference_picodet(
        [outputs[o.name][:1] for o in backend.outputs],
        (t.scale_x, t.scale_y),
        0.5,
        0.5,
        [8, 16, 32, 64],
        (m.input.height, m.input.width),
    )
    assert len(ours) == len(ref) >= 6
    for d in ours:
        match = [r for r in ref if r[0] == d.class_id and abs(r[1] - d.score) < 1e-5]
        assert match, f"{d} has no counterpart in the reference"
        assert np.allclose(d.box, np.clip(match[0][2], 0, [816, 1056, 816, 1056]), atol=0.05)
    # and the model reads the page as drawn: title, text, figure and table where they were put
    found = {d.label for d in ours}
    assert {"title", "text", "figure", "table"} <= found
    for region in regions:
        if region["label"] in ("title", "figure", "table"):
            best = max(iou(region["box"], list(d.box)) for d in ours if d.label == region["label"])
            assert best >= 0.5, region


def iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)
