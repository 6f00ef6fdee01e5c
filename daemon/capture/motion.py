"""Motion-gated inference: a camera's frame is inferred only while something moves, plus a keep-alive.

The gate looks at the frame as the model gets it (the preprocessed row, already small), reduced to grey
and to at most 64 px wide, its range stretched to 0-1: a pixel moved when it differs from the previous
frames' by more than `pixel_threshold`, and the frame shows motion when more than `min_area` of its
pixels moved. "Previous" is a running average of the frames (the background), so a slow object still
shows and one that stops fades into the background within a few dozen frames. A frame is inferred
when it shows motion, for `hold_s` after the last one that did (so an object that stops is still seen,
and its track can end), and every `keepalive_s` regardless (so a still object stays known). Frames
skipped are counted per camera (telemetry: `cameras.<name>.skipped`). The seconds are the camera's own:
a file's playing time (so a recording read faster than real time is gated as it was filmed), a live
camera's clock.

Scene cuts (`CutDetector`, run by each camera on the frames it offers, for its tracks): the picture changed
as a whole from one frame to the next. Each frame becomes a 32 px wide grey thumbnail (sampled, then
area-averaged: about 0.1 ms on a 960x540 frame), measured against its own mean and spread; the frame is a
cut when at least CUT_AREA of the thumbnail's pixels moved by more than CUT_PIXEL_Z of that spread. People
walking change a few percent of it (at most ~0.1 on the demo video), two unrelated pictures 0.6-0.9; an
exposure step, a gain change or a dark picture's noise change nothing.
"""

from __future__ import annotations

import cv2
import numpy as np

from ..config import MotionConfig

WIDTH = 64
BACKGROUND_ALPHA = 0.1  # how fast the background takes in a change, per frame


def small_grey(row: np.ndarray) -> np.ndarray:
    """A model-input row ([C, H, W] or [H, W, C], any dtype) as a grey image at most WIDTH wide, in 0-1."""
    a = np.asarray(row, np.float32)
    if a.ndim == 3:
        a = a.mean(axis=0) if a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4) else a.mean(axis=-1)
    h, w = a.shape[:2]
    if w > WIDTH:
        a = np.asarray(cv2.resize(a, (WIDTH, max(1, round(h * WIDTH / w))), interpolation=cv2.INTER_AREA), np.float32)
    lo, hi = float(a.min()), float(a.max())
    return (a - lo) / (hi - lo) if hi - lo > 1e-6 else np.zeros_like(a)


class MotionGate:
    def __init__(self, cfg: MotionConfig) -> None:
        self.cfg = cfg
        self._prev: np.ndarray | None = None
        self._active_until = -1.0
        self._last_inferred = -1e18
        self.skipped = 0
        self.motion_frames = 0

    def moved(self, row: np.ndarray) -> bool:
        cur = small_grey(row)
        bg = self._prev
        if bg is None or bg.shape != cur.shape:
            self._prev = cur
            return True
        changed = float(np.count_nonzero(np.abs(cur - bg) > self.cfg.pixel_threshold)) / cur.size
        bg += BACKGROUND_ALPHA * (cur - bg)  # a running average: a slow object stands out, a still one fades in
        return changed > self.cfg.min_area

    def wants(self, row: np.ndarray, now: float) -> bool:
        """Whether to infer this frame (`now`: the camera's clock, seconds); a frame not wanted is counted skipped."""
        if self.moved(row):
            self.motion_frames += 1
            self._active_until = now + self.cfg.hold_s
        if now <= self._active_until or now - self._last_inferred >= self.cfg.keepalive_s:
            self._last_inferred = now
            return True
        self.skipped += 1
        return False


# --- scene cuts: the picture changed as a whole (an edit in a recording, a PTZ preset, a loop wrap) ------------

THUMB_WIDTH = 32
CUT_PIXEL_Z = 0.5  # a thumbnail pixel changed: by half the frame's spread or more (brightness and contrast aside)
CUT_AREA = 0.5  # a cut: at least this share of the thumbnail's pixels changed
_SPREAD_FLOOR = 16.0  # grey levels (0-255): a flat, dark frame's noise is no change


def thumbnail(frame: np.ndarray) -> np.ndarray:
    """A frame (BGR, or grey) as a THUMB_WIDTH-wide grey float32 image: its green channel sampled to at
    most 4 x THUMB_WIDTH px wide, then area-averaged; about 0.1 ms on a 960x540 frame."""
    h, w = frame.shape[:2]
    step = max(1, w // (4 * THUMB_WIDTH))
    g = frame[::step, ::step, min(1, frame.shape[2] - 1)] if frame.ndim == 3 else frame[::step, ::step]
    g = g.copy().astype(np.float32)  # the strided sample gathered at its own width, then widened: ~1.7x less CPU
    size = (THUMB_WIDTH, max(1, round(THUMB_WIDTH * h / w)))
    return np.asarray(cv2.resize(g, size, interpolation=cv2.INTER_AREA), np.float32)


def _standard(t: np.ndarray) -> np.ndarray:
    """The thumbnail against its own mean and spread. One cv2.meanStdDev call: ~5x less CPU than NumPy's mean
    and std on a thumbnail (their Python-level reductions), and the same cut shares on the demo video."""
    mean, std = cv2.meanStdDev(t)
    return (t - float(mean[0, 0])) / max(float(std[0, 0]), _SPREAD_FLOOR)


def cut_share(a: np.ndarray, b: np.ndarray) -> float:
    """The share of pixels that changed between two thumbnails, each measured against its own mean and
    spread (so an exposure step or a gain change is no change). Consecutive frames of moving objects give
    at most ~0.1; two unrelated pictures 0.6-0.9. Thumbnails of other sizes (the source changed size) are a cut."""
    if a.shape != b.shape:
        return 1.0
    return _changed(_standard(a), _standard(b))


def _changed(za: np.ndarray, zb: np.ndarray) -> float:
    """The share of pixels that changed between two standardised thumbnails of one size."""
    return float(np.count_nonzero(np.abs(za - zb) > CUT_PIXEL_Z)) / za.size


class CutDetector:
    """Whether each frame starts a new scene, against the frame before it."""

    def __init__(self) -> None:
        self._prev: np.ndarray | None = None  # the previous frame's thumbnail, standardised (once per frame)

    def cut(self, frame: np.ndarray) -> bool:
        """`cut_share(thumbnail(previous), thumbnail(frame)) >= CUT_AREA`, each thumbnail standardised once."""
        cur = _standard(thumbnail(frame))
        prev, self._prev = self._prev, cur
        if prev is None:
            return False
        return prev.shape != cur.shape or _changed(prev, cur) >= CUT_AREA

    def reset(self) -> None:
        """Forget the previous frame (the source was reopened: the discontinuity is counted already)."""
        self._prev = None
