"""A cascade's stages at start: each stage's package found, verified, admitted to the memory budget, opened and
checked, after the primary model is (lifecycle/loader.py) and before anything serves.

    stages[i].model.package (a folder or .tar)  |  stages[i].model.name: <state_dir>/models/<name>/current
        -> files verified against the manifest (sizes, sha256)
        -> admitted on its estimate: what the daemon holds now (the primary's weights loaded) + the primary's
           working memory and frame buffers (not resident until its first batch runs, so counted from its
           estimate as its own admission did) + every stage before it + this one (weights, I/O and
           activations of each fixed batch, and its crop buffers), against memory.budget_mb: a stage that
           does not fit is refused, the error naming it and every figure
        -> backend opened (one per fixed batch) -> I/O checked, batches checked on values, golden pair run
           (lifecycle/admission.py, the primary's own checks) -> decoder built on the output shapes
        -> admitted again on what it takes once loaded

`open_stages` does this once at start for every stage in the config's order; what it opened is closed again
when a later stage is refused, so a refused start leaves nothing loaded. Every error names its stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edged.errors import BackendError, Code, DecoderError, EngineLoadError, PackageError, SwapError
from edged.models.package import Package

from ..backends import Backend
from ..config import Config
from ..config.stages import StageConfig
from ..decoders import Decoder, build_decoder
from ..host.sensors import rss_mb
from ..lifecycle.admission import activation_mb, batches_check, check_io, estimate_mb, golden_check
from ..lifecycle.loader import open_package_backend, resolve_package

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenedStage:
    """One stage a start serves: its config, verified package, open backend (a BatchSet for several fixed
    batches), decoder, and the memory it was admitted for (MB)."""

    cfg: StageConfig
    package: Package
    backend: Backend
    decoder: Decoder
    estimate_mb: float


def stage_config(cfg: Config, stage: StageConfig) -> Config:
    """The daemon's config with the stage's `model:` in the primary's place: what resolving and opening a
    package read (model.package/name, backend, onnxruntime threads, build_on_device)."""
    return cfg.model_copy(update={"model": stage.model})


def buffers_mb(pkg: Package) -> float:
    """A stage's crop buffers: two batches of input rows (the one filling, the one running)."""
    spec = pkg.manifest.input
    row = int(np.prod(spec.shape[1:])) * np.dtype(spec.dtype).itemsize
    return 2 * spec.batch * row / 2**20


def primary_mb(cfg: Config, primary: Package) -> float:
    """What the primary will take on top of what its loaded weights hold: its working memory (activations) and
    its frame buffers (the cameras' slots and the loop's two batches, as lifecycle/loader.py counts them)."""
    spec = primary.manifest.input
    row = int(np.prod(spec.shape[1:])) * np.dtype(spec.dtype).itemsize / 2**20
    return activation_mb(primary) + row * (3 * len(cfg.cameras) + 2 * spec.batch)


@dataclass(frozen=True)
class Base:
    """What every stage is admitted on top of: the memory in use (the primary's weights loaded) and what the
    primary `ref` will take once it runs (`primary_mb`)."""

    in_use_mb: float
    primary_mb: float
    ref: str


def admit_stage(stage: str, ref: str, stage_mb: float, before_mb: float, base: Base, budget_mb: float) -> None:
    """Refuse a stage that does not fit the budget on top of what is in use, the primary and the stages admitted
    before it; EngineLoadError(over_budget) naming the stage and every figure."""
    need = base.in_use_mb + base.primary_mb + before_mb + stage_mb
    if need > budget_mb:
        raise EngineLoadError(
            f"stage {stage!r} ({ref}) does not fit the memory budget: {stage_mb:.1f} MB (weights, I/O, activations "
            f"and crop buffers) on top of {base.in_use_mb:.1f} MB in use (the primary {base.ref} loaded), "
            f"{base.primary_mb:.1f} MB of the primary's activations and frame buffers and {before_mb:.1f} MB of the "
            f"stages before it = {need:.1f} MB, over memory.budget_mb {budget_mb:.0f} MB",
            code=Code.OVER_BUDGET,
        )


