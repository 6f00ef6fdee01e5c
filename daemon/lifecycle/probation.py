"""The probation of a newly swapped-in version (DESIGN §5): what it is judged against (Probation) and the
verdicts that roll it back: an inference or decoding error, a median batch time over the replaced
version's by `model.probation_latency_ratio`, or an output that collapses or explodes next to the
replaced version's on the same cameras (output_verdict). The model manager (daemon/lifecycle/manager.py) asks for
the verdict each tick and commits or rolls back.

After a restart (a version installed while the daemon was stopped, a probation that spans a restart)
there is no replaced model in memory: the serving version's output is recorded in the store
(OutputRecorder: output.json, `edged.store.output/1`, at most once a minute and at a clean stop) and a
start judges the version on probation against what was recorded of `previous` (probation_from_store)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edged.errors import EdgedError
from edged.models.store import RecordedOutput, Store

from ..config import ModelConfig
from ..inference import ActiveModel, OutputFigures

logger = logging.getLogger(__name__)

RECORD_EVERY_S = 60.0  # the serving version's output goes to the store at most this often (and at a swap, a stop)

LATENCY_MIN_BATCHES = 20  # batches on the new model before its median batch time is judged


@dataclass
class Probation:
    version: int
    since_mono: float
    baseline_ms: float | None
    start_batches: int  # the model's batch count when probation began (0 after a flip)
    # what the version before output on the same cameras: in memory at a hot swap or a reload, as the store
    # recorded it after a restart (None when nothing was recorded: judged on errors and latency alone)
    baseline_output: OutputFigures | None = None


def probation_from_store(store: Store, name: str, version: int) -> Probation:
    """The probation of `version`, serving since a start with no replaced model in memory: judged against
    what the store recorded of `previous` (its output, and its median batch cost when state.json has none:
    a version installed while the daemon was stopped)."""
    baseline_ms = store.state(name).baseline_infer_ms
    prev = store.pointer(name, "previous")
    rec = store.recorded_output(name, prev)
    before = None
    if rec is not None:
        before = OutputFigures(rec.rows, rec.detections, rec.score_sum)
        baseline_ms = baseline_ms or rec.median_batch_ms
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(rec.recorded_at))
        logger.info(
            "%s@%d on probation against %s@%d's output as recorded %s: %s", name, version, name, prev, when, before
        )
    elif prev is not None:
        logger.info(
            "%s@%d on probation: nothing recorded of %s@%d's output, judged on errors and latency",
            name,
            version,
            name,
            prev,
        )
    return Probation(version, time.monotonic(), baseline_ms, 0, before)


class OutputRecorder:
    """Records the serving version's output in the store: its newest `frames` decoded rows (what
    output_verdict compares) and its median batch cost. `tick` at most every RECORD_EVERY_S, `record` at
    once (a swap, a stop); nothing is written when the version decoded nothing since its last record, nor
    when a run too short to fill the window would replace a fuller one recorded before (a restart)."""

    def __init__(self, store: Store | None, frames: int) -> None:
        self.store = store
        self.frames = frames
        self.written = 0  # bytes written so far (output.json), for the flash-wear figure
        self._lock = threading.Lock()
        self._recorded = (0, 0)  # (version, rows decoded) at the last record
        self._next = time.monotonic() + RECORD_EVERY_S

    def tick(self, now: float, a: ActiveModel | None) -> None:
        if now >= self._next:
            self.record(a)

    def record(self, a: ActiveModel | None) -> None:
        """A failed write is logged: it costs a later probation its baseline, never the serving."""
        if a is None or self.store is None or not a.rows or (a.version, a.rows) == self._recorded:
            return
        with self._lock:
            self._next = time.monotonic() + RECORD_EVERY_S
            fig = a.recent_output(self.frames)
            kept = self.store.recorded_output(a.name, a.version) if fig.rows < self.frames else None
            if kept is not None and kept.rows > fig.rows:  # a short run after a restart: the full window stays
                return
            median = a.cost_ms.percentiles((50,)).get("p50")
            rec = RecordedOutput(
                fig.rows,
                fig.detections,
                round(fig.score_sum, 3),
                None if median is None else round(median, 3),
                round(time.time(), 1),
            )
            try:
                self.written += self.store.record_output(a.name, a.version, rec)
            except EdgedError as exc:
                logger.warning("could not record the output of %s: %s", a.ref, exc)
                return
            self._recorded = (a.version, a.rows)


MIN_BASELINE_DETECTIONS = 20  # a collapse is judged only against an old window that saw at least this many


def output_verdict(
    before: OutputFigures, after: OutputFigures, ratio: float, frames: int, words: Callable[[OutputFigures], str] = str
) -> str:
    """Why the new version's output is implausible next to the old one's on the same cameras, or "".

    `before` is the old version's output over its newest `frames` rows just before the swap (the same
    scene, minutes apart), `after` the new version's since; judged once both have `frames` rows. A rate of
    detections per frame under 1/`ratio` of the old one's (it suddenly detects nothing) counts only when
    the old window held at least MIN_BASELINE_DETECTIONS detections: an empty scene judges nothing. Over
    `ratio` times it and at least one per frame (it suddenly detects everything; an old rate under 0.1
    counts as 0.1). `words`: how the figures are said (a cascade stage's are crops, not frames)."""
    if before.rows < frames or after.rows < frames:
        return ""
    if before.detections >= MIN_BASELINE_DETECTIONS and after.rate < before.rate / ratio:
        return f"output collapse: {words(after)} vs {words(before)} before (under 1/{ratio:g})"
    if after.rate >= 1.0 and after.rate > max(before.rate, 0.1) * ratio:
        return f"output explosion: {words(after)} vs {words(before)} before (over x{ratio:g})"
    return ""


def probation_verdict(p: Probation, a: ActiveModel, cfg: ModelConfig) -> str:
    """Why the version on probation (`a`, the model serving) must be rolled back now, or "". The latency
    regression is judged no later than the commit could come; the output once both windows are full,
    whether or not the latency was judged (a version as fast as the old one may still see nothing)."""
    median = a.cost_ms.percentiles((50,)).get("p50", 0.0)
    return judge(
        Judged(a.errors, a.batches, median, a.backend.cpu_bound, a.output_figures()),
        p.baseline_ms,
        p.baseline_output,
        cfg,
    )


@dataclass(frozen=True)
class Judged:
    """What a version on probation did so far, as `judge` reads it: the primary's batches and frames
    (`probation_verdict`), or a cascade stage's batches and crops (daemon/cascade/swap.py), where `median_ms`
    is its median cost per crop and `output` counts crops and the crops it said something of."""

    errors: int
    batches: int
    median_ms: float
    cpu_bound: bool
    output: OutputFigures
    unit: str = "batch"  # what `median_ms` is the cost of, in words
    words: Callable[[OutputFigures], str] = str  # how `output` is said


def judge(j: Judged, baseline_ms: float | None, baseline_output: OutputFigures | None, cfg: ModelConfig) -> str:
    """The verdict of a probation (see `probation_verdict`): errors, then the latency regression against
    `baseline_ms`, then the output against `baseline_output` (output_verdict); "" while none says roll back."""
    if j.errors:
        return f"{j.errors} inference/decoding error(s) on probation"
    enough = j.batches >= min(LATENCY_MIN_BATCHES, max(1, cfg.probation_batches))
    ratio = cfg.probation_latency_ratio
    if baseline_ms and ratio and enough and j.median_ms > baseline_ms * ratio:
        how = "CPU time" if j.cpu_bound else "wall time"
        return (
            f"latency regression: median {j.unit} {j.median_ms:.1f} ms vs {baseline_ms:.1f} ms before "
            f"({how}; over x{ratio:g})"
        )
    if baseline_output is not None and cfg.probation_output_ratio:
        ratio, frames = cfg.probation_output_ratio, cfg.probation_output_frames
        return output_verdict(baseline_output, j.output, ratio, frames, j.words)
    return ""
