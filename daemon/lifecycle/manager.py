"""Model swaps in the running daemon, and the probation that follows them (DESIGN §5).

    verified stage ──> admit (governor.plan_swap) ──> load + warm up + golden check ──> store.activate
        ──> flip between two batches ──> close the old model ──> probation ──> commit | roll back

Side by side when both models fit the memory budget: the new one loads and warms up while the old
one keeps serving, and the inference loop takes it between two batches. Stop-the-world otherwise:
the loop is held, the old model closed, the new one loaded; if that fails the old one is loaded
again from the store. A candidate that fails to load, or its golden check, is never activated and
its version is marked bad.

Probation (the version the store has pending): it is rolled back, and marked bad, at its first
inference or decoding error, when its median batch time exceeds the replaced version's by
`model.probation_latency_ratio`, when its output collapses or explodes next to the replaced version's
(in memory at a swap; after a restart as the store recorded it: probation.py's OutputRecorder), or when
the daemon crashed more than `model.probation_max_crashes` times while judging it (counted across
restarts in state.json). It is committed after
`model.probation_s` seconds and `model.probation_batches` batches. Outcomes go to ``…/events`` and
the retained ``…/model/state``.

An offer with ``shadow`` (`shadow_staged`) first loads the candidate beside the serving model, both within the
memory budget (else refused: over_budget), and evaluates it on sampled live frames (shadow.py); it passes into
the swap above (the loaded candidate reused), or is discarded: ``model_rejected`` (marked bad) or
``no_evidence`` (files dropped, not marked: the scene, not the model, fell short).

Crash-test seam: ``EDGEDTEST_CRASH_AT=swap_loaded|swap_flipped`` SIGKILLs the daemon at that step
(the store's own steps are in store.py).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from edged.errors import Code, EdgedError, SwapError
from edged.models.package import Manifest, Package
from edged.models.store import Store
from edged.models.store.files import crash_at_env_step
from edged.protocol.ota import ModelRef
from edged.protocol.schemas import MODEL_STATE_SCHEMA
from edged.protocol.shadow import ShadowAsk

from ..backends import Backend
from ..config import Config
from ..decoders import build_decoder
from ..host.governor import plan_swap
from ..inference import ActiveModel, InferenceLoop, warm_up

# the checks before a model serves, and probation's verdicts, live in their own modules; re-exported:
# `from edged.daemon.lifecycle.manager import check_io, estimate_mb, output_verdict`
from .admission import activation_mb as activation_mb
from .admission import batches_check as batches_check
from .admission import check_io as check_io
from .admission import estimate_mb as estimate_mb
from .admission import golden_check as golden_check
from .admission import shadow_fits
from .probation import LATENCY_MIN_BATCHES as LATENCY_MIN_BATCHES
from .probation import MIN_BASELINE_DETECTIONS as MIN_BASELINE_DETECTIONS
from .probation import OutputRecorder, probation_from_store, probation_verdict
from .probation import Probation as Probation
from .probation import output_verdict as output_verdict
from .shadow import Reporting, ShadowRunner, Verdicts

logger = logging.getLogger(__name__)

# a refusal that is the model's own fault: the version is marked bad and never retried
MODEL_FAULTS = frozenset({Code.GOLDEN_MISMATCH, Code.GOLDEN_INVALID, Code.MODEL_LOAD_FAILED, Code.DECODER_MISMATCH})

SWAP_STEPS = ("swap_loaded", "swap_flipped")


class StageInstaller(Protocol):
    """A cascade's stage versions pushed while serving (daemon/cascade/swap.py `StageSwaps`), set by app.py."""

    def check_offer(self, stage: str, m: Manifest) -> None: ...

    def install(self, pkg: Package, stage: str, transfer: str | None = None) -> dict[str, Any]: ...

    def check(self, now: float) -> None: ...

    def close(self) -> None: ...