def open_stages(cfg: Config, primary: Package, in_use_mb: float | None = None) -> list[OpenedStage]:
    """Every configured stage, verified, admitted, opened and checked (see the module docstring); called at start,
    after the primary is opened and before it runs a batch. `in_use_mb`: the memory in use with the primary
    loaded (default: this process's resident set, measured now)."""
    base = Base(rss_mb() if in_use_mb is None else in_use_mb, primary_mb(cfg, primary), primary.ref)
    opened: list[OpenedStage] = []
    try:
        for stage in cfg.stages:
            before = sum(s.estimate_mb for s in opened)
            try:
                opened.append(_open_stage(cfg, stage, base, before))
            except (PackageError, BackendError, DecoderError) as exc:  # EngineLoadError is a BackendError
                named = str(exc).startswith(f"stage {stage.name!r}")
                err = exc if named else type(exc)(f"stage {stage.name!r}: {exc}", code=exc.code)
                err.stage = stage.name  # the primary's probation does not count it (ModelLoader.start_failed)
                if named:
                    raise
                raise err from exc
    except BaseException:
        for s in opened:
            s.backend.close()
        raise
    return opened


def _open_stage(cfg: Config, stage: StageConfig, base: Base, before: float) -> OpenedStage:
    scfg = stage_config(cfg, stage)
    pkg = resolve_package(scfg)
    budget = cfg.memory.budget_mb
    est = estimate_mb(pkg) + buffers_mb(pkg)
    admit_stage(stage.name, pkg.ref, est, before, base, budget)
    backend, decoder, said = open_checked(scfg, pkg)
    try:
        loaded = max(est, backend.memory_bytes / 2**20 + buffers_mb(pkg))
        admit_stage(stage.name, pkg.ref, loaded, before, base, budget)
    except Exception:
        backend.close()
        raise
    total = base.in_use_mb + base.primary_mb + before + loaded
    logger.info(
        "stage %s: %s admitted (%.1f MB; with %.1f MB in use, %.1f MB of the primary's activations and frame "
        "buffers, %.1f MB of stages before it: %.1f of %.0f MB)%s",
        stage.name, pkg.ref, loaded, base.in_use_mb, base.primary_mb, before, total, budget,
        "; " + "; ".join(said) if said else "",
    )  # fmt: skip
    return OpenedStage(stage, pkg, backend, decoder, loaded)


def open_checked(scfg: Config, pkg: Package) -> tuple[Backend, Decoder, list[str]]:
    """A stage's package opened as `scfg` (`stage_config`) asks, its I/O checked, its batches checked on values
    and its golden pair run (or one batch of padding run), its decoder built on the output shapes: at start,
    and for a stage version pushed while serving (lifecycle/stage_swap.py). The backend is closed on a failure."""
    m = pkg.manifest
    backend = open_package_backend(scfg, pkg)
    try:
        check_io(pkg, backend)
        said = [s for s in (_checked(pkg, backend, batches_check), _checked(pkg, backend, golden_check)) if s]
        if not said:  # nothing ran the model yet: one batch of padding, so its first crops do not pay the start
            spec = m.input
            backend.infer({spec.name: np.full(spec.shape, spec.pad_value, np.dtype(spec.dtype))})
        shapes = {o.name: o.shape for o in backend.outputs}
        decoder = build_decoder(m.decoder, m.input, m.labels, shapes)
    except Exception:
        backend.close()
        raise
    return backend, decoder, said


def _checked(pkg: Package, backend: Backend, check: Callable[[Package, Backend], str | None]) -> str | None:
    """A lifecycle check run on a stage at start: its SwapError (golden or batch mismatch) refuses the start
    as a PackageError with the same code, naming the package."""
    try:
        return check(pkg, backend)
    except SwapError as exc:
        raise PackageError(str(exc), code=exc.code) from exc
