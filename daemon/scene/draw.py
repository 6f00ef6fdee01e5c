"""Detections drawn onto a frame, for snapshots and the demo's watcher; a camera's whole scene (boxes, labels,
track ids, zones, masks, lines) for the live view; a snapshot's JPEG fitted to a byte cap."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from edged.errors import Code, CommandError


def draw(frame: np.ndarray, detections: Iterable[dict[str, Any]]) -> np.ndarray:
    """A copy of `frame` with each detection's box and `label score` (detections as in edged.result/2)."""
    out: np.ndarray = frame.copy()
    for d in detections:
        x1, y1, x2, y2 = (round(v) for v in d["box"])
        cv2.rectangle(out, (x1, y1), (x2, y2), (60, 255, 60), 2)
        cv2.putText(out, f"{d['label']} {d['score']:.2f}", (x1, max(14, y1 - 6)), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                    (60, 255, 60), 1, cv2.LINE_AA)  # fmt: skip
    return out


# The live view's colours (BGR): boxes as `draw`'s, zones blue-violet, masks red, lines yellow
BOX_BGR = (60, 255, 60)
ZONE_BGR = (255, 60, 160)
MASK_BGR = (40, 40, 230)
LINE_BGR = (0, 220, 255)

Point = tuple[float, float]


@dataclass(frozen=True)
class Shape:
    """A named polygon (zone, mask) or polyline (line) in source pixels, or 0-1 fractions when `normalized`."""

    name: str
    points: Sequence[Point]
    normalized: bool = False

    def pixels(self, width: int, height: int, scale: float) -> np.ndarray:
        """Its corners on a `scale`d frame of a `width` x `height` source, as cv2 wants them."""
        fx, fy = (width, height) if self.normalized else (1.0, 1.0)
        return np.array([[round(x * fx * scale), round(y * fy * scale)] for x, y in self.points], dtype=np.int32)


def draw_scene(
    frame: np.ndarray,
    detections: Iterable[dict[str, Any]],
    zones: Sequence[Shape] = (),
    masks: Sequence[Shape] = (),
    lines: Sequence[Shape] = (),
    max_width: int = 0,
) -> np.ndarray:
    """`frame` scaled down to `max_width` (0: as it is; never up), then masks (shaded), zones (outlined),
    lines and each detection's box with ``#track label score`` drawn on it (detections and shapes in source
    pixels, as in edged.result/2). Scaling first keeps the drawing's cost at the view's size."""
    h, w = frame.shape[:2]
    scale = min(1.0, max_width / w) if max_width else 1.0
    out: np.ndarray = (
        cv2.resize(frame, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)
        if scale < 1.0
        else frame.copy()
    )
    if masks:
        shade = out.copy()
        for m in masks:
            cv2.fillPoly(shade, [m.pixels(w, h, scale)], MASK_BGR)
        cv2.addWeighted(shade, 0.35, out, 0.65, 0.0, dst=out)
    for shapes, colour, closed in ((masks, MASK_BGR, True), (zones, ZONE_BGR, True), (lines, LINE_BGR, False)):
        for s in shapes:
            pts = s.pixels(w, h, scale)
            cv2.polylines(out, [pts], closed, colour, 2, cv2.LINE_AA)
            x, y = int(pts[:, 0].min()), int(pts[:, 1].min())
            _text(out, s.name, (x + 4, y + 16), colour)
    for d in detections:
        x1, y1, x2, y2 = (round(v * scale) for v in d["box"])
        cv2.rectangle(out, (x1, y1), (x2, y2), BOX_BGR, 2)
        tid = d.get("track_id")
        _text(out, (f"#{tid} " if tid is not None else "") + f"{d['label']} {d['score']:.2f}", (x1, max(14, y1 - 6)),
              BOX_BGR)  # fmt: skip
    return out


def _text(img: np.ndarray, text: str, at: tuple[int, int], colour: tuple[int, int, int]) -> None:
    # a dark edge first: legible on any background
    cv2.putText(img, text, at, cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 3, cv2.LINE_AA)
    cv2.putText(img, text, at, cv2.FONT_HERSHEY_SIMPLEX, 0.5, colour, 1, cv2.LINE_AA)


def encode_jpeg(img: np.ndarray, quality: int) -> bytes:
    """`img` as a JPEG at `quality` (a failed encoding raises CommandError('failed'))."""
    return _encode(img, quality)


# A snapshot's JPEG: quality lowered in these steps first, then the frame scaled down at the last one.
SNAPSHOT_QUALITIES = (80, 70, 60, 50)
MIN_SNAPSHOT_SIDE = 120  # px: never scaled below this (a frame that still does not fit is refused)


@dataclass(frozen=True)
class Jpeg:
    data: bytes
    quality: int
    scale: float  # of the source frame's width and height (1.0: full size)
    width: int
    height: int


def _encode(img: np.ndarray, quality: int) -> bytes:
    ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise CommandError(Code.FAILED, f"JPEG encoding of a {img.shape[1]}x{img.shape[0]} frame failed")
    return bytes(jpg.tobytes())


def fit_jpeg(img: np.ndarray, cap: int, qualities: Sequence[int] = SNAPSHOT_QUALITIES) -> Jpeg:
    """`img` as a JPEG of at most `cap` bytes: the first of `qualities` that fits at full size, else the last
    quality on a frame scaled down (each step sized from the last one's overshoot, as a JPEG's size goes
    about with its pixel count). CommandError('too_large') when even MIN_SNAPSHOT_SIDE pixels do not fit."""
    if not qualities or cap <= 0:
        raise ValueError("fit_jpeg needs qualities and a positive cap")
    h, w = img.shape[:2]
    for q in qualities:
        data = _encode(img, q)
        if len(data) <= cap:
            return Jpeg(data, q, 1.0, w, h)
    q, scale = qualities[-1], 1.0
    while True:
        scale *= min(0.9, 0.95 * math.sqrt(cap / len(data)))
        sw, sh = round(w * scale), round(h * scale)
        if min(sw, sh) < MIN_SNAPSHOT_SIDE:
            raise CommandError(
                Code.TOO_LARGE,
                f"a {w}x{h} frame does not fit {cap} bytes even at quality {q} and {MIN_SNAPSHOT_SIDE} px",
            )
        data = _encode(cv2.resize(img, (sw, sh), interpolation=cv2.INTER_AREA), q)
        if len(data) <= cap:
            return Jpeg(data, q, round(sw / w, 4), sw, sh)
