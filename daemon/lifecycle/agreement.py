"""Serving against candidate: how far two models' detections on the same frames agree (docs/models.md,
"Shadow evaluation before a version serves"). Pure: boxes in, figures out; no model, no thread.

    match(serving, candidate)      pairs of the same label with IoU >= MATCH_IOU, greedily by IoU (highest
                                   first): each box in at most one pair
    Tally.add(serving, candidate)  one frame into the running counts: detections, matches, the score shift of
                                   matched pairs, label confusion (pairs by IoU whatever their labels)
    Tally.figures()                agreement, recall, precision, score shift, latency: protocol/shadow.py's
                                   figures, what thresholds are held against

Recall and precision are the candidate's, against the serving model taken as the truth: recall = matched /
serving detections, precision = matched / candidate detections; agreement = matched / the larger of the two
(1.0 when both saw nothing: no evidence either way, which `evidence` counts apart).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from edged.protocol.shadow import MATCH_IOU

NONE = "_none"  # label_confusion: a candidate box no serving box overlaps (the serving side's key)
MISSED = "_missed"  # label_confusion: a serving box no candidate box overlaps (the candidate side's key)
LATENCY_SAMPLES = 512  # the newest per-image costs kept for each model's median


class Box(Protocol):
    """What a detection must have here (daemon/decoders/base.py's `Detection` has it)."""

    @property
    def label(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def box(self) -> tuple[float, float, float, float]: ...


def iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """Intersection over union of two x1, y1, x2, y2 boxes (0.0 when either has no area)."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def pairs(
    serving: Sequence[Box], candidate: Sequence[Box], min_iou: float = MATCH_IOU, same_label: bool = True
) -> list[tuple[int, int, float]]:
    """(serving index, candidate index, IoU) of the pairs: greedily by IoU, highest first, each box in at most
    one pair, IoU at least `min_iou` (and the same label when `same_label`). Ties go to the lower indices."""
    scored = []
    for i, s in enumerate(serving):
        for j, c in enumerate(candidate):
            if same_label and s.label != c.label:
                continue
            v = iou(s.box, c.box)
            if v >= min_iou and v > 0.0:
                scored.append((-v, i, j))
    scored.sort()
    used_s: set[int] = set()
    used_c: set[int] = set()
    out = []
    for neg, i, j in scored:
        if i in used_s or j in used_c:
            continue
        used_s.add(i)
        used_c.add(j)
        out.append((i, j, -neg))
    return out


@dataclass
class FrameAgreement:
    """One frame's comparison: what `Tally.add` returns (the labelling store ranks frames by `disagreement`)."""

    serving: int
    candidate: int
    matched: int

    @property
    def disagreement(self) -> float:
        """1 - matched / the larger count (0.0: they agree, or both saw nothing)."""
        most = max(self.serving, self.candidate)
        return 0.0 if most == 0 else 1.0 - self.matched / most


@dataclass
class Tally:
    """Running counts of one camera's (or every camera's) shadow frames, and the models' per-image costs."""

    frames: int = 0
    serving: int = 0
    candidate: int = 0
    matched: int = 0
    score_shift_sum: float = 0.0  # sum of |candidate score - serving score| over matched pairs
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    serving_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    candidate_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))

    def add(self, serving: Sequence[Box], candidate: Sequence[Box], min_iou: float = MATCH_IOU) -> FrameAgreement:
        """One frame both models inferred: counts, matches, score shift and confusion."""
        matched = pairs(serving, candidate, min_iou)
        self.frames += 1
        self.serving += len(serving)
        self.candidate += len(candidate)
        self.matched += len(matched)
        self.score_shift_sum += sum(abs(candidate[j].score - serving[i].score) for i, j, _ in matched)
        any_label = pairs(serving, candidate, min_iou, same_label=False)
        seen_s = {i for i, _, _ in any_label}
        seen_c = {j for _, j, _ in any_label}
        for i, j, _ in any_label:
            self._confused(serving[i].label, candidate[j].label)
        for i, s in enumerate(serving):
            if i not in seen_s:
                self._confused(s.label, MISSED)
        for j, c in enumerate(candidate):
            if j not in seen_c:
                self._confused(NONE, c.label)
        return FrameAgreement(len(serving), len(candidate), len(matched))

    def _confused(self, serving_label: str, candidate_label: str) -> None:
        row = self.confusion.setdefault(serving_label, {})
        row[candidate_label] = row.get(candidate_label, 0) + 1

    def merge(self, other: Tally) -> None:
        """Add `other`'s counts in (the totals are every camera's tallies merged)."""
        self.frames += other.frames
        self.serving += other.serving
        self.candidate += other.candidate
        self.matched += other.matched
        self.score_shift_sum += other.score_shift_sum
        for s, row in other.confusion.items():
            for c, n in row.items():
                mine = self.confusion.setdefault(s, {})
                mine[c] = mine.get(c, 0) + n
        self.serving_ms.extend(other.serving_ms)
        self.candidate_ms.extend(other.candidate_ms)

    def figures(self) -> dict[str, Any]:
        """The report's figures (``edged.shadow/1`` `totals` / `per_camera`): None where there is nothing to
        divide by."""
        most = max(self.serving, self.candidate)
        serving_ms = statistics.median(self.serving_ms) if self.serving_ms else None
        candidate_ms = statistics.median(self.candidate_ms) if self.candidate_ms else None
        ratio = candidate_ms / serving_ms if serving_ms and candidate_ms is not None else None
        return {
            "frames": self.frames,
            "serving_detections": self.serving,
            "candidate_detections": self.candidate,
            "matched": self.matched,
            "agreement": _r(self.matched / most) if most else (1.0 if self.frames else None),
            "recall": _r(self.matched / self.serving) if self.serving else None,
            "precision": _r(self.matched / self.candidate) if self.candidate else None,
            "score_shift": _r(self.score_shift_sum / self.matched) if self.matched else None,
            "label_confusion": {s: dict(row) for s, row in self.confusion.items()},
            "serving_ms": _r(serving_ms, 3),
            "candidate_ms": _r(candidate_ms, 3),
            "latency_ratio": _r(ratio),
        }


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)
