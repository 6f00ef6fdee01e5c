"""Boxes of the primary's detections → crops for a stage, and a crop → one row of the stage's input.

Which boxes: the stage's ``on_labels``, at least ``min_box_px`` on both sides, the largest first, at most
``max_crops_per_frame``. A crop is the box grown by ``pad`` of its side on each side, clipped to the frame,
in whole source pixels. Its pixels are copied out of the frame when the result is decoded (the camera keeps
its taken frames only a few batches), and preprocessed into the stage's row by the stage's own input spec
on the stage's thread: the primary's `Preprocessor` (letterbox or stretch, colour, scale, layout), so a text
recogniser with ``letterbox: topleft`` gets its crop with the aspect kept, scaled to the input's height, at
the left, the width padded.

A crop's `Transform` maps the stage's model pixels back to the crop; composed with the crop's place in the
frame (`frame_transform`) it maps a detector stage's boxes to the frame's source pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edged.models.package import InputSpec

from ..capture.preprocess import Preprocessor, Transform
from ..config.stages import StageConfig
from ..decoders import Detection

Rect = tuple[int, int, int, int]  # x1, y1, x2, y2 in whole source pixels, x2/y2 exclusive


def crop_rect(box: tuple[float, float, float, float], pad: float, width: int, height: int) -> Rect | None:
    """The box grown by `pad` x its side on each side, to whole pixels (outward), clipped to the frame;
    None when nothing of it is inside the frame."""
    x1, y1, x2, y2 = box
    gx, gy = (x2 - x1) * pad, (y2 - y1) * pad
    rx1 = max(0, math.floor(x1 - gx))
    ry1 = max(0, math.floor(y1 - gy))
    rx2 = min(width, math.ceil(x2 + gx))
    ry2 = min(height, math.ceil(y2 + gy))
    if rx2 <= rx1 or ry2 <= ry1:
        return None
    return rx1, ry1, rx2, ry2


def select(detections: Sequence[Detection], cfg: StageConfig, width: int, height: int) -> list[tuple[int, Rect]]:
    """(detection index, crop rect) of the detections `cfg` takes, largest box first, at most
    max_crops_per_frame."""
    wanted = set(cfg.on_labels)
    found: list[tuple[float, int, Rect]] = []
    for i, d in enumerate(detections):
        if d.label not in wanted:
            continue
        x1, y1, x2, y2 = d.box
        if x2 - x1 < cfg.min_box_px or y2 - y1 < cfg.min_box_px:
            continue
        rect = crop_rect(d.box, cfg.pad, width, height)
        if rect is not None:
            found.append(((x2 - x1) * (y2 - y1), i, rect))
    found.sort(key=lambda t: (-t[0], t[1]))
    return [(i, rect) for _, i, rect in found[: cfg.max_crops_per_frame]]


def cut(frame: np.ndarray, rect: Rect) -> np.ndarray:
    """The crop's pixels, copied (the frame is the camera's and goes back to it)."""
    x1, y1, x2, y2 = rect
    return np.ascontiguousarray(frame[y1:y2, x1:x2])


def frame_transform(crop: Transform, rect: Rect, width: int, height: int) -> Transform:
    """`crop` (model pixels → crop pixels) followed by the crop's offset in the frame: model pixels → the
    frame's source pixels, clipped to the frame. src = (x - pad) / scale + x1 = (x - (pad - scale x1)) / scale."""
    x1, y1 = rect[0], rect[1]
    return Transform(
        crop.scale_x, crop.scale_y, crop.pad_x - crop.scale_x * x1, crop.pad_y - crop.scale_y * y1, width, height
    )


@dataclass(frozen=True)
class Crop:
    """One crop waiting for its stage: where it came from and its pixels."""

    rect: Rect
    pixels: np.ndarray  # BGR, copied out of the frame
    frame_size: tuple[int, int]  # the frame's (width, height), for a detector stage's boxes


class CropInput:
    """Crops into the rows of a stage's input buffer, by the stage's input spec (one per stage thread: the
    preprocessor's scratch buffers are its own)."""

    def __init__(self, spec: InputSpec) -> None:
        self.spec = spec
        self._pre = Preprocessor(spec)
        self.dtype = self._pre.dtype

    def run(self, crop: np.ndarray, out: np.ndarray) -> Transform:
        """Preprocess `crop` into the row `out`; the transform maps model pixels back to the crop."""
        return self._pre.run(crop, out)
