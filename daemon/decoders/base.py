"""What every decoder shares: the Detection, the options, the interface, NMS and the registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import cv2
import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform


@dataclass(frozen=True)
class Detection:
    label: str
    class_id: int
    score: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels
    track_id: int | None = None  # the camera's tracker (daemon/scene/scenes.py), once the track is confirmed
    zones: tuple[str, ...] = ()  # the camera's zones the box's anchor point is in

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "label": self.label,
            "class_id": self.class_id,
            "score": round(self.score, 4),
            "box": [round(v, 1) for v in self.box],
        }
        if self.track_id is not None:
            doc["track_id"] = self.track_id
        if self.zones:
            doc["zones"] = list(self.zones)
        return doc


@dataclass(frozen=True)
class DecodeOptions:
    score_threshold: float = 0.5
    iou_threshold: float = 0.3
    max_detections: int = 100
    labels: frozenset[str] = frozenset()  # empty: keep every label


class Decoder(Protocol):
    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        """Raise DecoderError when the model's outputs do not fit this decoder."""

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        """Detections per real row (len(transforms) rows; padding rows are not decoded)."""


DecoderFactory = Callable[[DecoderSpec, InputSpec, Sequence[str]], Decoder]


def nms(boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, opts: DecodeOptions) -> np.ndarray:
    """Indices kept by per-class NMS (OpenCV), best first, at most opts.max_detections.

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


def detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray,
    labels: Sequence[str],
    opts: DecodeOptions,
    transform: Transform,
) -> list[Detection]:
    """Model-pixel boxes -> Detections in source pixels, the label filter applied."""
    if len(boxes) == 0:
        return []
    src = transform.to_source(np.asarray(boxes, np.float32).reshape(-1, 4))
    out = []
    for b, s, c in zip(src.tolist(), scores.tolist(), class_ids.tolist(), strict=True):
        label = labels[c] if 0 <= c < len(labels) else str(c)
        if opts.labels and label not in opts.labels:
            continue
        out.append(Detection(label, int(c), float(s), (b[0], b[1], b[2], b[3])))
    return out


def xywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    out = np.empty_like(b, dtype=np.float32)
    half = b[:, 2:4] / 2
    out[:, :2] = b[:, :2] - half
    out[:, 2:] = b[:, :2] + half
    return out


def output_name(params: dict[str, Any], key: str, default: str | None, shapes: dict[str, tuple[int, ...]]) -> str:
    """The output a decoder reads: params[key], else `default`, else the model's only output."""
    name = params.get(key, default)
    if name is None:
        if len(shapes) != 1:
            raise DecoderError(f"name the output in decoder.params.{key} (the model has {sorted(shapes)})")
        return next(iter(shapes))
    if name not in shapes:
        raise DecoderError(f"the model has no output {name!r} (it has {sorted(shapes)})")
    return str(name)


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(x, -80, 80)))
    return out


def objectness_candidates(pred: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows [x, y, w, h, objectness, class scores...] (YOLOv5, YOLOX): the rows whose objectness x best
    class score passes `threshold`, as (row indices, classes, scores)."""
    cand = np.flatnonzero(pred[:, 4] > threshold)  # obj x cls <= obj: a cheap first cut
    conf = pred[cand, 5:] * pred[cand, 4:5]
    classes = conf.argmax(axis=1)
    scores = conf[np.arange(len(cand)), classes]
    keep = scores > threshold
    return cand[keep], classes[keep], scores[keep]
