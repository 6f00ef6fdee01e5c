"""A multi-object tracker per camera, ByteTrack-style: detections continue tracks by IoU with each track's
predicted box, confident detections first, then (optionally) low-score ones for the tracks still unmatched.

- Association is greedy on IoU, best pairs first, within one label (no solver dependency: with the few
  objects a camera sees, greedy and Hungarian agree almost always, and greedy is easy to follow). A box
  whose area is more than MAX_AREA_RATIO times the predicted box's (or less than its 1/MAX_AREA_RATIO)
  never continues the track, whatever the IoU: one object does not double in size from one frame to
  the next, two different ones in about the same place do.
- A track's box is predicted with a constant velocity (smoothed), per frame, so a short miss or
  a dropped frame does not lose it.
- A new track is tentative until it has `min_hits` detections in a row; a tentative track that misses
  one frame is forgotten. A confirmed track survives up to `max_age` frames without a detection, then
  ends. Only confirmed tracks give a detection its track_id.
- Unmatched confident detections start tracks; low-score ones never do.

Time is a frame count that never goes back (`FrameMeta.seq`: the frames the camera has read in its whole
life, across reconnects and loop wraps; or, for a motion-gated camera, the frames inferred), so a file
played fast and one played in real time track alike, and an older frame number is refused (ValueError).
What breaks continuity (a reconnect, a loop wrap, a stall, a scene cut: `FrameMeta.segment`) is the
caller's to act on: `close()` ends every track, and later tracks get new ids (numbered on per camera,
never reused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import TrackingConfig

Box = tuple[float, float, float, float]

MAX_AREA_RATIO = 2.0  # a detection this much larger or smaller than a track's predicted box starts a new one


def area(b: Box) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def similar_size(a: Box, b: Box) -> bool:
    """Whether `b` may be `a` a frame later: neither area over MAX_AREA_RATIO times the other."""
    x, y = area(a), area(b)
    return x <= MAX_AREA_RATIO * y and y <= MAX_AREA_RATIO * x


def iou(a: Box, b: Box) -> float:
    ix = min(a[2], b[2]) - max(a[0], b[0])
    iy = min(a[3], b[3]) - max(a[1], b[1])
    if ix <= 0 or iy <= 0:
        return 0.0
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@dataclass
class Track:
    id: int  # 0 while tentative; numbered from 1 per camera when confirmed
    label: str
    box: Box
    first_frame: int
    last_frame: int
    hits: int = 1
    velocity: Box = (0.0, 0.0, 0.0, 0.0)  # per frame, smoothed
    confirmed: bool = False
    score: float = 0.0  # the latest detection's
    best_score: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # what the event layer keeps with a track

    def predict(self, frame: int) -> Box:
        dt = frame - self.last_frame
        return (
            self.box[0] + self.velocity[0] * dt,
            self.box[1] + self.velocity[1] * dt,
            self.box[2] + self.velocity[2] * dt,
            self.box[3] + self.velocity[3] * dt,
        )

    def update(self, box: Box, score: float, frame: int) -> None:
        dt = max(1, frame - self.last_frame)
        step = tuple((n - o) / dt for n, o in zip(box, self.box, strict=True))
        a = 0.5 if self.hits > 1 else 1.0  # the first step sets the velocity, later ones smooth it
        self.velocity = tuple(a * s + (1 - a) * v for s, v in zip(step, self.velocity, strict=True))  # type: ignore[assignment]
        self.box = box
        self.last_frame = frame
        self.hits += 1
        self.score = score
        self.best_score = max(self.best_score, score)


@dataclass(frozen=True)
class Update:
    """What one frame did: the track of each detection (None: not on a confirmed track), the tracks
    confirmed on this frame, and those that ended (missed more than max_age frames)."""

    tracks: list[Track | None]
    confirmed: list[Track]
    ended: list[Track]


def _greedy(
    tracks: Sequence[Track], boxes: Sequence[tuple[str, Box]], frame: int, threshold: float
) -> list[tuple[int, int]]:
    """(track index, box index) pairs, best IoU first, each at least `threshold`, one label each."""
    pairs = []
    for ti, t in enumerate(tracks):
        predicted = t.predict(frame)
        for bi, (label, box) in enumerate(boxes):
            if label == t.label and similar_size(predicted, box):
                v = iou(predicted, box)
                if v >= threshold:
                    pairs.append((v, ti, bi))
    pairs.sort(key=lambda p: -p[0])
    used_t: set[int] = set()
    used_b: set[int] = set()
    out = []
    for _, ti, bi in pairs:
        if ti not in used_t and bi not in used_b:
            used_t.add(ti)
            used_b.add(bi)
            out.append((ti, bi))
    return out


class Tracker:
    def __init__(self, cfg: TrackingConfig, high_score: float) -> None:
        """`high_score`: detections at or above it may start tracks; below it (down to the low-score
        threshold, filtered by the caller) they only continue one."""
        self.cfg = cfg
        self.high_score = high_score
        self.tracks: list[Track] = []
        self._next_id = 1
        self._frame = -1  # the latest frame given

    def update(self, dets: Sequence[tuple[str, float, Box]], frame: int) -> Update:
        """`dets`: (label, score, box) of one frame; returns each detection's track. `frame`: the camera's
        frame count, never lower than the previous call's (ValueError: tracks would never age out)."""
        if frame < self._frame:
            raise ValueError(f"frame {frame} after frame {self._frame}: the tracker's clock must never go back")
        self._frame = frame
        out: list[Track | None] = [None] * len(dets)
        high = [i for i, d in enumerate(dets) if d[1] >= self.high_score]
        low = [i for i, d in enumerate(dets) if d[1] < self.high_score]
        confirmed: list[Track] = []
        # stage 1: every track against the confident detections (confirmed tracks first on ties: greedy
        # by IoU already prefers the closer one)
        pairs = _greedy(self.tracks, [(dets[i][0], dets[i][2]) for i in high], frame, self.cfg.iou_threshold)
        matched_t = set()
        for ti, k in pairs:
            matched_t.add(ti)
            self._take(self.tracks[ti], dets[high[k]], frame, out, high[k], confirmed)
        taken_high = {high[k] for _, k in pairs}
        # stage 2: confirmed tracks still unmatched against the low-score detections
        rest = [ti for ti, t in enumerate(self.tracks) if ti not in matched_t and t.confirmed]
        if low and rest:
            pairs2 = _greedy([self.tracks[ti] for ti in rest], [(dets[i][0], dets[i][2]) for i in low], frame, 0.5)
            for j, k in pairs2:
                matched_t.add(rest[j])
                self._take(self.tracks[rest[j]], dets[low[k]], frame, out, low[k], confirmed)
        # unmatched tracks: tentative ones are forgotten, confirmed ones age out after max_age frames
        ended: list[Track] = []
        kept: list[Track] = []
        for ti, t in enumerate(self.tracks):
            if ti in matched_t or (t.confirmed and frame - t.last_frame <= self.cfg.max_age):
                kept.append(t)
            elif t.confirmed:
                ended.append(t)
        # unmatched confident detections start tentative tracks
        for i in high:
            if i not in taken_high:
                label, score, box = dets[i]
                t = Track(0, label, box, frame, frame, score=score, best_score=score)
                kept.append(t)
                if self.cfg.min_hits <= 1:
                    self._confirm(t, confirmed)
                    out[i] = t
        self.tracks = kept
        return Update(out, confirmed, ended)

    def _take(
        self,
        t: Track,
        det: tuple[str, float, Box],
        frame: int,
        out: list[Track | None],
        i: int,
        confirmed: list[Track],
    ) -> None:
        t.update(det[2], det[1], frame)
        if not t.confirmed and t.hits >= self.cfg.min_hits:
            self._confirm(t, confirmed)
        if t.confirmed:
            out[i] = t

    def _confirm(self, t: Track, confirmed: list[Track]) -> None:
        t.confirmed = True
        t.id = self._next_id
        self._next_id += 1
        confirmed.append(t)

    def close(self) -> list[Track]:
        """End every confirmed track and forget the tentative ones (the camera stopped, or what comes next
        does not continue what came before); the next ids go on from the last one."""
        ended = [t for t in self.tracks if t.confirmed]
        self.tracks = []
        return ended
