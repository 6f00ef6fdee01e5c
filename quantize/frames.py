"""Calibration and evaluation frames: a folder of images or a video, with ground truth when it has one.

Ground truth is the demo's ``edged.groundtruth/1`` file: next to a video as ``<video>.json``
(frames by index), in a folder as ``groundtruth.json`` (frames by ``file`` name). A frame lists
``regions`` (``{"label", "box": [x1, y1, x2, y2]}`` in source pixels) or, as the demo face video
does, ``faces`` (boxes labelled ``face``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.errors import Code, QuantizeError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
GROUNDTRUTH_SCHEMA = "edged.groundtruth/1"

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Frame:
    name: str  # file name, or the frame index in a video
    image: np.ndarray  # BGR, as a camera thread sees it
    truth: list[tuple[str, Box]] | None  # None: no ground truth for this frame


def read_frames(source: Path, limit: int | None = None, progress: Callable[[str], None] | None = None) -> list[Frame]:
    """Every frame of `source` (or `limit` of them spread evenly over it), with ground truth where known."""
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    if source.is_dir():
        frames = _folder(source, limit)
    elif source.is_file():
        frames = _video(source, limit)
    else:
        raise QuantizeError(f"{source}: no such folder or video", code=Code.FRAMES_INVALID)
    if not frames:
        raise QuantizeError(
            f"{source}: no readable frames (images: {', '.join(IMAGE_SUFFIXES)}; or a video file)",
            code=Code.FRAMES_INVALID,
        )
    if progress:
        with_truth = sum(f.truth is not None for f in frames)
        progress(f"{source}: {len(frames)} frames, {with_truth} with ground truth")
    return frames


def _pick(n: int, limit: int | None) -> list[int]:
    if limit is None or limit >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(1, limit - 1)) for i in range(limit)})


def _folder(root: Path, limit: int | None) -> list[Frame]:
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    truth = _truth(root / "groundtruth.json", key="file")
    out = []
    for i in _pick(len(files), limit):
        img = cv2.imread(str(files[i]), cv2.IMREAD_COLOR)
        if img is None:
            raise QuantizeError(f"{files[i]}: not a readable image", code=Code.FRAMES_INVALID)
        out.append(Frame(files[i].name, img, truth.get(files[i].name) if truth else None))
    return out


def _video(path: Path, limit: int | None) -> list[Frame]:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise QuantizeError(f"{path}: OpenCV cannot open it as a video", code=Code.FRAMES_INVALID)
    truth = _truth(path.with_suffix(".json"), key="frame")
    try:
        images = []
        while True:
            ok, img = cap.read()
            if not ok:
                break
            images.append(img)
    finally:
        cap.release()
    return [Frame(str(i), images[i], truth.get(str(i)) if truth else None) for i in _pick(len(images), limit)]


def _truth(path: Path, key: str) -> dict[str, list[tuple[str, Box]]] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QuantizeError(f"{path}: unreadable ground truth: {exc}", code=Code.FRAMES_INVALID) from exc
    if not isinstance(doc, dict) or doc.get("schema") != GROUNDTRUTH_SCHEMA:
        return None  # some other JSON next to the video; not ours
    out: dict[str, list[tuple[str, Box]]] = {}
    try:
        for f in doc["frames"]:
            out[str(f[key])] = _regions(f)
    except (KeyError, TypeError, ValueError) as exc:
        raise QuantizeError(
            f"{path}: ground truth frame without a valid {key!r}/regions: {exc}", code=Code.FRAMES_INVALID
        ) from exc
    return out


def _regions(f: dict[str, Any]) -> list[tuple[str, Box]]:
    if "faces" in f:
        return [("face", _box(b)) for b in f["faces"]]
    return [(str(r["label"]), _box(r["box"])) for r in f["regions"]]


def _box(b: Any) -> Box:
    x1, y1, x2, y2 = (float(v) for v in b)
    return (x1, y1, x2, y2)
