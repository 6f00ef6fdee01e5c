"""Raw output tensors -> detections in source-image pixels.

A decoder is built from the model package's ``decoder`` section and the input spec, and turns
one batch of outputs into a list of detections per real row (padding rows are never decoded).
Everything is vectorised with NumPy; NMS is OpenCV's (``cv2.dnn.NMSBoxesBatched``, per class).

Decoders here: ``ssd_anchors`` (BlazeFace and other MediaPipe-style SSD heads). The registry
``DECODERS`` is where the formats users bring (yolov8, yolov5, efficient_nms, picodet, classify)
are added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import cv2
import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from .preprocess import Transform


@dataclass(frozen=True)
class Detection:
    label: str
    class_id: int
    score: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "class_id": self.class_id,
            "score": round(self.score, 4),
            "box": [round(v, 1) for v in self.box],
        }


@dataclass(frozen=True)
class DecodeOptions:
    score_threshold: float = 0.5
    iou_threshold: float = 0.3
    max_detections: int = 100
    labels: frozenset[str] = frozenset()  # empty: keep every label


class Decoder(Protocol):
    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None: ...

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]: ...


def nms(boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, opts: DecodeOptions) -> np.ndarray:
    """Indices kept by per-class NMS, best first, at most opts.max_detections.

    boxes: [N, 4] x1, y1, x2, y2 (any pixel space); scores: [N]; class_ids: [N].
    """
    if len(boxes) == 0:
        return np.empty(0, np.int64)
    xywh = np.empty_like(boxes, dtype=np.float32)
    xywh[:, :2] = boxes[:, :2]
    xywh[:, 2:] = boxes[:, 2:] - boxes[:, :2]
    kept = cv2.dnn.NMSBoxesBatched(
        xywh.tolist(), scores.tolist(), class_ids.astype(int).tolist(), opts.score_threshold, opts.iou_threshold
    )
    keep = np.asarray(kept, np.int64).reshape(-1)
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    return keep[: opts.max_detections]


def _detections(
    boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, labels: Sequence[str], opts: DecodeOptions
) -> list[Detection]:
    out = []
    for b, s, c in zip(boxes.tolist(), scores.tolist(), class_ids.tolist(), strict=True):
        label = labels[c] if 0 <= c < len(labels) else str(c)
        if opts.labels and label not in opts.labels:
            continue
        out.append(Detection(label, int(c), float(s), (b[0], b[1], b[2], b[3])))
    return out


class SsdAnchors:
    """MediaPipe-style SSD head: per-anchor score logits and [dx, dy, w, h, keypoints...] offsets.

    Anchors are cell centres of each grid, `anchors` per cell, in the order the model emits them
    (grid by grid, row-major, anchors innermost). box centre = anchor + (dx, dy) / input size;
    size = (w, h) / input size (normalised to the input); score = sigmoid(logit).
    """

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        p = spec.params
        try:
            grids = [(int(g["cells"]), int(g["anchors"])) for g in p["grids"]]
            self.score_names = [str(n) for n in p["scores"]]
            self.box_names = [str(n) for n in p["boxes"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise DecoderError(f"ssd_anchors needs params grids/scores/boxes: {exc}") from exc
        if len(self.score_names) != len(self.box_names):
            raise DecoderError("ssd_anchors: scores and boxes must name the same number of outputs")
        centres = []
        for cells, per_cell in grids:
            ys, xs = np.mgrid[0:cells, 0:cells].astype(np.float32)
            c = np.stack([(xs + 0.5) / cells, (ys + 0.5) / cells], axis=-1).reshape(-1, 1, 2)
            centres.append(np.repeat(c, per_cell, axis=1).reshape(-1, 2))
        size = np.array([input_spec.width, input_spec.height], np.float32)
        self.anchors_px = np.concatenate(centres) * size  # anchor centres in input pixels
        self.labels = list(labels) or ["object"]

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        total_scores = total_boxes = 0
        for name in self.score_names + self.box_names:
            if name not in output_shapes:
                raise DecoderError(f"ssd_anchors: the model has no output {name!r} (it has {sorted(output_shapes)})")
        for name in self.score_names:
            total_scores += output_shapes[name][1]
        for name in self.box_names:
            total_boxes += output_shapes[name][1]
            if output_shapes[name][2] < 4:
                raise DecoderError(f"ssd_anchors: output {name!r} needs at least 4 values per anchor")
        n = len(self.anchors_px)
        if total_scores != n or total_boxes != n:
            raise DecoderError(
                f"ssd_anchors: grids give {n} anchors, the outputs have {total_scores} scores / {total_boxes} boxes"
            )

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        logits = np.concatenate([outputs[n][..., 0] for n in self.score_names], axis=1)
        raw = np.concatenate([outputs[n][..., :4] for n in self.box_names], axis=1)
        # sigmoid(x) > t  <=>  x > logit(t): threshold on logits, exponentiate only survivors.
        t = min(max(opts.score_threshold, 1e-6), 1 - 1e-6)
        cut = np.log(t / (1 - t))
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            idx = np.flatnonzero(logits[row] > cut)
            if idx.size == 0:
                results.append([])
                continue
            scores = 1.0 / (1.0 + np.exp(-np.clip(logits[row, idx], -80, 80)))
            r = raw[row, idx]
            centre = self.anchors_px[idx] + r[:, :2]
            half = np.abs(r[:, 2:4]) / 2
            boxes = np.concatenate([centre - half, centre + half], axis=1)
            classes = np.zeros(idx.size, np.int64)
            keep = nms(boxes, scores, classes, opts)
            results.append(_detections(tf.to_source(boxes[keep]), scores[keep], classes[keep], self.labels, opts))
        return results


DecoderFactory = Callable[[DecoderSpec, InputSpec, Sequence[str]], Decoder]
DECODERS: dict[str, DecoderFactory] = {"ssd_anchors": SsdAnchors}


def build_decoder(
    spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str], output_shapes: dict[str, tuple[int, ...]]
) -> Decoder:
    factory = DECODERS.get(spec.type)
    if factory is None:
        raise DecoderError(
            f"decoder {spec.type!r} is not available in this edged (available: {', '.join(sorted(DECODERS))})"
        )
    decoder = factory(spec, input_spec, labels)
    decoder.check(output_shapes)
    return decoder
