"""``ssd_anchors``: MediaPipe-style SSD heads (BlazeFace)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform
from .base import DecodeOptions, Detection, detections, nms, sigmoid


class SsdAnchors:
    """Per-anchor score logits and [dx, dy, w, h, keypoints...] offsets.

    Anchors are cell centres of each grid, `anchors` per cell, in the order the model emits them
    (grid by grid, row-major, anchors innermost). Box centre = anchor + (dx, dy), size (w, h), all in
    input pixels; score = sigmoid(logit). params: grids [{cells, anchors}], scores / boxes (output
    names, one per grid).
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
        for name in self.score_names + self.box_names:
            if name not in output_shapes:
                raise DecoderError(f"ssd_anchors: the model has no output {name!r} (it has {sorted(output_shapes)})")
        total_scores = sum(output_shapes[n][1] for n in self.score_names)
        total_boxes = sum(output_shapes[n][1] for n in self.box_names)
        for name in self.box_names:
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
        # sigmoid(x) > t  <=>  x > logit(t): threshold on logits, exponentiate only the survivors.
        t = min(max(opts.score_threshold, 1e-6), 1 - 1e-6)
        cut = np.log(t / (1 - t))
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            idx = np.flatnonzero(logits[row] > cut)
            scores = sigmoid(logits[row, idx])
            r = raw[row, idx]
            centre = self.anchors_px[idx] + r[:, :2]
            half = np.abs(r[:, 2:4]) / 2
            boxes = np.concatenate([centre - half, centre + half], axis=1)
            classes = np.zeros(idx.size, np.int64)
            keep = nms(boxes, scores, classes, opts)
            results.append(detections(boxes[keep], scores[keep], classes[keep], self.labels, opts, tf))
        return results
