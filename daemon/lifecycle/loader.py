"""The model a start serves: found, judged, opened and admitted, before anything else runs.

    model.package (a folder or .tar)  |  model.name: <state_dir>/models/<name>/current
        -> the probation marker, and the crashes it counts (a crash loop is rolled back here)
        -> admitted to the memory budget on its estimate -> backend opened (with model.build_on_device,
           a TensorRT engine built for this device first, cached) -> I/O checked, decoder built
        -> admitted again on what it takes once loaded
    the store's current version cannot be opened: rolled back to `previous` at once, and opened again

`ModelLoader.open` does this once at start; `open_package_backend` also opens every swap's candidate.
What was rolled back goes out as events once the publisher runs (`ModelLoader.events`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.errors import (
    BackendError,
    CaptureError,
    Code,
    ConfigError,
    DecoderError,
    EdgedError,
    EngineLoadError,
    PackageError,
    PublishError,
    StateDirError,
    StoppedBeforeStart,
    SwapError,
)
from edged.models.package import Package, open_package
from edged.models.store import Store
from edged.models.store.files import crash_at_env_step

from ..backends import Backend, open_backend, tensorrt_unavailable_reason
from ..backends.base import BatchSet
from ..config import Config
from ..decoders import Decoder, build_decoder
from ..host.governor import admit
from ..host.sensors import rss_mb
from ..host.systemd import notify
from .manager import batches_check, check_io, estimate_mb

logger = logging.getLogger(__name__)

# A start that fails with one of these was not the model's doing: a model on probation is not blamed.
NOT_THE_MODEL: tuple[type[BaseException], ...] = (
    ConfigError,
    StateDirError,
    CaptureError,
    PublishError,
    StoppedBeforeStart,
    KeyboardInterrupt,
)
# What verifying the store's `current` raises when its files are damaged on disk (it is rolled back).
CORRUPT_CODES = frozenset({"hash_mismatch", "size_mismatch", "file_missing", "not_a_package", "manifest_invalid"})


def resolve_package(cfg: Config) -> Package:
    """model.package (folder or tar), or model.name from the store: <state_dir>/models/<name>/current."""
    if cfg.model.package is not None:
        staging = cfg.state_dir / "staging"
        if cfg.model.package.is_file():
            staging.mkdir(parents=True, exist_ok=True)
        return open_package(cfg.model.package, scratch=staging)
    name = cfg.model.name
    if name is None:  # the config validator allows exactly one of the two; a Config built around it gets here
        raise ConfigError("model: set exactly one of model.package (a package folder or .tar) or model.name")
    current = cfg.state_dir / "models" / name / "current"
    if not current.exists():
        raise PackageError(f"model.name {name!r}: no {current} in the model store", code=Code.NOT_FOUND)
    return open_package(current)


def open_package_backend(cfg: Config, pkg: Package) -> Backend:
    """The package's backend, as the config asks: with model.build_on_device, an ONNX package runs on a
    TensorRT engine built here on first use (cached under <state_dir>/engines); else `open_backend`. A package
    with several fixed batches (extra_batches: ONNX models or TensorRT engines) opens one backend per batch, as
    one `BatchSet`; built on the device, one engine per batch."""
    m = pkg.manifest
    if cfg.model.build_on_device and m.kind == "onnx":
        return _build_on_device(cfg, pkg)
    if not m.extra_batches:
        return _open_file(cfg, pkg, pkg.model_path)
    opened: dict[int, Backend] = {}
    try:
        for b, path in pkg.batch_paths.items():
            opened[b] = _open_file(cfg, pkg, path)
    except Exception:
        for backend in opened.values():
            backend.close()
        raise
    return BatchSet(opened)


def _build_on_device(cfg: Config, pkg: Package) -> Backend:
    """model.build_on_device: a TensorRT engine per fixed batch of the ONNX package, built on first use."""
    reason = tensorrt_unavailable_reason()
    if reason:
        raise BackendError(f"model.build_on_device is set, but {reason}")
    from ..backends.tensorrt import cached_engines, open_engines

    def progress(msg: str) -> None:
        logger.info("%s", msg)
        notify("EXTEND_TIMEOUT_USEC=120000000")  # a build takes minutes; keep systemd's start timeout away

    m = pkg.manifest
    # none configured: the builder picks what the model is (its own precision on a strongly typed TensorRT)
    precision = cfg.model.build_precision
    notify("STATUS=building a TensorRT engine for this device (first start only)")
    engines, compatibility = cached_engines(
        pkg.batch_paths, m.input.name, tuple(m.input.shape), precision, cfg.state_dir / "engines", progress
    )
    return open_engines(engines, compatibility, has_onnx=True)


def _open_file(cfg: Config, pkg: Package, path: Path) -> Backend:
    m = pkg.manifest
    return open_backend(
        m.kind,
        path,
        cfg.model.backend,
        threads=cfg.model.onnxruntime.threads,
        providers=tuple(cfg.model.onnxruntime.providers),
        compatibility=m.compatibility,
        has_onnx="model.onnx" in m.files,
    )


@dataclass(frozen=True)
class Opened:
    """The model a start serves: its package, open backend and decoder."""

    package: Package
    backend: Backend
    decoder: Decoder


class ModelLoader:
    """Opens the model a start serves, judging a version on probation first; see the module docstring.

    `cfg`: the config the daemon started with (model.* and state_dir never change without a restart)."""

    def __init__(self, cfg: Config, boot_id: str) -> None:
        self.cfg = cfg
        self.boot_id = boot_id
        self.events: list[dict[str, Any]] = []  # rollbacks done at start, for the publisher once it runs
        self._store: Store | None = None
        self._marked: str | None = None  # the model whose probation marker this run wrote

    def open(self, store: Store | None, backend: Backend | None = None) -> Opened:
        """The configured model, opened and admitted. `store`: the model store when the config names a model
        (model.name), else None. `backend`: an already open backend for the package (benchmarks pass a
        stand-in); else one is opened."""
        self._store = store
        name = self.cfg.model.name
        if store is not None and name is not None:
            self._judge_crashes(store, name)
        try:
            return self._open(backend)
        except (EngineLoadError, DecoderError, PackageError) as exc:
            if not self._rollback_unloadable(exc):
                raise
            return self._open(None)

    def open_backend(self, pkg: Package) -> Backend:
        """A swap's candidate: its backend, as the config asks (`open_package_backend`)."""
        return open_package_backend(self.cfg, pkg)

    def start_failed(self, exc: BaseException) -> None:
        """A start ended in `exc`. The probation marker stays (a crash, at the next start) only when the model
        could have caused the failure; else it is cleared."""
        a_stage = isinstance(exc, EdgedError) and exc.stage is not None  # a second stage's package, not the primary
        if self._marked is None or self._store is None or not (isinstance(exc, NOT_THE_MODEL) or a_stage):
            return
        logger.warning(
            "start failed for a reason that is not the model's (%s); not counted against %s on probation",
            getattr(exc, "code", type(exc).__name__),
            self._marked,
        )
        try:
            self._store.probation_run(self._marked, None)
        except StateDirError as clear_exc:
            logger.error("could not clear the probation marker: %s", clear_exc)

    def _open(self, backend: Backend | None) -> Opened:
        """The configured package, its backend (unless given), its decoder, admitted to the memory budget."""
        cfg = self.cfg
        package = resolve_package(cfg)
        m = package.manifest
        if m.role == "stage":  # a classifier or text recogniser reads crops: it cannot be the primary
            raise ConfigError(
                f"model: {m.name}@{m.version} is a second-stage model (role: stage, decoder {m.decoder.type}): "
                "name a detector under model: and this package under stages: (docs/models.md, Cascades)"
            )
        in_use_mb = rss_mb()
        row_mb = int(np.prod(m.input.shape[1:])) * np.dtype(m.input.dtype).itemsize / 2**20
        buffers_mb = row_mb * (3 * len(cfg.cameras) + 2 * m.input.batch)  # camera slots, the loop's two batches
        model_mb = estimate_mb(package)  # every batch's weights, I/O and activations: refused before any loads
        admit(package.ref, model_mb, buffers_mb, in_use_mb, cfg.memory.budget_mb)
        backend = backend or open_package_backend(cfg, package)
        try:
            check_io(package, backend)
            try:  # a package an older edged rebatched wrongly never serves (on probation: rolled back, below)
                checked = batches_check(package, backend)
            except SwapError as exc:
                raise PackageError(str(exc), code=exc.code) from exc
            if checked:
                logger.info("%s: %s", package.ref, checked)
            shapes = {o.name: o.shape for o in backend.outputs}
            decoder = build_decoder(m.decoder, m.input, m.labels, shapes)
            loaded_mb = max(model_mb, backend.memory_bytes / 2**20)  # an engine's device memory, as loaded
            admit(package.ref, loaded_mb, buffers_mb, in_use_mb, cfg.memory.budget_mb)
        except Exception:
            backend.close()
            raise
        return Opened(package, backend, decoder)

    def _rollback_unloadable(self, exc: EdgedError) -> bool:
        """The store's current version cannot be opened: roll back to `previous` at once (no crash loop) and
        say so; False when that does not apply and the error stands. A current version whose files fail
        their sizes or hashes is rolled back whether or not it is on probation (`current_corrupt`: the
        intact previous serves rather than no model at all); one that verifies but does not load only while
        it is on probation (`load_failed`: a committed model has nothing older to blame)."""
        name = self.cfg.model.name
        store = self._store
        if store is None or name is None:
            return False
        cur = store.pointer(name, "current")
        if cur is None:
            return False
        if isinstance(exc, PackageError) and exc.code in CORRUPT_CODES:
            return self._rollback_at_start(store, name, f"{name}@{cur} is corrupt on disk: {exc}", Code.CURRENT_CORRUPT)
        if store.state(name).pending != cur:
            return False
        return self._rollback_at_start(store, name, f"{name}@{cur} does not load: {exc}", Code.LOAD_FAILED)

    def _rollback_at_start(self, store: Store, name: str, reason: str, code: str) -> bool:
        """Roll the store back before anything is loaded; the event goes out once the publisher runs."""
        try:
            was, now = store.rollback(name, reason)
        except PackageError as exc:
            logger.error("model %s: %s, but it cannot be rolled back: %s", name, reason, exc)
            return False
        self._marked = None  # the rollback ended the probation, marker and all
        logger.error("model %s@%d rolled back to %d at start: %s", name, was, now, reason)
        self.events.append(
            {
                "type": "model_rolled_back",
                "model": {"name": name, "version": was},
                "to": now,
                "reason": reason,
                "code": code,
            }
        )
        return True

    def _judge_crashes(self, store: Store, name: str) -> None:
        """Write the probation marker, just before the model is opened, and judge the crashes it counts.

        The marker (state.json `probation_boot`) says "a run is judging the version on probation". It is
        written only here, after the start-up work no model can make fail (lock, state directory, store
        recovery, spool), and cleared by every end the model did not cause: a clean stop, a SIGTERM or
        SIGINT in any phase (during the load or the warm-up too), a start that fails with a typed error
        that is not the model's (`NOT_THE_MODEL`). A run that leaves it behind died with the model loaded
        or loading (a SIGKILL, the OOM killer, a segfault in the runtime, the watchdog, an unexpected
        exception): the next run to reach this point counts that as a crash. A start refused earlier (a
        bad config, the lock held by another daemon, an unwritable state directory, a corrupt spool)
        never gets here, so it neither counts nor clears an earlier run's crash.

        A version on probation whose daemon died more than model.probation_max_crashes times is rolled
        back before it is loaded again (a crash loop never reaches the probation check)."""
        st = store.state(name)
        if st.pending is None or st.pending != store.pointer(name, "current"):
            return
        crashes = store.probation_run(name, self.boot_id)
        self._marked = name
        # test seam: a crash loop the daemon cannot judge itself (it counts, then dies before it can act;
        # edged-rollback.service, run by OnFailure=, finds the evidence and rolls back)
        crash_at_env_step("probation_start")
        limit = self.cfg.model.probation_max_crashes
        if crashes <= limit:
            if crashes:
                logger.warning(
                    "model %s@%d: %d crash(es) on probation (%d tolerated)", name, st.pending, crashes, limit
                )
            return
        reason = f"the daemon crashed {crashes} times while {name}@{st.pending} was on probation"
        self._rollback_at_start(store, name, reason, Code.PROBATION_CRASHES)
