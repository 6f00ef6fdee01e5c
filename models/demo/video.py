"""The demo video: public-domain photographs moving over synthetic backgrounds, with ground truth.

The photographs' face boxes were annotated by eye once, in each photograph's own pixels, and
checked against an overlay; compositing only scales and translates a photograph, so the true box
in every frame follows exactly. Stretches without faces (empty background, and a photograph of a
coffee cup as a hard negative) test precision. The output is an mp4 and a JSON file:

    {"schema": "edged.groundtruth/1", "fps": 15, "width": 960, "height": 540,
     "frames": [{"frame": 0, "faces": [[x1, y1, x2, y2], ...]}, ...]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from edged.errors import FetchError

WIDTH, HEIGHT, FPS = 960, 540, 15

# Face boxes [x1, y1, x2, y2] in each photograph's pixels, annotated by eye.
FACES: dict[str, list[list[float]]] = {
    "astronaut.png": [[170, 72, 278, 184]],
    "camera.png": [[180, 122, 256, 200]],
    "grace_hopper.jpg": [[172, 128, 360, 338]],
    "coffee.png": [],
}


@dataclass(frozen=True)
class Move:
    """A photograph moving from (x0, y0) at scale s0 to (x1, y1) at scale s1 over [start, end)."""

    photo: str
    start: int
    end: int
    x0: float
    y0: float
    s0: float
    x1: float
    y1: float
    s1: float

    def at(self, frame: int) -> tuple[float, float, float]:
        t = (frame - self.start) / max(1, self.end - self.start - 1)
        return (
            self.x0 + (self.x1 - self.x0) * t,
            self.y0 + (self.y1 - self.y0) * t,
            self.s0 + (self.s1 - self.s0) * t,
        )


def _timeline() -> tuple[int, list[Move]]:
    s = FPS  # one second
    moves = [
        # 0-2 s: nothing but background; 2-4 s: a coffee cup (no face) drifts through.
        Move("coffee.png", 2 * s, 4 * s, 40, 120, 0.45, 560, 100, 0.55),
        # 4-9 s: the astronaut walks across and comes closer.
        Move("astronaut.png", 4 * s, 9 * s, 20, 150, 0.70, 440, 20, 1.00),
        # 9-10 s: empty again.
        # 10-16 s: two people at once.
        Move("grace_hopper.jpg", 10 * s, 16 * s, 20, 60, 0.60, 50, 100, 0.70),
        Move("camera.png", 10 * s, 16 * s, 440, 20, 0.90, 420, 20, 1.00),
        # 16-17 s: empty; 17-20 s: two people and the cup. Photographs never overlap.
        Move("astronaut.png", 17 * s, 20 * s, 10, 150, 0.65, 40, 150, 0.65),
        Move("grace_hopper.jpg", 17 * s, 20 * s, 400, 40, 0.55, 420, 40, 0.55),
        Move("coffee.png", 17 * s, 20 * s, 710, 300, 0.40, 710, 280, 0.40),
    ]
    return 20 * s, moves


def _background(frame: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    phase = frame / 60.0
    b = 90 + 60 * np.sin(xx / 180 + phase)
    g = 100 + 50 * np.cos(yy / 140 - phase)
    r = 110 + 40 * np.sin((xx + yy) / 220 + 2 * phase)
    img = np.dstack([b, g, r]).astype(np.uint8)
    for k in range(4):  # a few moving shapes as clutter
        cx = int((150 + 230 * k + 7 * frame) % WIDTH)
        cy = int(80 + 110 * k)
        cv2.rectangle(img, (cx, cy), (cx + 60, cy + 35), (40 + 50 * k, 200 - 40 * k, 90), -1)
    noise = rng.integers(0, 8, img.shape, dtype=np.uint8)
    return cv2.add(img, noise)


def make_demo_video(photos: Path, video: Path, truth: Path, seed: int = 7) -> None:
    nframes, moves = _timeline()
    images: dict[str, np.ndarray] = {}
    for name in FACES:
        img = cv2.imread(str(photos / name), cv2.IMREAD_COLOR)
        if img is None:
            raise FetchError(f"{photos / name}: cannot read the photograph")
        images[name] = img
    video.parent.mkdir(parents=True, exist_ok=True)
    tmp_video = video.with_name(video.stem + ".tmp.mp4")
    writer = cv2.VideoWriter(str(tmp_video), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise FetchError(f"{video}: OpenCV cannot write mp4 here (no FFmpeg in this OpenCV build?)")
    rng = np.random.default_rng(seed)
    frames = []
    try:
        for i in range(nframes):
            canvas = _background(i, rng)
            faces: list[list[float]] = []
            for m in moves:
                if not m.start <= i < m.end:
                    continue
                x, y, s = m.at(i)
                photo = images[m.photo]
                h, w = photo.shape[:2]
                pw, ph = round(w * s), round(h * s)
                x0, y0 = round(x), round(y)
                if x0 < 0 or y0 < 0 or x0 + pw > WIDTH or y0 + ph > HEIGHT:
                    raise ValueError(f"{m.photo} leaves the frame at frame {i}")
                canvas[y0 : y0 + ph, x0 : x0 + pw] = cv2.resize(photo, (pw, ph), interpolation=cv2.INTER_AREA)
                sx, sy = pw / w, ph / h
                faces += [
                    [round(x0 + bx1 * sx, 1), round(y0 + by1 * sy, 1), round(x0 + bx2 * sx, 1), round(y0 + by2 * sy, 1)]
                    for bx1, by1, bx2, by2 in FACES[m.photo]
                ]
            writer.write(canvas)
            frames.append({"frame": i, "faces": faces})
    finally:
        writer.release()
    os.replace(tmp_video, video)
    doc = {"schema": "edged.groundtruth/1", "fps": FPS, "width": WIDTH, "height": HEIGHT, "frames": frames}
    tmp_truth = truth.with_suffix(".tmp")
    tmp_truth.write_text(json.dumps(doc))
    os.replace(tmp_truth, truth)
