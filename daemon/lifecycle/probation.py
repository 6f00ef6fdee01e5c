"""The probation of a newly swapped-in version (DESIGN §5): what it is judged against (Probation) and the
verdicts that roll it back: an inference or decoding error, a median batch time over the replaced
version's by `model.probation_latency_ratio`, or an output that collapses or explodes next to the
replaced version's on the same cameras (output_verdict). The model manager (daemon/lifecycle/manager.py) asks for
the verdict each tick and commits or rolls back."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..inference import ActiveModel, OutputFigures

LATENCY_MIN_BATCHES = 20  # batches on the new model before its median batch time is judged


@dataclass
class Probation:
    version: int
    since_mono: float
    baseline_ms: float | None
    start_batches: int  # the model's batch count when probation began (0 after a flip)
    # what the version before output on the same cameras (a hot swap; unknown after a restart)
    baseline_output: OutputFigures | None = None


MIN_BASELINE_DETECTIONS = 20  # a collapse is judged only against an old window that saw at least this many


def output_verdict(before: OutputFigures, after: OutputFigures, ratio: float, frames: int) -> str:
    """Why the new version's output is implausible next to the old one's on the same cameras, or "".

    `before` is the old version's output over its newest `frames` rows just before the swap (the same
    scene, minutes apart), `after` the new version's since; judged once both have `frames` rows. A rate of
    detections per frame under 1/`ratio` of the old one's (it suddenly detects nothing) counts only when
    the old window held at least MIN_BASELINE_DETECTIONS detections: an empty scene judges nothing. Over
    `ratio` times it and at least one per frame (it suddenly detects everything; an old rate under 0.1
    counts as 0.1)."""
    if before.rows < frames or after.rows < frames:
        return ""
    if before.detections >= MIN_BASELINE_DETECTIONS and after.rate < before.rate / ratio:
        return f"output collapse: {after} vs {before} before (under 1/{ratio:g})"
    if after.rate >= 1.0 and after.rate > max(before.rate, 0.1) * ratio:
        return f"output explosion: {after} vs {before} before (over x{ratio:g})"
    return ""


def probation_verdict(p: Probation, a: ActiveModel, cfg: ModelConfig) -> str:
    """Why the version on probation (`a`, the model serving) must be rolled back now, or "". The latency
    regression is judged no later than the commit could come; the output only when no latency is judged."""
    if a.errors:
        return f"{a.errors} inference/decoding error(s) on probation"
    if (
        p.baseline_ms
        and cfg.probation_latency_ratio
        and a.batches >= min(LATENCY_MIN_BATCHES, max(1, cfg.probation_batches))
    ):
        median = a.cost_ms.percentiles((50,)).get("p50", 0.0)
        if median > p.baseline_ms * cfg.probation_latency_ratio:
            how = "CPU time" if a.backend.cpu_bound else "wall time"
            return (
                f"latency regression: median batch {median:.1f} ms vs {p.baseline_ms:.1f} ms before "
                f"({how}; over x{cfg.probation_latency_ratio:g})"
            )
        return ""
    if p.baseline_output is not None and cfg.probation_output_ratio:
        return output_verdict(
            p.baseline_output, a.output_figures(), cfg.probation_output_ratio, cfg.probation_output_frames
        )
    return ""
