"""``yolox``: YOLOX heads exported without their decode (Megvii's ``decode_in_inference=False``).

One output [B, A, 5 + C]: per grid cell of each stride (row-major, stride by stride), raw offsets
(dx, dy, log w, log h), then objectness and C class scores (sigmoid already applied in the graph).
Box centre = ((i + dx) s, (j + dy) s), size = exp(log w) s, exp(log h) s, in input pixels; score =
objectness x best class score, as YOLOX's own ``demo_postprocess`` and ``multiclass_nms``. YOLOX
itself feeds raw 0-255 BGR pixels, letterboxed top-left onto 114 grey.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.errors import DecoderError
from edged.models.package import DecoderSpec, InputSpec

from .base import output_name
from .yolo import YoloV5


def grid_cells(height: int, width: int, strides: Sequence[int]) -> int:
    return sum((height // s) * (width // s) for s in strides)


class YoloX(YoloV5):
    """params: output (name), strides (default [8, 16, 32]; [8, 16, 32, 64] for P6 models). Decoded as
    YOLOv5 (objectness x best class score, NMS) once its grid offsets are turned into boxes."""

    def __init__(self, spec: DecoderSpec, input_spec: InputSpec, labels: Sequence[str]) -> None:
        self.params = spec.params
        self.labels = list(labels)
        self.strides = [int(s) for s in self.params.get("strides", [8, 16, 32])]
        grids, steps = [], []
        for s in self.strides:
            h, w = input_spec.height // s, input_spec.width // s
            ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
            grids.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
            steps.append(np.full((h * w, 1), s, np.float32))
        self.grid = np.concatenate(grids) if grids else np.empty((0, 2), np.float32)
        self.step = np.concatenate(steps) if steps else np.empty((0, 1), np.float32)
        self.size = (input_spec.height, input_spec.width)
        self.name = ""

    def check(self, output_shapes: dict[str, tuple[int, ...]]) -> None:
        self.name = output_name(self.params, "output", None, output_shapes)
        shape = output_shapes[self.name]
        if len(shape) != 3 or shape[2] < 6:
            raise DecoderError(f"yolox: output {self.name!r} is {list(shape)}, not [B, A, 5+C]")
        if shape[1] != len(self.grid):
            h, w = self.size
            raise DecoderError(
                f"yolox: output {self.name!r} has {shape[1]} cells; a {w}x{h} input at strides {self.strides} "
                f"has {len(self.grid)}"
            )
        if self.labels and shape[2] - 5 != len(self.labels):
            raise DecoderError(f"yolox: {shape[2] - 5} classes in the output, {len(self.labels)} labels")

    def xywh(self, pred: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """YOLOX gives grid offsets and log sizes per cell: boxes (cx, cy, w, h) in input pixels."""
        p, step = pred[idx, :4].astype(np.float32), self.step[idx]
        return np.concatenate([(p[:, :2] + self.grid[idx]) * step, np.exp(np.clip(p[:, 2:4], -80, 80)) * step], 1)
