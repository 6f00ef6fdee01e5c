"""``edged push --shadow``: the operator's side of a push that promotes on shadow evidence (issue 29).

The offer carries a `ShadowAsk` (`edged.protocol.shadow`): the device installs the candidate beside the
serving version, runs it on a sample of live frames and publishes its report, retained, on ``…/shadow``
(``edged.shadow/1``); its ``…/ota/status`` says ``shadowing`` meanwhile, then ``probation`` (the candidate
passed: the normal swap and probation follow) or ``rejected`` (code ``model_rejected``: a threshold failed;
``no_evidence``: the scene gave too little to judge on, never a pass).

Here: the ask made from the command line's flags (`shadow_ask`), what a pusher knows of each device's
evaluation (`ShadowView`: the newest report of this transfer's candidate), and its figures in words for the
live line, the per-camera lines (``--verbose``), the final report and a rollout's state file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from edged.protocol.shadow import DEFAULT_PROMOTE_IF, ShadowAsk, parse_promote_if, promote_if_text

# the figures a line shows, in this order: (report key, label, format)
LINE_FIGURES = (
    ("agreement", "agreement", "{:.3f}"),
    ("recall", "recall", "{:.3f}"),
    ("precision", "precision", "{:.3f}"),
    ("latency_ratio", "latency", "x{:.2f}"),
)
# what a rollout's state file keeps of a device's report (`ShadowView.summary`)
SUMMARY_KEYS = ("frames", "serving_detections", "candidate_detections", "matched", *(k for k, _, _ in LINE_FIGURES))
FAILED_STATES = ("failed", "no_evidence")
DEFAULTS = ShadowAsk()
MAX_MAX_S = 7 * 86400.0  # the longest evaluation an ask may name (`ShadowAsk.max_s`)


def shadow_ask(
    sample_fps: float | None = None,
    promote_if: str | None = None,
    min_frames: int | None = None,
    min_detections: int | None = None,
    min_s: float | None = None,
    max_s: float | None = None,
) -> ShadowAsk:
    """The offer's ``shadow`` field from the flags (None: the documented default). A ValueError names the flag
    or the ``--promote-if`` term it cannot take."""
    given = {
        "sample_fps": sample_fps,
        "min_frames": min_frames,
        "min_detections": min_detections,
        "min_s": min_s,
        "max_s": max_s,
    }
    fields: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if promote_if is not None:
        fields["promote_if"] = parse_promote_if(promote_if)  # its ValueError names the term
    for name, value in fields.items():  # one flag at a time, on its field's own bounds: the error names it
        if name == "promote_if":
            continue
        alone = {"min_s": {"max_s": MAX_MAX_S}, "max_s": {"min_s": 0.0}}.get(name, {})  # no pair to hold yet
        try:
            ShadowAsk.model_validate({name: value, **alone})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValueError(f"--{name.replace('_', '-')} {value}: {msg}") from None
    ask = DEFAULTS.model_copy(update=fields)  # validated just above, field by field
    if ask.min_s > ask.max_s:
        raise ValueError(f"--min-s {ask.min_s:g} is over --max-s {ask.max_s:g}")
    return ShadowAsk.model_validate(ask.model_dump())  # and as a whole, as the device will


def defaults_text() -> str:
    """The documented defaults, for ``--help``."""
    d = DEFAULTS
    return (
        f"--sample-fps {d.sample_fps:g} --promote-if '{promote_if_text(DEFAULT_PROMOTE_IF)}' "
        f"--min-frames {d.min_frames} --min-detections {d.min_detections} --min-s {d.min_s:g} --max-s {d.max_s:g}"
    )


def ask_text(ask: ShadowAsk) -> str:
    """An ask in words, for the push's first lines."""
    return (
        f"{ask.sample_fps:g} frame(s)/s per camera, promote if {promote_if_text(ask.promote_if)}, on at least "
        f"{ask.min_frames} frames, {ask.min_detections} detections and {ask.min_s:g} s (no evidence after "
        f"{ask.max_s:g} s)"
    )


def _fmt(doc: dict[str, Any], key: str, form: str) -> str | None:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return form.format(value)


def figures_text(doc: dict[str, Any]) -> str:
    """``412 frames, 96/101 matched, agreement 0.950, recall 0.990, precision 0.960, latency x1.10``: what is there."""
    parts = []
    if isinstance(doc.get("frames"), int):
        parts.append(f"{doc['frames']} frames")
    if isinstance(doc.get("matched"), int) and isinstance(doc.get("serving_detections"), int):
        parts.append(f"{doc['matched']}/{doc['serving_detections']} matched")
    for key, label, form in LINE_FIGURES:
        value = _fmt(doc, key, form)
        if value is not None:
            parts.append(f"{label} {value}")
    return ", ".join(parts)


@dataclass
class ShadowView:
    """One device's shadow evaluation as the pusher last heard of it: the newest ``…/shadow`` report of this
    transfer's candidate, else the figures of its ``shadowing`` status."""

    state: str = ""  # running | passed | failed | no_evidence ('' before any report)
    totals: dict[str, Any] = field(default_factory=dict)
    per_camera: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    ts: float = 0.0

    def take_report(self, doc: dict[str, Any]) -> bool:
        """An ``edged.shadow/1`` report; False when it is older than what is held."""
        ts = float(doc.get("ts") or 0.0)
        if ts < self.ts:
            return False
        self.ts = ts
        self.state = str(doc.get("state") or self.state)
        self.totals = dict(doc.get("totals") or {})
        self.per_camera = {str(k): dict(v) for k, v in (doc.get("per_camera") or {}).items() if isinstance(v, dict)}
        self.reasons = [str(r) for r in doc.get("reasons") or []]
        self.evidence = dict(doc.get("evidence") or {})
        return True

    def take_status(self, detail: dict[str, Any], ts: float) -> None:
        """The figures an ota status carries (``detail.shadow``) while no report is newer."""
        figures = detail.get("shadow")
        if isinstance(figures, dict) and ts >= self.ts:
            self.ts = ts
            self.state = self.state or "running"
            self.totals = {k: v for k, v in figures.items() if k in SUMMARY_KEYS} or self.totals

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES

    def line(self, reasons: bool = True) -> str:
        """The live line: ``shadow running: 120 frames, agreement 0.970, …`` (why it failed, with `reasons`)."""
        state = self.state.replace("_", " ") or "waiting for a report"
        figures = figures_text(self.totals)
        why = f" ({'; '.join(self.reasons)})" if reasons and self.reasons and self.failed else ""
        return f"shadow {state}" + (f": {figures}" if figures else "") + why

    def camera_lines(self) -> list[str]:
        """One line per camera (``--verbose``)."""
        cams = sorted(self.per_camera.items())
        return [f"    {cam:<16} {figures_text(doc) or 'no figures yet'}" for cam, doc in cams]

    def summary(self) -> dict[str, Any]:
        """What a rollout's state file keeps: the state, the totals' figures, each camera's, the reasons."""
        keep = {k: self.totals[k] for k in SUMMARY_KEYS if k in self.totals}
        cams = {cam: {k: doc[k] for k in SUMMARY_KEYS if k in doc} for cam, doc in self.per_camera.items()}
        return {"state": self.state, "totals": keep, "per_camera": cams, "reasons": list(self.reasons)}


def summary_text(summary: dict[str, Any]) -> str:
    """A state file's `summary` in words (what a resumed rollout's report shows of an earlier run)."""
    view = ShadowView(
        state=str(summary.get("state") or ""),
        totals=dict(summary.get("totals") or {}),
        reasons=[str(r) for r in summary.get("reasons") or []],
    )
    return view.line()
