"""A candidate evaluated beside the serving model on the device's own live frames, before it serves (an
offer with ``shadow``: protocol/shadow.py; docs/models.md, "Shadow evaluation before a version serves").

    decode thread     serving batch decoded ──> `observe`: per camera at most `sample_fps` frames, the very
                      frame the serving model inferred (`Camera.frame_for(seq)`), preprocessed by the
                      candidate's own input spec (a wrong colour or mean in its manifest shows as disagreement)
                      into a bounded queue of samples (full: the oldest dropped, counted as skipped)
    inference thread  between two serving batches, only when none waits: `step` runs at most one candidate
                      batch (the bound on what shadowing holds a serving batch back: one candidate batch,
                      its wall time reported as `hold_ms`)
    decode thread     the candidate's outputs decoded with the serving model's decode options and held
                      against the serving model's detections of the same frame (lifecycle/agreement.py);
                      never a result, never published as one
    the OTA thread    `evaluate`: every REPORT_EVERY_S the report (``edged.shadow/1``, retained on …/shadow)
                      and the ota status ``shadowing``; the verdict once the ask's evidence is in (frames,
                      detections, seconds): ``passed`` or ``failed`` by its thresholds (`judgement`);
                      ``no_evidence`` when `max_s` passes first, or when the evidence holds no detection or
                      leaves a threshold's figure undefined (a dark or empty scene: never a pass, never a fail)

The frames where the two disagree go to the labelling store when one is given (daemon/record/labelling.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edged.models.package import InputSpec
from edged.protocol.shadow import ShadowAsk, judgement, report_doc

from ..backends.base import fixed_batches
from ..capture.camera import FrameMeta
from ..capture.preprocess import Preprocessor, Transform
from ..decoders import DecodeOptions, Detection
from ..inference import ActiveModel, Window, own_cost_ms
from .agreement import Tally

logger = logging.getLogger(__name__)

REPORT_EVERY_S = 2.0  # the report and the ota status while shadowing
PENDING_PER_BATCH = 2  # samples waiting for the candidate: this many candidate batches at most
# a device whose serving batches never leave a gap still evaluates: once a full candidate batch waits, or a sample
# has waited this long, the candidate takes one batch between two serving ones (its cost bounded by sample_fps)
MAX_SAMPLE_WAIT_S = 1.0


# how a shadow evaluation ended (`Verdicts`, /metrics' edged_shadow_verdicts_total{verdict=…}): the report's
# three verdicts, and ``refused`` when the candidate never shadowed (over_budget, another model, a load failure)
VERDICTS = ("passed", "failed", "no_evidence", "refused")


class Verdicts:
    """The shadow evaluations' outcomes since the daemon started, by verdict (`VERDICTS`); the model manager
    counts each (`count`), /metrics reads them (`counts`). An evaluation the daemon's stop cut short is none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(VERDICTS, 0)

    def count(self, verdict: str) -> None:
        if verdict not in self._counts:
            raise ValueError(f"shadow verdict {verdict!r}; one of {', '.join(VERDICTS)}")
        with self._lock:
            self._counts[verdict] += 1

    def counts(self) -> dict[str, int]:
        """Every verdict, 0 for those not given yet (so a scrape sees the series before the first one)."""
        with self._lock:
            return dict(self._counts)


class Frames(Protocol):
    """What the runner reads of a camera (`capture.camera.Camera`): the frames inference took, by seq."""

    keep_taken: bool

    @property
    def name(self) -> str: ...

    def frame_for(self, seq: int) -> np.ndarray | None: ...


@dataclass(frozen=True)
class Reporting:
    """Where a runner's report goes (`ShadowRunner.run`): the retained ``…/shadow`` document (`publish`) and the
    OTA transfer's ``shadowing`` status (`progress(state, summary)`, the summary without the label confusion)."""

    device: str
    transfer: str
    memory_mb: Mapping[str, float | None]
    publish: Callable[[dict[str, Any]], None] | None
    progress: Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class _Sample:
    camera: str
    meta: FrameMeta
    transform: Transform
    row: np.ndarray  # the frame preprocessed by the candidate's input spec
    serving: list[Detection]
    frame: np.ndarray | None  # kept only for the labelling store
    queued: float = 0.0  # monotonic time it was queued (`due`)


