"""Per track: when a stage infers it again, and what its readings vote for.

With tracking on, a stage infers a track's crop on its first frame, then at most every ``reinfer_frames`` of
its frames, or sooner when its box has moved or changed size enough (IoU with the box last inferred below
``iou_change``): DeepStream's ``secondary-reinfer-interval``, so a cascade's cost grows with new objects, not
with the frame rate. Between readings the track carries its vote:

- labels (a classifier stage): each label's mean score over the track's readings, the best ``top_k``;
- text (a recogniser stage): the text read most often, weighed by score, with its mean score;
- boxes (a detector stage): not voted (sub-boxes are the frame's own pixels): only frames inferred carry them.

A frame's vote counts the readings of that frame and the frames before it (by the camera's seq), never a
later one a stage finished first. A vote belongs to one version of its stage: `reset` at each flip, so no
result mixes two versions. Tracks are kept most-recently-seen first, bounded (``MAX_TRACKS`` per stage, the
newest ``MAX_READINGS`` readings each); the oldest are forgotten.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_TRACKS = 4096
MAX_READINGS = 32


def iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@dataclass
class _Track:
    seen_since: int = 0  # frames of the track since its last reading was asked for
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # the box last asked for
    version: int = -1  # the stage version of the readings below
    readings: deque[tuple[int, Mapping[str, Any]]] = field(default_factory=lambda: deque(maxlen=MAX_READINGS))


class Votes:
    """One stage's tracks. `due` (the decode thread) and `add` / `vote` (the stage thread) hold one lock."""

    def __init__(self, reinfer_frames: int, iou_change: float, top_k: int) -> None:
        self.reinfer_frames = reinfer_frames
        self.iou_change = iou_change
        self.top_k = top_k
        self._tracks: OrderedDict[tuple[str, int], _Track] = OrderedDict()
        self._lock = threading.Lock()
        self.version = -1  # the stage version the tracks' readings are of

    def due(self, camera: str, track_id: int, box: tuple[float, float, float, float]) -> bool:
        """Whether this frame's crop of the track is to be inferred (and, when it is, counted as asked)."""
        key = (camera, track_id)
        with self._lock:
            t = self._tracks.get(key)
            if t is None:
                t = self._tracks[key] = _Track(box=box)
                while len(self._tracks) > MAX_TRACKS:
                    self._tracks.popitem(last=False)
                return True
            self._tracks.move_to_end(key)
            t.seen_since += 1
            if t.seen_since >= self.reinfer_frames or iou(t.box, box) < self.iou_change:
                t.seen_since, t.box = 0, box
                return True
            return False

    def reset(self, version: int) -> None:
        """A new version of the stage serves: every track's readings are forgotten (read again on its next frame)."""
        with self._lock:
            self._tracks.clear()
            self.version = version

    def add(self, camera: str, track_id: int, version: int, seq: int, output: Mapping[str, Any]) -> dict[str, Any]:
        """Record the track's reading of frame `seq` by `version`; return the track's vote up to that frame."""
        with self._lock:
            t = self._tracks.get((camera, track_id))
            if t is None:  # forgotten meanwhile (bounded, or reset by a flip): the reading alone
                t = _Track()
            if t.version != version:
                t.readings.clear()
                t.version = version
            t.readings.append((seq, output))
            return self._vote(t, seq, output)

    def vote(self, camera: str, track_id: int, version: int, seq: int) -> dict[str, Any] | None:
        """The track's vote at frame `seq` by `version`'s readings of it and earlier frames; None without any."""
        with self._lock:
            t = self._tracks.get((camera, track_id))
            if t is None or t.version != version:
                return None
            if not any(s <= seq for s, _ in t.readings):
                return None
            return self._vote(t, seq, None)

    def _vote(self, t: _Track, seq: int, latest: Mapping[str, Any] | None) -> dict[str, Any]:
        readings = [out for s, out in t.readings if s <= seq]
        label_sums: dict[str, float] = {}
        texts: dict[str, tuple[float, int]] = {}  # text -> (score sum, readings)
        for out in readings:
            for label, score in out.get("labels", ()):
                label_sums[label] = label_sums.get(label, 0.0) + float(score)
            if "text" in out:
                s, n = texts.get(out["text"], (0.0, 0))
                texts[out["text"]] = (s + float(out["score"]), n + 1)
        doc: dict[str, Any] = {}
        if label_sums:
            best = sorted(label_sums.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top_k]
            doc["labels"] = [[label, round(s / len(readings), 4)] for label, s in best]
        if texts:
            text, (s, n) = max(texts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
            doc["text"], doc["score"] = text, round(s / n, 4)
        if latest is not None and "boxes" in latest:
            doc["boxes"] = latest["boxes"]
        doc["votes"] = len(readings)
        return doc

    def __len__(self) -> int:
        return len(self._tracks)