class ModelManager:
    """Owns which model serves: swaps, rollbacks and the probation verdict. One swap at a time."""

    def __init__(
        self,
        cfg: Config,
        store: Store | None,
        loop: InferenceLoop,
        package: Package,
        boot_id: str,
        open_backend: Callable[[Package], Backend],
        event: Callable[[dict[str, Any]], None],
        publish_state: Callable[[dict[str, Any]], None],
        rss_mb: Callable[[], float],
        restart: Callable[[str], None] | None = None,
        publish_shadow: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`restart`: stop the daemon for systemd to start it again (a rollback that cannot be done live);
        `publish_shadow`: the retained shadow report (…/shadow)."""
        self.cfg = cfg
        self.store = store
        self.loop = loop
        self.package = package
        self.boot_id = boot_id
        self._open_backend = open_backend
        self._event = event
        self._publish_state = publish_state
        self._rss_mb = rss_mb
        self._restart = restart
        self._publish_shadow = publish_shadow
        self.labels: Any | None = None  # daemon/record/labelling.py LabelFrames: a shadow's disagreeing frames
        self.shadow: ShadowRunner | None = None  # the candidate being evaluated, while one is
        self.shadow_verdicts = Verdicts()  # how shadow evaluations ended, for /metrics (edged_shadow_verdicts_total)
        self.stage_swaps: StageInstaller | None = None  # a cascade's stages, pushed one by one (cascade/swap.py)
        self._lock = threading.Lock()
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swap")
        self.probation: Probation | None = None
        self.last: dict[str, Any] = {}  # the last swap outcome, for …/model/state
        self.swaps = 0
        self.last_gap_ms = 0.0
        self.recorder = OutputRecorder(store, cfg.model.probation_output_frames)
        m = package.manifest
        if store is not None and store.state(m.name).pending == m.version:
            self.probation = probation_from_store(store, m.name, m.version)

    @property
    def active(self) -> ActiveModel:
        a = self.loop.active
        if a is None:
            raise SwapError("no model: a stop-the-world swap is in progress")
        return a

    # ---- loading ---------------------------------------------------------------------------
    def open_candidate(self, pkg: Package, same_input: bool = True) -> ActiveModel:
        """Load, check I/O, build the decoder, warm up and run the golden check; close it on any failure.
        `same_input`: refuse a package that takes another input than the serving one (a shadowed candidate
        preprocesses its own frames: it may differ, and is checked again before it swaps in)."""
        if same_input:
            self._same_input(pkg)
        backend = self._open_backend(pkg)
        try:
            check_io(pkg, backend)
            shapes = {o.name: o.shape for o in backend.outputs}
            m = pkg.manifest
            decoder = build_decoder(m.decoder, m.input, m.labels, shapes)
            warm_up(backend, m.input, max(1, self.cfg.inference.warmup_batches))
            for checked in (golden_check(pkg, backend), batches_check(pkg, backend)):
                if checked:
                    logger.info("%s: %s", pkg.ref, checked)
        except BaseException:
            backend.close()
            raise
        return ActiveModel(backend, decoder, m.name, m.version)

    def _same_input(self, pkg: Package) -> None:
        cur = self.package.manifest.input
        if pkg.manifest.input != cur:
            raise SwapError(
                f"{pkg.ref} changes the input spec (shape {pkg.manifest.input.shape}, layout "
                f"{pkg.manifest.input.layout}; running: shape {cur.shape}, layout {cur.layout}). The cameras' "
                "buffers are sized for the running one, so this version applies at the next start: "
                "`edged model install` it and restart the daemon",
                code=Code.INPUT_CHANGED,
            )

    # ---- a cascade's stages (an offer with `stage`) -----------------------------------------
    def check_stage(self, stage: str, m: Manifest) -> StageInstaller:
        """At the offer: refuse (SwapError) a stage package this daemon cannot take, naming stage and package."""
        swaps = self.stage_swaps
        if swaps is None:
            raise SwapError(
                f"{m.name}@{m.version} is offered for stage {stage!r}, but this daemon runs no cascade from its model "
                "store (stages: with model.name)",
                code=Code.NOT_SUPPORTED,
            )
        swaps.check_offer(stage, m)
        return swaps

    def install_stage(self, pkg: Package, stage: str, transfer: str | None = None) -> dict[str, Any]:
        """The verified staged package swapped in as `stage`'s model, on probation of its own (cascade/swap.py)."""
        return self.check_stage(stage, pkg.manifest).install(pkg, stage, transfer)

    # ---- swaps -----------------------------------------------------------------------------
    def install_staged(
        self, pkg: Package, transfer: str | None = None, loaded: ActiveModel | None = None
    ) -> dict[str, Any]:
        """A verified staged package (`Store.stage`, or `Store.adopt` for an OTA download) becomes the serving
        model, on probation; the store renames its folder in. Nothing is hashed or parsed again here.
        `loaded`: the package already loaded and warmed up (a shadowed candidate that passed): swapped in side
        by side as it is (closed when refused)."""
        if self.store is None:
            raise SwapError("this daemon runs model.package, not the store (model.name): nothing to install into")
        with self._lock:
            stage = pkg.root
            m = pkg.manifest
            if m.name != self.package.manifest.name:
                raise SwapError(
                    f"{pkg.ref} is not the model this daemon serves ({self.package.manifest.name})",
                    code=Code.OTHER_MODEL,
                )
            try:
                mode, gap_ms = self._load_and_flip(pkg, stage, loaded)
            except EdgedError as exc:
                if loaded is not None and self.loop.active is not loaded:
                    loaded.backend.close()
                if exc.code in MODEL_FAULTS:
                    self.store.mark_bad(m.name, m.version)
                if not stage.is_relative_to(self.store.root):  # (a crash's leftover under versions/ stays)
                    shutil.rmtree(stage, ignore_errors=True)  # never activated: its staged copy goes now
                self._outcome("model_rejected", pkg.ref, code=exc.code, error=str(exc), transfer=transfer)
                raise
            return {"model": {"name": m.name, "version": m.version}, "mode": mode, "gap_ms": round(gap_ms, 1)}

    def _load_and_flip(self, pkg: Package, stage: Path, loaded: ActiveModel | None = None) -> tuple[str, float]:
        if self.store is None:
            raise SwapError(f"{pkg.ref}: this daemon has no model store to install into", code=Code.NOT_SUPPORTED)
        m = pkg.manifest
        old_pkg = self.package
        current = self.active
        baseline = current.cost_ms.percentiles((50,)).get("p50")
        before = current.recent_output(self.cfg.model.probation_output_frames)
        self.recorder.record(current)  # the baseline, kept should this probation span a restart
        if loaded is not None:
            self._same_input(pkg)
            mode: str = "side_by_side"  # both are loaded already
        else:
            mode = plan_swap(
                current.backend.memory_bytes / 2**20, estimate_mb(pkg), self._rss_mb(), self.cfg.memory.budget_mb
            )
        logger.info("swap %s -> %s: %s", old_pkg.ref, pkg.ref, mode.replace("_", "-"))
        t0 = time.monotonic()
        if mode == "side_by_side":
            new = loaded or self.open_candidate(pkg)  # the old model keeps serving meanwhile
            crash_at_env_step("swap_loaded")
            self.store.activate(m.name, m.version, stage, baseline)
            self._probation_start(m.name)
            t_flip = time.monotonic()
            old = self.loop.flip(new)
            gap_ms = (time.monotonic() - t_flip) * 1000.0
        else:
            old = self.loop.flip(None)  # held: no batch runs until the next flip
            if old is not None:
                old.backend.close()
            try:
                new = self.open_candidate(pkg)
            except BaseException:
                logger.error("swap to %s failed; loading %s again", pkg.ref, old_pkg.ref)
                self.loop.flip(self.open_candidate(old_pkg))
                raise
            crash_at_env_step("swap_loaded")
            self.store.activate(m.name, m.version, stage, baseline)
            self._probation_start(m.name)
            self.loop.flip(new)
            gap_ms = (time.monotonic() - t0) * 1000.0
        crash_at_env_step("swap_flipped")
        if mode == "side_by_side" and old is not None:
            old.backend.close()
        self.package = replace(pkg, root=self.store.root / m.name / "versions" / str(m.version))  # renamed in
        self.probation = Probation(m.version, time.monotonic(), baseline, 0, before)
        self.swaps += 1
        self.last_gap_ms = gap_ms
        self._outcome("model_activated", pkg.ref, previous=old_pkg.manifest.version, mode=mode)
        return mode, gap_ms

    # ---- shadow evaluation (an offer with `shadow`) ----------------------------------------
    def shadow_staged(
        self,
        pkg: Package,
        transfer: str,
        ask: ShadowAsk,
        progress: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
    ) -> dict[str, Any] | None:
        """The verified staged package loaded beside the serving model and evaluated on sampled live frames
        (shadow.py), then swapped in (`install_staged`, the loaded candidate reused) when its report passes.
        `progress(state, summary)` at every report. A failed report raises SwapError (model_rejected: the
        version is marked bad), no evidence by `max_s` SwapError (no_evidence: not marked); either way the
        candidate is closed and its staged files go. None when `stop` came first (the staged files stay: the
        transfer resumes, and the evaluation starts again, at the next start)."""
        if self.store is None:
            raise SwapError("this daemon runs model.package, not the store (model.name): nothing to install into")
        m, serving = pkg.manifest, self.active
        memory = {
            "serving": round(serving.backend.memory_bytes / 2**20, 1),
            "candidate": round(estimate_mb(pkg), 1),
            "budget": self.cfg.memory.budget_mb,
        }
        try:
            if m.name != self.package.manifest.name:
                raise SwapError(f"{pkg.ref} is not the model this daemon serves ({self.package.manifest.name})",
                                code=Code.OTHER_MODEL)  # fmt: skip
            shadow_fits(memory["serving"], memory["candidate"], self._rss_mb(), self.cfg.memory.budget_mb)
            candidate = self.open_candidate(pkg, same_input=False)
        except EdgedError as exc:
            self.shadow_verdicts.count("refused")
            self._shadow_refused(pkg, transfer, exc, mark_bad=exc.code in MODEL_FAULTS)
            raise
        memory["candidate"] = round(max(candidate.backend.memory_bytes / 2**20, memory["candidate"]), 1)
        runner = self.shadow = ShadowRunner(
            candidate, m.input, self.loop.cameras, ask, self.loop.opts, (serving.name, serving.version), self.labels
        )
        logger.info("shadow: %s beside %s at %g fps per camera", pkg.ref, serving.ref, ask.sample_fps)
        self.publish_state()  # the model state names the candidate while it is shadowed (edged fleet's column)
        try:
            report = Reporting(self.cfg.device_id, transfer, memory, self._publish_shadow, progress)
            state, reasons = runner.run(self.loop, stop, report)
        except BaseException:
            candidate.backend.close()
            raise
        finally:
            self.shadow = None
            self.publish_state()
        if state != "stopped":  # a stop cut it short: no verdict
            self.shadow_verdicts.count(state)
        if state == "passed":
            logger.info("shadow: %s passed: swapping it in", pkg.ref)
            return self.install_staged(pkg, transfer, loaded=candidate)
        candidate.backend.close()
        if state == "stopped":
            return None
        code = Code.MODEL_REJECTED if state == "failed" else Code.NO_EVIDENCE
        refused = SwapError(f"{pkg.ref} {state.replace('_', ' ')} in shadow: {'; '.join(reasons)}", code=code)
        self._shadow_refused(pkg, transfer, refused, mark_bad=state == "failed", figures=runner.figures()[0])
        raise refused

    def _shadow_refused(
        self, pkg: Package, transfer: str, exc: EdgedError, mark_bad: bool, figures: dict[str, Any] | None = None
    ) -> None:
        m = pkg.manifest
        if self.store is not None and mark_bad:
            self.store.mark_bad(m.name, m.version)
        if self.store is not None and not pkg.root.is_relative_to(self.store.root):
            shutil.rmtree(pkg.root, ignore_errors=True)  # never activated: its staged copy goes now
        logger.warning("shadow: %s", exc)
        self._outcome("model_rejected", pkg.ref, code=exc.code, error=str(exc), transfer=transfer, shadow=figures)

    def _probation_start(self, name: str) -> None:
        if self.store is None:
            raise SwapError(f"model {name}: no model store to record the probation in", code=Code.NOT_SUPPORTED)
        self.store.probation_run(name, self.boot_id)

    def apply_store_current(self) -> dict[str, Any] | None:
        """After `edged model install` (then a reload): serve the store's `current` if it is not what runs.
        A version that fails to load is rolled back in the store and marked bad."""
        if self.store is None:
            return None
        name = self.package.manifest.name
        with self._lock:
            cur = self.store.pointer(name, "current")
            if cur is None or cur == self.active.version:
                return None
            pkg = self.store.current(name)
            replaced = self.active
            before = replaced.recent_output(self.cfg.model.probation_output_frames)
            baseline_ms = replaced.cost_ms.percentiles((50,)).get("p50")
            try:
                new = self.open_candidate(pkg)
            except EdgedError as exc:
                self.store.rollback(name)
                self._outcome("model_rejected", pkg.ref, code=exc.code, error=str(exc))
                raise
            self._probation_start(name)
            old = self.loop.flip(new)
            if old is not None:
                old.backend.close()
            self.package = pkg
            self.recorder.record(old)
            st = self.store.state(name)  # on probation after an install; not after `edged model rollback`
            self.probation = None
            if st.pending == pkg.manifest.version:  # judged against the version it replaced, as a swap is
                baseline_ms = st.baseline_infer_ms or baseline_ms
                self.probation = Probation(pkg.manifest.version, time.monotonic(), baseline_ms, 0, before)
            self._outcome("model_activated", pkg.ref, previous=old.version if old else None, mode="reload")
            return {"model": {"name": name, "version": pkg.manifest.version}}

    def rollback(self, reason: str, code: Code | str = Code.ROLLED_BACK) -> dict[str, Any]:
        """Serve `previous` and roll the store back to it (marking the current version bad).

        The previous version is loaded and warmed up first, while the current one keeps serving; the store
        changes only once it serves, and a failed store write flips the current one back. So the store and
        what serves never disagree: a refused rollback (the previous version changes the input spec, does
        not load, ...) leaves both as they were, and says so on ``…/events`` (`model_rollback_failed`) and
        in ``…/model/state``. A probation verdict whose previous version takes another input stands: the
        store is rolled back and the daemon restarts (`restart`) to serve it. `code`: a `Code` member or its value."""
        code = Code(code)
        if self.store is None:
            raise SwapError("this daemon runs model.package, not the store: nothing to roll back to")
        name = self.package.manifest.name
        with self._lock:
            was = self.package.manifest.version
            try:
                prev = self.store.previous(name)
                if prev.manifest.input != self.package.manifest.input:
                    raise SwapError(
                        f"{prev.ref} takes another input (shape {prev.manifest.input.shape}, layout "
                        f"{prev.manifest.input.layout}; running: shape {self.package.manifest.input.shape}, layout "
                        f"{self.package.manifest.input.layout}): it cannot be swapped in live. Roll back with "
                        "`edged model rollback` and restart the daemon",
                        code=Code.INPUT_CHANGED,
                    )
                new = self.open_candidate(prev)
            except EdgedError as exc:
                return self._rollback_refused(name, was, reason, code, exc)
            old = self.loop.flip(new)
            try:
                was, now = self.store.rollback(name, reason)
            except EdgedError:
                self.loop.flip(old)  # the store did not change: neither does what serves
                new.backend.close()
                raise
            if old is not None:
                old.backend.close()
            self.package = prev
            self.probation = None
            logger.warning("model %s@%d rolled back to %d: %s", name, was, now, reason)
            self._outcome("model_rolled_back", f"{name}@{was}", to=now, reason=reason, code=code)
            return {"from": was, "to": now, "reason": reason}

    def _rollback_refused(self, name: str, was: int, reason: str, code: Code, exc: EdgedError) -> dict[str, Any]:
        """The previous version cannot serve now: refuse, nothing changes. Except for a probation verdict
        when the previous version only takes another input: the version on probation is still bad, so the
        store is rolled back and the daemon restarts to serve the previous one (its cameras sized for it)."""
        live_only = exc.code != Code.INPUT_CHANGED or code == Code.BY_COMMAND
        if live_only or self.store is None or self._restart is None:
            logger.error("model %s@%d: rollback refused, nothing changed: %s", name, was, exc)
            self._outcome("model_rollback_failed", f"{name}@{was}", code=exc.code, error=str(exc), reason=reason)
            raise exc
        _, now = self.store.rollback(name, reason)
        self.probation = None
        why = f"{name}@{was} rolled back to {now} ({reason}); {exc.code}: restarting to serve {now}"
        logger.error("model %s", why)
        self._outcome("model_rolled_back", f"{name}@{was}", to=now, reason=reason, code=code, restart=True)
        self._restart(why)
        return {"from": was, "to": now, "reason": reason, "restart": True}

    # ---- probation -------------------------------------------------------------------------
    def record_output(self, now: float) -> None:
        """Called by the main loop: the serving version's output into the store, at most once a minute."""
        self.recorder.tick(now, self.loop.active)

    def check_probation(self, now: float) -> None:
        """Called by the main loop: commit, start a rollback, or wait (the primary's, and each stage's)."""
        if self.stage_swaps is not None:
            self.stage_swaps.check(now)
        p = self.probation
        if p is None or self.store is None or self._lock.locked():
            return
        a = self.loop.active
        if a is None or a.version != p.version:
            return
        cfg = self.cfg.model
        verdict = probation_verdict(p, a, cfg)
        if verdict:
            self.probation = None
            self.submit(self.rollback, verdict, Code.PROBATION_FAILED)
            return
        if now - p.since_mono < cfg.probation_s or a.batches < cfg.probation_batches:
            return
        self.probation = None
        name = self.package.manifest.name
        if self.store.state(name).pending != p.version:  # installed over or rolled back meanwhile
            return
        self.store.commit(name)
        logger.info(
            "model %s passed probation (%d batches, %.0f s, no errors): committed",
            a.ref,
            a.batches,
            now - p.since_mono,
        )
        self._outcome("model_committed", a.ref)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run a swap off the caller's thread (the main loop must keep ticking the watchdog)."""

        def logged() -> Any:
            try:
                return fn(*args)
            except Exception:
                logger.exception("model swap job failed")
                raise

        return self._jobs.submit(logged)

    def close(self) -> None:
        self._jobs.shutdown(wait=True, cancel_futures=True)
        if self.stage_swaps is not None:
            self.stage_swaps.close()
        self.recorder.record(self.loop.active)  # the newest figures, for a probation after the restart
        if self.store is not None:  # a clean stop is not a crash: the marker goes, whatever probation's state
            self.store.probation_run(self.package.manifest.name, None)  # (a verdict whose rollback was refused)

    # ---- reporting -------------------------------------------------------------------------
    def rejected(self, ref: ModelRef | None, exc: EdgedError, transfer: str | None = None) -> None:
        """An offer or a download refused before any swap (verification, hashes): an event and model/state."""
        self._outcome(
            "model_rejected", None if ref is None else str(ref), code=exc.code, error=str(exc), transfer=transfer
        )

    def _outcome(self, kind: str, ref: str | None, **fields: Any) -> None:
        model = None  # a manifest that did not verify names nothing we can trust
        if ref is not None:
            name, _, version = ref.rpartition("@")
            model = {"name": name, "version": int(version)}
        doc = {"type": kind, "model": model, **fields}
        doc = {k: v for k, v in doc.items() if v is not None}
        self.last = {k: v for k, v in doc.items()}
        self._event(doc)
        self.publish_state()

    def state_doc(self) -> dict[str, Any]:
        m = self.package.manifest
        doc: dict[str, Any] = {"schema": MODEL_STATE_SCHEMA, "name": m.name, "active": m.version}
        if self.store is not None:
            st = self.store.state(m.name)
            doc.update(
                previous=self.store.pointer(m.name, "previous"),
                highest_accepted=st.highest_accepted,
                bad=sorted(st.bad),
                versions=self.store.versions(m.name),
            )
        p = self.probation
        a = self.loop.active
        if p is not None:
            doc["probation"] = {
                "version": p.version,
                "elapsed_s": round(time.monotonic() - p.since_mono, 1),
                "batches": a.batches if a is not None and a.version == p.version else 0,
                "needs_s": self.cfg.model.probation_s,
                "needs_batches": self.cfg.model.probation_batches,
                "baseline_infer_ms": p.baseline_ms,
            }
        else:
            doc["probation"] = None
        shadow = self.shadow
        doc["shadow"] = shadow.candidate.ref if shadow is not None else None  # the candidate being shadowed
        if self.last:
            doc["last"] = self.last
        return doc

    def publish_state(self) -> None:
        self._publish_state(self.state_doc())