class ShadowRunner:
    """Feeds the candidate sampled frames and tallies how it agrees with the serving model. The inference loop
    calls `observe` and `step` (`InferenceLoop.shadow`, daemon/inference.py); `evaluate` judges."""

    def __init__(
        self,
        candidate: ActiveModel,
        spec: InputSpec,
        cameras: Sequence[Frames],
        ask: ShadowAsk,
        opts: DecodeOptions,
        serving: tuple[str, int],
        labels: Any | None = None,
    ) -> None:
        """`serving`: the (name, version) compared with (another model's batches, after a rollback, are not);
        `labels`: a daemon/record/labelling.py `LabelFrames` to hand the disagreeing frames to, or None."""
        self.candidate = candidate
        self.spec = spec
        self.cameras = {c.name: c for c in cameras}
        self.ask = ask
        self.opts = opts
        self.serving = serving
        self.labels = labels
        # a frame is sampled when this long has passed since the camera's last sample: 0.9 of the period, so a
        # camera at the sample rate, or a multiple of it, with jitter, gives every frame due (at most 1.11x)
        self._period_s = 0.9 / ask.sample_fps
        self._last: dict[str, float] = {}
        self._pre: dict[str, Preprocessor] = {}
        self._batches = fixed_batches(candidate.backend, spec.batch)
        self._buffer = np.zeros(spec.shape, dtype=np.dtype(spec.dtype))
        self._pending: deque[_Sample] = deque()
        self._lock = threading.Lock()
        self.tallies: dict[str, Tally] = {}
        self.hold_ms = Window(256)  # each candidate batch's wall time: what a serving batch may wait behind it
        self.skipped = 0  # sampled frames not run: gone from the camera, or dropped from a full queue
        self.batches = 0
        self.failure = ""  # the candidate's first failure (inference or decoding): fails the evaluation at once
        self.started_wall = time.time()
        self.started = time.monotonic()
        self._kept: dict[str, bool] = {}

    # ---- attached to the loop ---------------------------------------------------------------
    def attach(self, loop: Any) -> None:
        """Start: the cameras keep the frames inference took (`keep_taken`), the loop feeds this runner."""
        for name, cam in self.cameras.items():
            self._kept[name] = cam.keep_taken
            cam.keep_taken = True
        self.started, self.started_wall = time.monotonic(), time.time()
        loop.shadow = self

    def detach(self, loop: Any) -> None:
        if loop.shadow is self:
            loop.shadow = None
        for name, kept in self._kept.items():
            self.cameras[name].keep_taken = kept

    def observe(
        self, model: ActiveModel, rows: Sequence[tuple[str, FrameMeta]], dets: Sequence[list[Detection]], ms: float
    ) -> None:
        """Decode thread: the serving model's decoded batch; the frames due for a sample are preprocessed for the
        candidate and queued."""
        if (model.name, model.version) != self.serving:
            return
        for (camera, meta), found in zip(rows, dets, strict=True):
            with self._lock:  # the report reads the tallies from another thread
                self._tally(camera).serving_ms.append(ms)
            last = self._last.get(camera)
            if last is not None and meta.captured_mono - last < self._period_s:
                continue
            cam = self.cameras.get(camera)
            frame = cam.frame_for(meta.seq) if cam is not None else None
            if frame is None:
                self.skipped += 1
                continue
            self._last[camera] = meta.captured_mono
            pre = self._pre.get(camera)
            if pre is None:
                pre = self._pre[camera] = Preprocessor(self.spec)
            row = pre.new_row()
            transform = pre.run(frame, row)
            kept = None if self.labels is None else frame.copy()
            sample = _Sample(camera, meta, transform, row, list(found), kept, time.monotonic())
            with self._lock:
                if len(self._pending) >= PENDING_PER_BATCH * self.spec.batch:
                    self._pending.popleft()
                    self.skipped += 1
                self._pending.append(sample)

    def due(self, now: float) -> bool:
        """Inference thread: whether the candidate's turn comes even though serving batches wait (a full batch of
        samples waits, or the oldest has waited MAX_SAMPLE_WAIT_S)."""
        with self._lock:
            if not self._pending:
                return False
            return len(self._pending) >= self.spec.batch or now - self._pending[0].queued >= MAX_SAMPLE_WAIT_S

    def step(self) -> Callable[[], None] | None:
        """Inference thread: one candidate batch of the queued samples (None when none waits); the returned
        work decodes and compares it on the decode thread."""
        with self._lock:
            n = min(len(self._pending), self.spec.batch)
            if n == 0:
                return None
            samples = [self._pending.popleft() for _ in range(n)]
        size = next((b for b in self._batches if b >= n), self.spec.batch)
        for i, s in enumerate(samples):
            self._buffer[i] = s.row
        t0, th0 = time.perf_counter(), time.thread_time()
        try:
            outputs = self.candidate.backend.infer({self.spec.name: self._buffer[:size]})
        except Exception as exc:  # raised on to the loop, which counts and logs it
            self.failure = self.failure or f"a candidate batch failed: {type(exc).__name__}: {exc}"[:300]
            raise
        ms = (time.perf_counter() - t0) * 1000.0
        own_ms = own_cost_ms(self.candidate.backend, ms, th0)  # as the serving batches' are measured
        self.hold_ms.add(ms)
        self.batches += 1
        return lambda: self._compare(samples, outputs, own_ms / size)

    def _compare(self, samples: list[_Sample], outputs: dict[str, np.ndarray], per_image_ms: float) -> None:
        try:
            found = self.candidate.decoder.decode(outputs, [s.transform for s in samples], self.opts)
        except Exception as exc:  # raised on to the loop, which counts and logs it
            self.failure = self.failure or f"decoding a candidate batch failed: {type(exc).__name__}: {exc}"[:300]
            raise
        for s, cand in zip(samples, found, strict=True):
            with self._lock:
                tally = self._tally(s.camera)
                seen = tally.add(s.serving, cand)
                tally.candidate_ms.append(per_image_ms)
            if self.labels is not None and s.frame is not None and seen.disagreement > 0.0:
                self._label(s, cand, seen.disagreement)

    def _label(self, s: _Sample, cand: list[Detection], disagreement: float) -> None:
        """The frame and both models' detections to the labelling store's own thread (never written here, on
        the decode thread: a busy store drops it, counted there)."""
        from ..record.labelling import Offer

        if self.labels is None or s.frame is None:
            return
        serving_ref = f"{self.serving[0]}@{self.serving[1]}"
        ref = self.candidate.ref
        self.labels.submit(Offer(s.camera, s.frame, s.serving, cand, disagreement, "shadow", serving_ref, ref, s.meta))

    def _tally(self, camera: str) -> Tally:
        tally = self.tallies.get(camera)
        if tally is None:
            tally = self.tallies[camera] = Tally()
        return tally

    # ---- the report and the verdict ---------------------------------------------------------
    def figures(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """(totals, per camera) as the report carries them."""
        with self._lock:
            total = Tally()
            per_camera = {}
            for name, tally in sorted(self.tallies.items()):
                total.merge(tally)
                per_camera[name] = tally.figures()
            return total.figures(), per_camera

    def gauges(self) -> dict[str, float]:
        """For /metrics (``edged_shadow_<key>``): the totals' figures that are numbers now, the samples
        skipped, and the longest a serving batch waited behind a candidate batch, in seconds."""
        totals, _ = self.figures()
        keys = ("frames", "serving_detections", "candidate_detections", "matched", "agreement", "recall",
                "precision", "score_shift", "latency_ratio")  # fmt: skip
        out = {k: float(totals[k]) for k in keys if totals[k] is not None}
        out["skipped_frames"] = float(self.skipped)
        hold = self.hold_ms.percentiles((100,)).get("p100")
        if hold is not None:
            out["hold_seconds_max"] = hold / 1000.0
        return out

    def evidence(self, totals: dict[str, Any], now: float | None = None) -> tuple[dict[str, Any], bool]:
        """What is in against what the ask needs, and whether it is enough for a verdict."""
        ask = self.ask
        elapsed = (time.monotonic() if now is None else now) - self.started
        detections = max(totals["serving_detections"], totals["candidate_detections"])
        doc = {
            "frames": totals["frames"],
            "detections": detections,
            "elapsed_s": round(elapsed, 1),
            "min_frames": ask.min_frames,
            "min_detections": ask.min_detections,
            "min_s": ask.min_s,
            "max_s": ask.max_s,
            "skipped": self.skipped,
        }
        enough = totals["frames"] >= ask.min_frames and detections >= ask.min_detections and elapsed >= ask.min_s
        return doc, enough

    def judge(self, now: float | None = None) -> tuple[str, list[str], dict[str, Any], dict[str, Any]]:
        """(state, reasons, totals, per camera): running until the evidence is in (or max_s passed)."""
        totals, per_camera = self.figures()
        evidence, enough = self.evidence(totals, now)
        if self.failure:  # as probation rolls back at a first error: a candidate that fails is never promoted
            return "failed", [self.failure], totals, per_camera
        if enough:  # passed, failed, or no evidence after all (neither model saw anything; a figure undefined)
            state, reasons = judgement(totals, self.ask.promote_if)
            return state, reasons, totals, per_camera
        if evidence["elapsed_s"] >= self.ask.max_s:
            short = [
                f"{what} {have} of {need}"
                for what, have, need in (
                    ("frames", evidence["frames"], self.ask.min_frames),
                    ("detections", evidence["detections"], self.ask.min_detections),
                )
                if have < need
            ]
            why = f"too little evidence in {self.ask.max_s:g} s: {', '.join(short)}"
            return "no_evidence", [why], totals, per_camera
        return "running", [], totals, per_camera

    def report(
        self, device: str, transfer: str, state: str, reasons: list[str], memory_mb: Mapping[str, float | None]
    ) -> dict[str, Any]:
        totals, per_camera = self.figures()
        evidence, _ = self.evidence(totals)
        hold = self.hold_ms.percentiles((50, 100))
        doc = report_doc(
            device=device,
            transfer=transfer,
            state=state,
            serving=self.serving,
            candidate=(self.candidate.name, self.candidate.version),
            started=self.started_wall,
            totals=totals,
            per_camera=per_camera,
            memory_mb=memory_mb,
            ask=self.ask,
            evidence=evidence,
            reasons=reasons,
        )
        doc["hold_ms"] = {"p50": _r(hold.get("p50")), "max": _r(hold.get("p100")), "batches": self.batches}
        return doc

    def run(self, loop: Any, stop: threading.Event, to: Reporting) -> tuple[str, list[str]]:
        """Attached to `loop` until a verdict or `stop` (`evaluate`), reporting to `to`; detached after."""

        def publish(state: str, reasons: list[str]) -> None:
            doc = self.report(to.device, to.transfer, state, reasons, to.memory_mb)
            if to.publish is not None:
                to.publish(doc)
            keep = ("state", "evidence", "hold_ms", "reasons")
            totals = {k: v for k, v in doc["totals"].items() if k != "label_confusion"}
            to.progress(state, {"shadow": {**{k: doc[k] for k in keep}, "totals": totals}})

        self.attach(loop)
        try:
            return self.evaluate(stop, publish)
        finally:
            self.detach(loop)

    def evaluate(
        self,
        stop: threading.Event,
        publish: Callable[[str, list[str]], None],
        every_s: float = REPORT_EVERY_S,
    ) -> tuple[str, list[str]]:
        """Until a verdict (or `stop`: ("stopped", [])): `publish(state, reasons)` every `every_s` and at the
        verdict. Runs on the caller's thread (the OTA transfer's)."""
        while True:
            state, reasons, _, _ = self.judge()
            publish(state, reasons)
            if state != "running":
                return state, reasons
            if stop.wait(every_s):
                return "stopped", []


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
