"""Detections drawn onto a frame, for snapshots and the demo's watcher; a snapshot's JPEG fitted to a byte cap."""

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
