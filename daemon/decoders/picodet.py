"""``picodet``: PaddleDetection PicoDet / GFL heads, e.g. the PicoDet layout demo model.

Per stride s, one score map [B, N_s, C] (sigmoid already applied in the graph) and one
distribution map [B, N_s, 4 (reg_max + 1)]: for each side (left, top, right, bottom) a discrete
distribution over 0..reg_max whose expectation, times s, is the distance from the cell centre
((i + 0.5) s, (j + 0.5) s) to that side. Every (cell, class) pair above the score threshold is a
candidate (an area can be "text" and "title" at once), then NMS per class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from ..capture.preprocess import Transform
from .base import DecodeOptions, Detection, detections, nms


class PicoDet:
    """params: strides (default [8, 16, 32, 64]), reg_max (default 7), scores and boxes (output
    names per stride; default: the model's outputs in order, scores first, then boxes)."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        p = spec.params
        self.strides = [int(s) for s in p.get("strides", [8, 16, 32, 64])]
        self.reg_max = int(p.get("reg_max", 7))
        self.score_names: list[str] = [str(n) for n in p.get("scores", [])]
        self.box_names: list[str] = [str(n) for n in p.get("boxes", [])]
        self.labels = list(labels)
        self.centres = []
        for s in self.strides:
            h, w = math.ceil(input_spec.height / s), math.ceil(input_spec.width / s)
            ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
            self.centres.append(np.stack([(xs.ravel() + 0.5) * s, (ys.ravel() + 0.5) * s], axis=1))
        self.bins = np.arange(self.reg_max + 1, dtype=np.float32)

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        n = len(self.strides)
        if not self.score_names and not self.box_names:
            names = list(output_shapes)
            if len(names) != 2 * n:
                raise DecoderError(f"picodet: {n} strides need {2 * n} outputs, the model has {len(names)}")
            self.score_names, self.box_names = names[:n], names[n:]
        if len(self.score_names) != n or len(self.box_names) != n:
            raise DecoderError(f"picodet: name {n} score and {n} box outputs, one per stride")
        for s, sn, bn, centres in zip(self.strides, self.score_names, self.box_names, self.centres, strict=True):
            for name in (sn, bn):
                if name not in output_shapes:
                    raise DecoderError(f"picodet: the model has no output {name!r} (it has {sorted(output_shapes)})")
            ss, bs = output_shapes[sn], output_shapes[bn]
            if ss[1] != len(centres) or bs[1] != len(centres):
                raise DecoderError(
                    f"picodet: stride {s} has {len(centres)} cells; {sn!r} {list(ss)}, {bn!r} {list(bs)}"
                )
            if bs[2] != 4 * (self.reg_max + 1):
                need = 4 * (self.reg_max + 1)
                raise DecoderError(f"picodet: {bn!r} has {bs[2]} values per cell, reg_max {self.reg_max} needs {need}")
            if self.labels and ss[2] != len(self.labels):
                raise DecoderError(f"picodet: {ss[2]} classes in {sn!r}, {len(self.labels)} labels")

    def decode(
        self, outputs: dict[str, np.ndarray], transforms: Sequence[Transform], opts: DecodeOptions
    ) -> list[list[Detection]]:
        results: list[list[Detection]] = []
        for row, tf in enumerate(transforms):
            boxes, scores, classes = [], [], []
            for s, sn, bn, centres in zip(self.strides, self.score_names, self.box_names, self.centres, strict=True):
                sc = outputs[sn][row]
                cells, cls = np.nonzero(sc > opts.score_threshold)
                if cells.size == 0:
                    continue
                dist = outputs[bn][row][cells].reshape(-1, 4, self.reg_max + 1)
                e = np.exp(dist - dist.max(axis=2, keepdims=True))
                d = (e @ self.bins) / e.sum(axis=2) * s  # [n, 4]: left, top, right, bottom
                c = centres[cells]
                boxes.append(np.concatenate([c - d[:, :2], c + d[:, 2:]], axis=1))
                scores.append(sc[cells, cls])
                classes.append(cls)
            if not boxes:
                results.append([])
                continue
            b, sco, cl = np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes)
            keep = nms(b, sco, cl, opts)
            results.append(detections(b[keep], sco[keep], cl[keep], self.labels, opts, tf))
        return results
