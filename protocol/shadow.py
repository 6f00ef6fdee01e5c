"""Shadow evaluation on the wire: what an offer asks for (`ShadowAsk`), the thresholds' grammar
(`parse_promote_if`), and the report a device publishes while it shadows (`report_doc`, ``edged.shadow/1``).

    pusher ── cmd/ota {transfer, manifest, sig, shadow: {sample_fps, promote_if, min_*, max_s}} ──> device
    device ── …/shadow (retained, QoS 1) edged.shadow/1 {state: running|passed|failed|no_evidence, …} ──>
    device ── …/ota/status {state: shadowing, detail: {shadow: <the report's totals>}} ──> pusher
              … then ``probation`` (the candidate passed: the normal swap) or ``rejected`` (code
              ``model_rejected``, or ``no_evidence`` when the scene gave too little to judge on)

Thresholds name a figure of the report's totals and a bound: ``agreement>=0.95`` (a floor) or
``latency<=1.5`` (a ceiling). The figures:

    agreement   matched / max(serving detections, candidate detections)   (1.0 when both are empty: vacuous)
    recall      matched / serving detections      (the candidate finds what the serving model finds)
    precision   matched / candidate detections    (what the candidate finds, the serving model finds too)
    latency     candidate cost per image / serving cost per image (the ratio, 1.0 = as fast)
    score_shift the mean |candidate score - serving score| of matched pairs

A matched pair is one serving and one candidate detection of the same label whose boxes overlap by at least
the report's IoU (0.5), paired greedily by IoU.

The verdict (`judgement`), once the ask's evidence is in: ``failed`` when a figure is out of its bound;
``no_evidence`` when neither model detected anything (agreement 1.0 on nothing proves nothing), or when a
threshold's figure is undefined and none failed (``recall`` with no serving detection); ``passed`` only when
every threshold has its figure, in bounds. An ask needs at least one detection (``min_detections >= 1``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .schemas import SHADOW_SCHEMA

# figure -> ("ge" a floor | "le" a ceiling): the only figures a threshold may name, and the only bound each takes
FIGURES: dict[str, Literal["ge", "le"]] = {
    "agreement": "ge",
    "recall": "ge",
    "precision": "ge",
    "latency": "le",
    "score_shift": "le",
}
DEFAULT_PROMOTE_IF: dict[str, float] = {"agreement": 0.95, "recall": 0.95, "precision": 0.95, "latency": 1.5}
MATCH_IOU = 0.5  # a candidate box matches a serving box of the same label from this IoU
MAX_SAMPLE_FPS = 30.0
STATES = ("running", "passed", "failed", "no_evidence")
_THRESHOLD = re.compile(r"^\s*([a-z_]+)\s*(>=|<=)\s*([0-9]*\.?[0-9]+)\s*$")


def parse_promote_if(text: str) -> dict[str, float]:
    """``"agreement>=0.95,recall>=0.98,latency<=1.2"`` -> ``{"agreement": 0.95, …}``. A ValueError names the
    part it cannot take: an unknown figure, the wrong bound for it (``latency>=``), a number out of range, a
    figure twice."""
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        m = _THRESHOLD.match(part)
        if m is None:
            raise ValueError(f"promote-if {part.strip()!r}: write FIGURE>=NUMBER or FIGURE<=NUMBER")
        name, op, number = m.group(1), m.group(2), float(m.group(3))
        out[name] = _checked(name, op, number, out)
    if not out:
        raise ValueError("promote-if: no threshold given")
    return out


def _checked(name: str, op: str, value: float, seen: dict[str, float]) -> float:
    want = FIGURES.get(name)
    if want is None:
        raise ValueError(f"promote-if {name!r}: not a figure; one of {', '.join(FIGURES)}")
    if name in seen:
        raise ValueError(f"promote-if {name!r} given twice")
    if op != {"ge": ">=", "le": "<="}[want]:
        raise ValueError(f"promote-if {name}{op}: {name} takes {'>=' if want == 'ge' else '<='} (a {_kind(want)})")
    if want == "ge" and not 0.0 <= value <= 1.0:
        raise ValueError(f"promote-if {name}>={value}: a share between 0 and 1")
    if want == "le" and value <= 0.0:
        raise ValueError(f"promote-if {name}<={value}: must be above 0")
    return value


def _kind(want: str) -> str:
    return "floor" if want == "ge" else "ceiling"


def promote_if_text(thresholds: dict[str, float]) -> str:
    """The thresholds as `parse_promote_if` reads them (what reports and logs show)."""
    return ",".join(f"{k}{'>=' if FIGURES[k] == 'ge' else '<='}{v:g}" for k, v in thresholds.items())


class ShadowAsk(BaseModel):
    """An offer's ``shadow`` field: evaluate the candidate on live frames before it serves.

    `sample_fps` frames per second per camera are run through the candidate (on frames the serving model
    inferred); the verdict comes once `min_frames` frames, `min_detections` detections (serving or candidate,
    the larger; at least 1) and `min_s` seconds are in; without that evidence by `max_s` the verdict is
    ``no_evidence`` (never a pass), as it is when the evidence holds no detection at all (`judgement`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sample_fps: float = Field(1.0, gt=0.0, le=MAX_SAMPLE_FPS)
    promote_if: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_PROMOTE_IF))
    min_frames: int = Field(100, ge=1)
    min_detections: int = Field(30, ge=1)  # 0 refused in words (`_some_detections`)
    min_s: float = Field(20.0, ge=0.0)
    max_s: float = Field(900.0, gt=0.0, le=7 * 86400.0)

    @field_validator("promote_if")
    @classmethod
    def _thresholds(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("promote_if: no threshold given")
        seen: dict[str, float] = {}
        for name, v in value.items():
            seen[name] = _checked(name, ">=" if FIGURES.get(name) == "ge" else "<=", float(v), seen)
        return seen

    @field_validator("min_detections", mode="before")
    @classmethod
    def _some_detections(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(
                f"{value} is under 1: a verdict needs detections (either model's); a scene where neither model "
                "detects anything gives no evidence"
            )
        return value

    @model_validator(mode="after")
    def _window(self) -> ShadowAsk:
        if self.min_s > self.max_s:
            raise ValueError(f"min_s {self.min_s:g} is over max_s {self.max_s:g}")
        return self

    def doc(self) -> dict[str, Any]:
        """The offer's ``shadow`` object."""
        return self.model_dump()


def verdict(totals: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """The thresholds whose figure the totals have and which it fails, one sentence each. A figure the totals
    lack (no serving detections for recall) fails nothing here: `judgement` makes it no evidence."""
    reasons = []
    for name, bound in thresholds.items():
        value = totals.get(_key(name))
        if value is None:
            continue
        if FIGURES[name] == "ge" and value < bound:
            reasons.append(f"{name} {value:.3f} < {bound:g}")
        elif FIGURES[name] == "le" and value > bound:
            reasons.append(f"{name} {value:.3f} > {bound:g}")
    return reasons


# why a figure has no value (`Tally.figures`): said in a no_evidence report's reasons
_UNDEFINED = {
    "agreement": "no frame evaluated",
    "recall": "the serving model detected nothing",
    "precision": "the candidate detected nothing",
    "latency": "no timing of both models",
    "score_shift": "no matched pair",
}


def judgement(totals: dict[str, Any], thresholds: dict[str, float]) -> tuple[str, list[str]]:
    """The verdict on a report's totals once the ask's evidence is in: ("failed", the bounds failed) when a
    figure is out of its bound; ("no_evidence", why) when neither model detected anything, or when a threshold's
    figure is undefined and none failed; ("passed", []) only when every threshold has its figure, in bounds."""
    if not totals.get("serving_detections") and not totals.get("candidate_detections"):
        frames = totals.get("frames", 0)
        return "no_evidence", [f"neither model detected anything in {frames} frames: no evidence either way"]
    failed = verdict(totals, thresholds)
    if failed:
        return "failed", failed
    missing = [f"{name}: no figure ({_UNDEFINED[name]})" for name in thresholds if totals.get(_key(name)) is None]
    if missing:
        return "no_evidence", missing
    return "passed", []


def _key(name: str) -> str:
    """A threshold's figure as the totals name it."""
    return "latency_ratio" if name == "latency" else name


def report_doc(
    *,
    device: str,
    transfer: str,
    state: str,
    serving: tuple[str, int],
    candidate: tuple[str, int],
    started: float,
    totals: dict[str, Any],
    per_camera: dict[str, dict[str, Any]],
    memory_mb: Mapping[str, float | None],
    ask: ShadowAsk,
    evidence: dict[str, Any],
    reasons: list[str],
) -> dict[str, Any]:
    """An ``edged.shadow/1`` document for ``…/shadow`` (retained). `totals` and each of `per_camera` carry
    the figures (`Figures` of daemon/lifecycle/agreement.py as a dict); `evidence` what is in against what
    the ask needs; `reasons` why it failed or has no evidence (empty while running and when passed)."""
    if state not in STATES:
        raise ValueError(f"shadow state {state!r}; one of {', '.join(STATES)}")
    return {
        "schema": SHADOW_SCHEMA,
        "device": device,
        "transfer": transfer,
        "state": state,
        "ts": time.time(),
        "started": started,
        "serving": {"name": serving[0], "version": serving[1]},
        "candidate": {"name": candidate[0], "version": candidate[1]},
        "thresholds": dict(ask.promote_if),
        "sample_fps": ask.sample_fps,
        "evidence": evidence,
        "totals": totals,
        "per_camera": per_camera,
        "memory_mb": dict(memory_mb),
        "reasons": reasons,
    }
