"""Document-like frames for the PicoDet layout demo: rendered pages with a title, text blocks,
figures with captions, a table, a header and a footer, and their true region boxes.

Pages are drawn with OpenCV (Hershey fonts) and the demo photographs; every region is recorded
as it is drawn, so ``documents.json`` holds the layout ground truth of every frame, and the text drawn in each
region (its lines joined by newlines, a table's cells by spaces row by row; "" for a figure), the ground truth of
a cascade's text recogniser:

    {"schema": "edged.groundtruth/1", "fps": 1, "width": 816, "height": 1056,
     "frames": [{"frame": 0, "regions": [{"label": "title", "box": [x1, y1, x2, y2], "text": "..."}, ...]}, ...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.errors import FetchError

WIDTH, HEIGHT, FPS = 816, 1056, 1
SECONDS_PER_PAGE = 2
WORDS = (
    "edge",
    "inference",
    "camera",
    "model",
    "batch",
    "engine",
    "latency",
    "thermal",
    "power",
    "memory",
    "broker",
    "result",
    "frame",
    "device",
    "network",
    "signal",
    "system",
    "detector",
    "sample",
    "budget",
    "stream",
    "layer",
    "tensor",
    "quantize",
    "accuracy",
    "report",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "for",
    "with",
    "on",
    "at",
    "by",
    "from",
    "is",
    "are",
    "was",
    "were",
    "this",
    "that",
    "these",
    "which",
)
FONT = cv2.FONT_HERSHEY_SIMPLEX


def _text_block(img: np.ndarray, rng: np.random.Generator, x: int, y: int, w: int, lines: int) -> tuple[list[int], str]:
    step = 20
    drawn: list[str] = []
    for i in range(lines):
        words, line = [], ""
        while True:
            word = str(rng.choice(WORDS))
            trial = (line + " " + word).strip()
            if cv2.getTextSize(trial, FONT, 0.5, 1)[0][0] > (w if i < lines - 1 else w * 0.6):
                break
            line = trial
            words.append(word)
        cv2.putText(img, line, (x, y + 14 + i * step), FONT, 0.5, (20, 20, 20), 1, cv2.LINE_AA)
        drawn.append(line)
    return [x, y, x + w, y + lines * step], "\n".join(drawn)


def _table(
    img: np.ndarray, rng: np.random.Generator, x: int, y: int, w: int, rows: int, cols: int
) -> tuple[list[int], str]:
    rh, cw = 26, w // cols
    cells: list[list[str]] = []
    for r in range(rows + 1):
        cv2.line(img, (x, y + r * rh), (x + cols * cw, y + r * rh), (30, 30, 30), 1)
    for c in range(cols + 1):
        cv2.line(img, (x + c * cw, y), (x + c * cw, y + rows * rh), (30, 30, 30), 1)
    for r in range(rows):
        cells.append([])
        for c in range(cols):
            v = str(rng.choice(WORDS)) if r == 0 else f"{rng.uniform(0, 100):.1f}"
            cv2.putText(img, v, (x + 6 + c * cw, y + 18 + r * rh), FONT, 0.45, (20, 20, 20), 1, cv2.LINE_AA)
            cells[-1].append(v)
    return [x, y, x + cols * cw, y + rows * rh], "\n".join(" ".join(row) for row in cells)


def render_page(photos: dict[str, np.ndarray], page: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    rng = np.random.default_rng(100 + page)
    img = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    regions: list[dict[str, Any]] = []

    def add(label: str, box: list[int], text: str) -> None:
        regions.append({"label": label, "box": [float(v) for v in box], "text": text})

    margin = 70
    cv2.putText(img, f"edged technical note {page + 1}", (margin, 40), FONT, 0.45, (90, 90, 90), 1, cv2.LINE_AA)
    header = f"edged technical note {page + 1}"
    add("header", [margin, 28, margin + cv2.getTextSize(header, FONT, 0.45, 1)[0][0], 44], header)
    title = ["Fixed batch inference at the edge", "Thermal limits of small devices", "Results over MQTT",
             "Quantized detectors", "Atomic model swaps"][page % 5]  # fmt: skip
    (tw, th), _ = cv2.getTextSize(title, cv2.FONT_HERSHEY_DUPLEX, 1.1, 2)
    tx = (WIDTH - tw) // 2
    cv2.putText(img, title, (tx, 100), cv2.FONT_HERSHEY_DUPLEX, 1.1, (0, 0, 0), 2, cv2.LINE_AA)
    add("title", [tx, 100 - th, tx + tw, 108], title)
    y = 140
    add("text", *_text_block(img, rng, margin, y, WIDTH - 2 * margin, 6))
    y += 6 * 20 + 30
    name = ["astronaut.png", "coffee.png", "camera.png", "grace_hopper.jpg", "astronaut.png"][page % 5]
    photo = photos[name]
    fw = 360
    fh = round(photo.shape[0] * fw / photo.shape[1])
    fx = (WIDTH - fw) // 2
    img[y : y + fh, fx : fx + fw] = cv2.resize(photo, (fw, fh), interpolation=cv2.INTER_AREA)
    add("figure", [fx, y, fx + fw, y + fh], "")
    y += fh + 8
    cap = f"Figure {page + 1}: a photograph from the sample data."
    cw_ = cv2.getTextSize(cap, FONT, 0.45, 1)[0][0]
    cv2.putText(img, cap, ((WIDTH - cw_) // 2, y + 14), FONT, 0.45, (40, 40, 40), 1, cv2.LINE_AA)
    add("figure_caption", [(WIDTH - cw_) // 2, y + 2, (WIDTH + cw_) // 2, y + 18], cap)
    y += 40
    add("text", *_text_block(img, rng, margin, y, WIDTH - 2 * margin, 4))
    y += 4 * 20 + 30
    cap = f"Table {page + 1}: measured values."
    cv2.putText(img, cap, (margin, y + 14), FONT, 0.45, (40, 40, 40), 1, cv2.LINE_AA)
    add("table_caption", [margin, y + 2, margin + cv2.getTextSize(cap, FONT, 0.45, 1)[0][0], y + 18], cap)
    y += 26
    rows = 5 if y + 5 * 26 < HEIGHT - 140 else 3
    add("table", *_table(img, rng, margin, y, WIDTH - 2 * margin, rows, 4))
    y += rows * 26 + 30
    if y + 60 < HEIGHT - 60:
        add("text", *_text_block(img, rng, margin, y, WIDTH - 2 * margin, 3))
    foot = f"page {page + 1}"
    fwid = cv2.getTextSize(foot, FONT, 0.45, 1)[0][0]
    cv2.putText(img, foot, ((WIDTH - fwid) // 2, HEIGHT - 30), FONT, 0.45, (90, 90, 90), 1, cv2.LINE_AA)
    add("footer", [(WIDTH - fwid) // 2, HEIGHT - 42, (WIDTH + fwid) // 2, HEIGHT - 26], foot)
    return img, regions


def make_document_video(photos_dir: Path, video: Path, truth: Path, pages: int = 5, first_page: int = 0) -> None:
    """Render pages `first_page` .. `first_page + pages - 1` (each page number draws its own layout)."""
    photos = {}
    for name in ("astronaut.png", "coffee.png", "camera.png", "grace_hopper.jpg"):
        img = cv2.imread(str(photos_dir / name), cv2.IMREAD_COLOR)
        if img is None:
            raise FetchError(f"{photos_dir / name}: cannot read the photograph")
        photos[name] = img
    video.parent.mkdir(parents=True, exist_ok=True)
    tmp = video.with_name(video.stem + ".tmp.mp4")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise FetchError(f"{video}: OpenCV cannot write mp4 here")
    frames: list[dict[str, object]] = []
    try:
        for p in range(first_page, first_page + pages):
            img, regions = render_page(photos, p)
            for _ in range(FPS * SECONDS_PER_PAGE):
                frames.append({"frame": len(frames), "page": p, "regions": regions})
                writer.write(img)
    finally:
        writer.release()
    os.replace(tmp, video)
    tmp_truth = truth.with_suffix(".tmp")
    tmp_truth.write_text(json.dumps({"schema": "edged.groundtruth/1", "fps": FPS, "width": WIDTH,
                                     "height": HEIGHT, "frames": frames}))  # fmt: skip
    os.replace(tmp_truth, truth)
