"""Detections drawn onto a frame, for snapshots and the demo's watcher."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import cv2
import numpy as np


def draw(frame: np.ndarray, detections: Iterable[dict[str, Any]]) -> np.ndarray:
    """A copy of `frame` with each detection's box and `label score` (detections as in edged.result/1)."""
    out: np.ndarray = frame.copy()
    for d in detections:
        x1, y1, x2, y2 = (round(v) for v in d["box"])
        cv2.rectangle(out, (x1, y1), (x2, y2), (60, 255, 60), 2)
        cv2.putText(out, f"{d['label']} {d['score']:.2f}", (x1, max(14, y1 - 6)), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                    (60, 255, 60), 1, cv2.LINE_AA)  # fmt: skip
    return out
