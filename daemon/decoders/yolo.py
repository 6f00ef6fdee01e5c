"""The detector formats users bring most: Ultralytics YOLOv8/YOLO11 and YOLOv5 heads, and
end-to-end models with NMS inside (TensorRT's EfficientNMS plugin, Ultralytics ``nms=True``).

Boxes are in input pixels; the letterbox is undone through the frame's transform.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform
from .base import DecodeOptions, Detection, detections, nms, objectness_candidates, output_name, xywh_to_xyxy


class YoloV8:
    """``yolov8``: one output [B, 4 + C, A] (cx, cy, w, h, then C class scores, already sigmoid),
    as Ultralytics exports YOLOv8 / YOLO11; [B, A, 4 + C] is accepted too (``transposed: true``).
    One class per anchor (its best), then NMS per class. params: output (name), transposed."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        self.params = spec.params
        self.labels = list(labels)
        self.transposed = bool(self.params.get("transposed", False))
        self.name = ""

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        self.name = output_name(self.params, "output", None, output_shapes)
        shape = output_shapes[self.name]
        if len(shape) != 3:
            raise DecoderError(f"yolov8: output {self.name!r} is {list(shape)}, not [B, 4+C, A]")
        channels = shape[2] if self.transposed else shape[1]
        if channels < 5:
            raise DecoderError(f"yolov8: output {self.name!r} {list(shape)} has {channels} < 5 values per anchor")
        if self.labels and channels - 4 != len(self.labels):
            raise DecoderError(f"yolov8: {channels - 4} classes in the output, {len(self.labels)} labels")

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        out = outputs[self.name]
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            pred = out[row] if self.transposed else out[row].T  # [A, 4 + C]
            cls_scores = pred[:, 4:]
            classes = cls_scores.argmax(axis=1)
            scores = cls_scores[np.arange(len(pred)), classes]
            idx = np.flatnonzero(scores > opts.score_threshold)
            boxes = xywh_to_xyxy(pred[idx, :4])
            keep = nms(boxes, scores[idx], classes[idx], opts)
            results.append(detections(boxes[keep], scores[idx][keep], classes[idx][keep], self.labels, opts, tf))
        return results


class YoloV5:
    """``yolov5``: one output [B, A, 5 + C] (cx, cy, w, h, objectness, C class scores, sigmoid).
    score = objectness x best class score. params: output (name)."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        self.params = spec.params
        self.labels = list(labels)
        self.name = ""

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        self.name = output_name(self.params, "output", None, output_shapes)
        shape = output_shapes[self.name]
        if len(shape) != 3 or shape[2] < 6:
            raise DecoderError(f"yolov5: output {self.name!r} is {list(shape)}, not [B, A, 5+C]")
        if self.labels and shape[2] - 5 != len(self.labels):
            raise DecoderError(f"yolov5: {shape[2] - 5} classes in the output, {len(self.labels)} labels")

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        out = outputs[self.name]
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            pred = out[row]
            idx, classes, scores = objectness_candidates(pred, opts.score_threshold)
            boxes = xywh_to_xyxy(self.xywh(pred, idx))
            keep = nms(boxes, scores, classes, opts)
            results.append(detections(boxes[keep], scores[keep], classes[keep], self.labels, opts, tf))
        return results

    def xywh(self, pred: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The candidates' boxes (cx, cy, w, h) in input pixels: given as such by YOLOv5."""
        return pred[idx, :4]


class EfficientNms:
    """``efficient_nms``: NMS already done in the model. Either TensorRT EfficientNMS's four outputs
    ``num_dets`` [B, 1], ``det_boxes`` [B, K, 4] (x1, y1, x2, y2), ``det_scores`` [B, K],
    ``det_classes`` [B, K], or Ultralytics' ``nms=True`` single output [B, K, 6] (x1, y1, x2, y2,
    score, class). params: num_dets / boxes / scores / classes (names), or output (the single one)."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        self.params = spec.params
        self.labels = list(labels)
        self.single: str | None = None
        self.names: tuple[str, str, str, str] = ("", "", "", "")

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        p = self.params
        if "output" in p or (len(output_shapes) == 1 and next(iter(output_shapes.values()))[-1] == 6):
            self.single = output_name(p, "output", None, output_shapes)
            shape = output_shapes[self.single]
            if len(shape) != 3 or shape[2] != 6:
                raise DecoderError(f"efficient_nms: output {self.single!r} is {list(shape)}, not [B, K, 6]")
            return
        keys = (("num_dets", "num_dets"), ("boxes", "det_boxes"), ("scores", "det_scores"), ("classes", "det_classes"))
        n, b, s, c = (output_name(p, key, default, output_shapes) for key, default in keys)
        kb, ks, kc = output_shapes[b], output_shapes[s], output_shapes[c]
        if len(kb) != 3 or kb[2] != 4 or len(ks) < 2 or len(kc) < 2 or not kb[1] == ks[1] == kc[1]:
            raise DecoderError(
                f"efficient_nms: want {b!r} [B, K, 4], {s!r} and {c!r} [B, K]; got {list(kb)}, {list(ks)}, {list(kc)}"
            )
        self.names = (n, b, s, c)

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            if self.single is not None:
                dets = outputs[self.single][row]
                boxes, scores, classes = dets[:, :4], dets[:, 4], dets[:, 5].astype(np.int64)
            else:
                n, b, s, c = self.names
                count = int(np.asarray(outputs[n][row]).reshape(-1)[0])
                boxes = outputs[b][row, :count]
                scores = outputs[s][row, :count]
                classes = outputs[c][row, :count].astype(np.int64)
            keep = np.flatnonzero(scores > opts.score_threshold)
            keep = keep[np.argsort(-scores[keep], kind="stable")][: opts.max_detections]
            results.append(detections(boxes[keep], scores[keep], classes[keep], self.labels, opts, tf))
        return results
