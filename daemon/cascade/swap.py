"""A cascade stage's new version, pushed over the air while the daemon serves: checked, admitted, opened, flipped
in between two of the stage's batches, on probation, then committed or rolled back alone (the primary and the
other stages serve on throughout).

    offer with ``stage`` (protocol/ota.py) ──> `check_offer`: the stage is configured, from the store (its
        ``model.name`` is the package's name), and the package can serve it (its decoder's type is the serving
        one's): else refused at the offer, naming the stage and the package
    downloaded and verified as the primary's is (lifecycle/ota/), adopted by the store under its own name
    ──> `install`: admitted on what is in use now (the primary and every stage loaded: the process's resident
        memory) plus the candidate's estimate, as the old version stays loaded during probation (both counted;
        refused with every figure: over_budget) ──> opened and checked as at start (loader.open_checked) ──>
        the store's ``current`` for the name moves (on probation) ──> `Stage.flip` between two batches: no
        result mixes two versions of a stage (`stage_versions` names the one)
    ──> probation (`check`, each tick of the main loop): the stage's failed batches, its median cost per crop
        against the replaced version's, and how often it says something of a crop (text, a label at or over the
        stage's ``score_threshold``, a box) against the replaced version's newest crops on the same stream; the
        window and ratios are the stage's own ``model.probation_*`` (lifecycle/probation.py `judge`, as the
        primary's)
    ──> pass: committed in the store (a restart serves it), the old version closed; fail: flipped back to the
        old version (still loaded), the candidate closed and marked bad, the store rolled back. Either way an
        event (``stage_committed`` / ``stage_rolled_back``) and the transfer's ``…/ota/status`` (``probation`` with
        ``detail.committed``, or ``rejected`` with ``probation_failed``), naming the stage, with the figures.

One stage version on probation per stage at a time: another offer for it meanwhile is refused (busy).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edged.errors import Code, EdgedError, EngineLoadError, SwapError
from edged.models.package import Manifest, Package
from edged.models.store import RecordedOutput, Store
from edged.protocol.ota import ModelRef, OtaState

from ..config import Config
from ..inference import OutputFigures
from ..lifecycle.admission import estimate_mb
from ..lifecycle.probation import Judged, judge
from .loader import buffers_mb, open_checked, stage_config
from .pipeline import Cascade
from .runner import Stage, StageModel

logger = logging.getLogger(__name__)

# the version's own fault: marked bad, never retried (as lifecycle/manager.py MODEL_FAULTS)
STAGE_FAULTS = frozenset({Code.GOLDEN_MISMATCH, Code.GOLDEN_INVALID, Code.MODEL_LOAD_FAILED, Code.DECODER_MISMATCH})

Status = Callable[..., None]  # OtaReceiver.status(transfer, state, model=, error=, detail=)


@dataclass
class StageProbation:
    stage: str
    new: StageModel
    old: StageModel | None  # still loaded: what a rollback flips back to (None after a restart: loaded then)
    since_mono: float
    baseline_ms: float | None  # the old version's median cost per crop
    before: OutputFigures | None  # the old version's newest crops
    transfer: str | None


class StageSwaps:
    """Stage versions pushed while serving, and their probations. `install` runs on the OTA thread; `check` on
    the main loop (a rollback's flip waits for a batch boundary, so it runs on this object's own thread)."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        cascade: Cascade,
        event: Callable[[dict[str, Any]], None],
        status: Status | None,
        rss_mb: Callable[[], float],
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.cascade = cascade
        self._event = event
        self._status = status
        self._rss_mb = rss_mb
        self._lock = threading.Lock()
        self.probations: dict[str, StageProbation] = {}
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-swap")
        for s in cascade.stages:  # a probation a stop interrupted goes on, against what was recorded of `previous`
            name = s.cfg.model.name
            prev = None if name is None else store.pointer(name, "previous")
            if name is None or prev is None:
                continue  # not from the store, or its first version (installed: nothing to judge it against)
            if store.state(name).pending == s.model.version:
                rec = store.recorded_output(name, prev)
                before = None if rec is None else OutputFigures(rec.rows, rec.detections, 0.0)
                baseline = None if rec is None else rec.median_batch_ms
                logger.info("stage %s: %s on probation since before the start (against %s@%d: %s)", s.cfg.name,
                            s.model.ref, name, prev, "recorded" if rec else "nothing recorded")  # fmt: skip
                self.probations[s.cfg.name] = StageProbation(
                    s.cfg.name, s.model, None, time.monotonic(), baseline, before, None
                )

    # ---- the offer ---------------------------------------------------------------------------
    def check_offer(self, stage: str, m: Manifest) -> None:
        """Refuse (SwapError) a stage offer this daemon cannot take, naming the stage and the package."""
        ref = f"{m.name}@{m.version}"
        names = [s.cfg.name for s in self.cascade.stages]
        if stage not in names:
            raise SwapError(
                f"stage {stage!r} is not configured here (stages: {', '.join(names) or 'none'}): {ref} refused",
                code=Code.OTHER_MODEL,
            )
        s = self.cascade.stage(stage)
        store_name = s.cfg.model.name
        if store_name is None:
            raise SwapError(
                f"stage {stage!r} runs stages[].model.package, not the store (stages[].model.name): {ref} has nowhere "
                "to be installed",
                code=Code.NOT_SUPPORTED,
            )
        if m.name != store_name:
            raise SwapError(
                f"{ref} is not the model stage {stage!r} serves ({store_name}@{s.model.version})",
                code=Code.OTHER_MODEL,
            )
        serving = s.model.decoder_type
        if serving and m.decoder.type != serving:
            raise SwapError(
                f"{ref} (decoder {m.decoder.type}) cannot serve stage {stage!r}, whose {s.model.ref} reads crops with "
                f"decoder {serving}",
                code=Code.DECODER_MISMATCH,
            )
        if stage in self.probations:
            raise SwapError(f"stage {stage!r}: {self.probations[stage].new.ref} is on probation", code=Code.BUSY)

    # ---- the swap (the OTA thread) -----------------------------------------------------------
    def install(self, pkg: Package, stage: str, transfer: str | None = None) -> dict[str, Any]:
        """The verified staged package (`Store.adopt`) admitted, opened, activated and flipped in as `stage`'s
        model, on probation. Raises EdgedError when refused, after reporting it (event)."""
        m = pkg.manifest
        with self._lock:
            checked = False
            try:
                self.check_offer(stage, m)
                checked = True  # from here a model fault is the version's own: marked bad
                return self._install(pkg, self.cascade.stage(stage), transfer)
            except EdgedError as exc:
                if checked and exc.code in STAGE_FAULTS:
                    self.store.mark_bad(m.name, m.version)
                if not pkg.root.is_relative_to(self.store.root):
                    shutil.rmtree(pkg.root, ignore_errors=True)  # never activated: its staged copy goes now
                self._outcome("model_rejected", stage, pkg.ref, code=exc.code, error=str(exc), transfer=transfer)
                raise

    def _install(self, pkg: Package, s: Stage, transfer: str | None) -> dict[str, Any]:
        m, name = pkg.manifest, s.cfg.name
        old = s.model
        in_use = self._rss_mb()
        est = estimate_mb(pkg) + buffers_mb(pkg)
        self._admit(name, pkg.ref, old.ref, est, in_use)
        backend, decoder, said = open_checked(stage_config(self.cfg, s.cfg), pkg)
        try:
            loaded = max(est, backend.memory_bytes / 2**20 + buffers_mb(pkg))
            self._admit(name, pkg.ref, old.ref, loaded, in_use)
        except EdgedError:
            backend.close()
            raise
        new = StageModel(backend, decoder, m.input, m.name, m.version, m.decoder.type)
        baseline = old.crop_ms.percentiles((50,)).get("p50")
        before = old.recent_output(s.cfg.model.probation_output_frames)
        self._record(old, before, baseline)  # the baseline, kept should this probation span a restart
        try:
            self.store.activate(m.name, m.version, pkg.root, baseline)
            replaced = s.flip(new)
        except BaseException:
            backend.close()
            raise
        self.probations[name] = StageProbation(name, new, replaced, time.monotonic(), baseline, before, transfer)
        budget = self.cfg.memory.budget_mb
        memory = {"candidate_mb": round(loaded, 1), "in_use_mb": round(in_use, 1), "budget_mb": budget}
        logger.info(
            "stage %s: %s flipped in over %s, on probation (%s)%s", name, new.ref, replaced.ref, memory,
            "; " + "; ".join(said) if said else "",
        )  # fmt: skip
        self._outcome("stage_activated", name, new.ref, previous=replaced.version, transfer=transfer, memory=memory)
        return {"stage": name, "model": {"name": m.name, "version": m.version}, "previous": replaced.version,
                "mode": "side_by_side", "memory": memory}  # fmt: skip

    def _record(self, old: StageModel, before: OutputFigures, cost_ms: float | None) -> None:
        """The replaced version's output (crops, and crops it said something of) and median cost per crop, in the
        store's output.json: what a probation that spans a restart is judged against. A failed write costs that
        probation its baseline, never the swap."""
        if not before.rows:
            return
        rec = RecordedOutput(before.rows, before.detections, 0.0, None if cost_ms is None else round(cost_ms, 3),
                             round(time.time(), 1))  # fmt: skip
        try:
            self.store.record_output(old.name, old.version, rec)
        except EdgedError as exc:
            logger.warning("stage: could not record the output of %s: %s", old.ref, exc)

    def _admit(self, stage: str, ref: str, serving: str, stage_mb: float, in_use_mb: float) -> None:
        budget = self.cfg.memory.budget_mb
        need = in_use_mb + stage_mb
        if need > budget:
            raise EngineLoadError(
                f"stage {stage!r}: {ref} does not fit the memory budget: {stage_mb:.1f} MB (weights, I/O, activations "
                f"and crop buffers) on top of {in_use_mb:.1f} MB in use (the primary and every stage loaded, {serving} "
                f"kept loaded during probation) = {need:.1f} MB, over memory.budget_mb {budget:.0f} MB",
                code=Code.OVER_BUDGET,
            )

    # ---- probation (the main loop) -----------------------------------------------------------
    def check(self, now: float) -> None:
        """Each stage on probation: committed, rolled back (on this object's thread), or left to run."""
        for name, p in list(self.probations.items()):
            mcfg = self.cascade.stage(name).cfg.model
            figures = self.figures(p)
            j = Judged(p.new.errors, p.new.batches, figures["cost_per_crop_ms"] or 0.0, p.new.backend.cpu_bound,
                       p.new.recent_output(mcfg.probation_output_frames), "cost per crop", crops_said)  # fmt: skip
            verdict = judge(j, p.baseline_ms, p.before, mcfg)
            if verdict:
                del self.probations[name]
                self._jobs.submit(self._rollback, p, verdict, figures)
            elif (
                now - p.since_mono >= mcfg.probation_s
                and p.new.batches >= mcfg.probation_batches
                and (p.before is None or not mcfg.probation_output_ratio or p.new.crops >= mcfg.probation_output_frames)
            ):  # with a baseline, not before its output was judged on a full window of crops
                del self.probations[name]
                self._jobs.submit(self._commit, p, figures)

    def figures(self, p: StageProbation) -> dict[str, Any]:
        frames = self.cascade.stage(p.stage).cfg.model.probation_output_frames
        after = p.new.recent_output(frames)
        before = p.before or OutputFigures(0, 0, 0.0)
        cost = p.new.crop_ms.percentiles((50,)).get("p50")
        return {
            "batches": p.new.batches,
            "crops": p.new.crops,
            "errors": p.new.errors,
            "cost_per_crop_ms": None if cost is None else round(cost, 3),
            "baseline_cost_per_crop_ms": None if p.baseline_ms is None else round(p.baseline_ms, 3),
            "said_ratio": round(after.rate, 3),  # crops it said something of, of its newest crops
            "said_crops": after.rows,
            "baseline_said_ratio": round(before.rate, 3),
            "baseline_said_crops": before.rows,
        }

    def _commit(self, p: StageProbation, figures: dict[str, Any]) -> None:
        with self._lock:
            name = p.new.name
            if self.store.state(name).pending == p.new.version:
                self.store.commit(name)
            if p.old is not None:
                p.old.backend.close()
            logger.info("stage %s: %s passed probation: committed (%s)", p.stage, p.new.ref, figures)
            self._outcome("stage_committed", p.stage, p.new.ref, figures=figures, transfer=p.transfer)
            if self._status is not None and p.transfer is not None:
                detail = {"stage": p.stage, "committed": True, "figures": figures}
                self._status(p.transfer, OtaState.PROBATION, model=_ref(p.new), detail=detail)

    def _rollback(self, p: StageProbation, verdict: str, figures: dict[str, Any]) -> None:
        """The old version flipped back in (it stayed loaded), the candidate closed, the store rolled back (the
        candidate marked bad). The primary never stops: only this stage's thread waits for its batch boundary."""
        with self._lock:
            s = self.cascade.stage(p.stage)
            reason = f"stage {p.stage!r}: {p.new.ref} failed probation: {verdict}"
            try:
                old = p.old or self._open_previous(s, p.new.name)
                s.flip(old)
            except EdgedError:
                logger.exception("stage %s: the rollback of %s could not flip", p.stage, p.new.ref)
                raise
            p.new.backend.close()
            try:
                self.store.rollback(p.new.name, verdict)
            except EdgedError as exc:  # the old version serves; the store could not follow (no previous)
                logger.error("stage %s: store rollback of %s refused: %s", p.stage, p.new.ref, exc)
                self.store.mark_bad(p.new.name, p.new.version)
            logger.warning("%s; %s serves again (%s)", reason, old.ref, figures)
            self._outcome("stage_rolled_back", p.stage, p.new.ref, to=old.version, reason=verdict,
                          code=Code.PROBATION_FAILED, figures=figures, transfer=p.transfer)  # fmt: skip
            if self._status is not None and p.transfer is not None:
                err = SwapError(reason, code=Code.PROBATION_FAILED)
                detail = {"stage": p.stage, "rolled_back_to": old.version, "figures": figures}
                self._status(p.transfer, OtaState.REJECTED, model=_ref(p.new), error=err, detail=detail)

    def _open_previous(self, s: Stage, name: str) -> StageModel:
        """The store's `previous` of a stage, opened and checked (a probation that spans a restart)."""
        pkg = self.store.previous(name)
        backend, decoder, _ = open_checked(stage_config(self.cfg, s.cfg), pkg)
        m = pkg.manifest
        return StageModel(backend, decoder, m.input, m.name, m.version, m.decoder.type)

    def state(self) -> dict[str, Any]:
        """Per stage: the version serving, and the probation when one runs (telemetry, the model state)."""
        out: dict[str, Any] = {}
        for s in self.cascade.stages:
            p = self.probations.get(s.cfg.name)
            out[s.cfg.name] = {"model": s.model.ref, "probation": None if p is None else self.figures(p)}
        return out

    def close(self) -> None:
        """At the stop: the jobs finished, and each stage's serving version's output recorded in the store (what a
        version installed while the daemon is stopped is judged against at the next start)."""
        self._jobs.shutdown(wait=True, cancel_futures=True)
        for s in self.cascade.stages:
            name, m = s.cfg.model.name, s.model
            if name is None or s.cfg.name in self.probations:
                continue  # not from the store, or not judged yet: the record of the version before it stands
            fig = m.recent_output(s.cfg.model.probation_output_frames)
            kept = self.store.recorded_output(name, m.version)
            if kept is not None and kept.rows > fig.rows:  # a short run: the fuller record stays
                continue
            self._record(m, fig, m.crop_ms.percentiles((50,)).get("p50"))

    def _outcome(self, kind: str, stage: str, ref: str, **fields: Any) -> None:
        name, _, version = ref.rpartition("@")
        doc = {"type": kind, "stage": stage, "model": {"name": name, "version": int(version)}, **fields}
        self._event({k: v for k, v in doc.items() if v is not None})


def crops_said(f: OutputFigures) -> str:
    """A stage's output figures in words (`StageModel.recent_output`: crops, and crops it said something of)."""
    return f"{f.rate:.2f} of {f.rows} crops with an output"


def _ref(m: StageModel) -> ModelRef:
    return ModelRef(m.name, m.version)


def stage_swaps(
    cfg: Config,
    store: Store | None,
    cascade: Cascade | None,
    event: Callable[[dict[str, Any]], None],
    status: Status | None,
    rss_mb: Callable[[], float],
) -> StageSwaps | None:
    """What app.py hands the model manager: None without a cascade or a model store (nothing to push into)."""
    if cascade is None or store is None:
        return None
    return StageSwaps(cfg, store, cascade, event, status, rss_mb)
