"""What a model must pass before it serves, at start (lifecycle/loader.py) and at a swap (lifecycle/manager.py):
its input against the manifest (check_io), its golden pair (golden_check), its batches against each other on
values (batches_check), and what it will cost in memory before it is loaded (estimate_mb, which admit() and
plan_swap() count), and whether a shadowed candidate fits beside the serving model (shadow_fits)."""

from __future__ import annotations

import numpy as np

from edged.errors import Code, EngineLoadError, PackageError, SwapError
from edged.models.batchcheck import ATOL, RTOL, check_batches
from edged.models.footprint import working_bytes
from edged.models.golden import load_input, load_output
from edged.models.package import GoldenSpec, Package
from edged.models.validate import Tensor, batch_spec, check_input

from ..backends import Backend
from ..backends.base import BatchSet, fixed_batches


def check_io(pkg: Package, backend: Backend) -> None:
    """The loaded model's input against the manifest (name, fixed shape, dtype; models/validate.py), at each of
    the package's fixed batches."""
    spec = pkg.manifest.input
    paths = pkg.batch_paths
    try:
        # the batches the backend runs (every fixed batch of the package: ONNX models or TensorRT engines)
        for b in fixed_batches(backend, spec.batch):
            member = backend.member(b) if isinstance(backend, BatchSet) else backend
            inputs = [Tensor(t.name, t.shape, t.dtype) for t in member.inputs]
            check_input(batch_spec(spec, b), inputs, str(paths.get(b, pkg.model_path)))
    except PackageError as exc:
        raise EngineLoadError(str(exc)) from exc


def golden_check(pkg: Package, backend: Backend) -> str | None:
    """Run the package's golden input; raise SwapError(golden_mismatch) when an output is off.
    Returns what was checked, in words, or None when the package has no golden pair."""
    g = pkg.manifest.golden
    if g is None:
        return None
    spec = pkg.manifest.input
    try:
        x = load_input(pkg.root / g.input)
        expected = load_output(pkg.root / g.output)
    except (OSError, ValueError) as exc:
        raise SwapError(f"{pkg.ref}: golden files unreadable: {exc}", code=Code.GOLDEN_INVALID) from exc
    if list(x.shape) != list(spec.shape) or x.dtype != np.dtype(spec.dtype):
        raise SwapError(
            f"{pkg.ref}: golden input is {x.dtype}{list(x.shape)}, the model takes {spec.dtype}{spec.shape}",
            code=Code.GOLDEN_INVALID,
        )
    batches = fixed_batches(backend, spec.batch)
    for b in batches:  # each fixed batch the backend runs, on the golden input's first rows
        _golden_outputs(pkg, g, backend.infer({spec.name: x[:b]}), expected, b)
    return f"golden check passed ({len(expected)} outputs" + (
        f", at batches {list(batches)})" if len(batches) > 1 else ")"
    )


def batches_check(pkg: Package, backend: Backend) -> str | None:
    """An ONNX package of several fixed batches: each batch the backend runs against its smallest, row for row
    (models/batchcheck.py: the golden image tiled, then random rows), so a package whose larger batch computes
    something else (one rebatched wrongly by an older edged) never serves; SwapError(batch_mismatch). None
    when there is nothing to compare. Engine packages are left to the golden check at every batch: engines
    built per batch may differ beyond the ONNX tolerance in their last bits."""
    spec = pkg.manifest.input
    batches = fixed_batches(backend, spec.batch)
    if pkg.manifest.kind != "onnx" or len(batches) < 2:
        return None
    g = pkg.manifest.golden
    golden = None
    if g is not None:
        try:
            golden = load_input(pkg.root / g.input)
        except (OSError, ValueError) as exc:
            raise SwapError(f"{pkg.ref}: golden files unreadable: {exc}", code=Code.GOLDEN_INVALID) from exc

    def run(x: np.ndarray) -> dict[str, np.ndarray]:  # the backend runs the batch of x's rows
        return backend.infer({spec.name: x})

    try:
        check_batches(
            dict.fromkeys(batches[1:], run), (batches[0], run), spec.shape, spec.dtype, golden,
            g.atol if g else ATOL, g.rtol if g else RTOL, where=pkg.ref,
        )  # fmt: skip
    except PackageError as exc:
        raise SwapError(str(exc), code=Code.BATCH_MISMATCH) from exc
    return f"batches {list(batches)} give row for row what batch {batches[0]} gives"


def _golden_outputs(
    pkg: Package, g: GoldenSpec, got: dict[str, np.ndarray], expected: dict[str, np.ndarray], rows: int
) -> None:
    at = f" at batch {rows}" if rows != pkg.manifest.input.batch else ""
    for name, value in expected.items():
        ref = value[:rows]
        out = got.get(name)
        if out is None or out.shape != ref.shape:
            raise SwapError(
                f"{pkg.ref}: golden output {name!r}{at} is {None if out is None else list(out.shape)}, expected "
                f"{list(ref.shape)}",
                code=Code.GOLDEN_MISMATCH,
            )
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        off = diff > g.atol + g.rtol * np.abs(ref.astype(np.float64))
        if off.any():
            raise SwapError(
                f"{pkg.ref}: golden check failed{at}: output {name!r} has {int(off.sum())} of {off.size} values off "
                f"by up to {float(diff.max()):.4g} (atol {g.atol:g}, rtol {g.rtol:g})",
                code=Code.GOLDEN_MISMATCH,
            )


def activation_mb(pkg: Package) -> float:
    """A model's working memory while a batch runs, before it is loaded: a TensorRT engine's device memory as
    its manifest records it (`compatibility.device_memory_bytes`, written by `edged build-engine`), an ONNX
    graph's peak of intermediate tensors times ONNX Runtime's arena factor (edged.models.footprint)."""
    m = pkg.manifest
    if m.kind == "engine":
        recorded = m.compatibility.get("device_memory_bytes")
        return recorded / 2**20 if isinstance(recorded, int) and recorded > 0 else 0.0
    return sum(working_bytes(p) for p in pkg.batch_paths.values()) / 2**20


def estimate_mb(pkg: Package) -> float:
    """A model's memory before it is loaded (what admit() and plan_swap() count): its files, one batch of input
    and its working memory (activation_mb), which grows with the batch; every fixed batch it carries counts
    (each is a session of its own). An engine whose manifest records its `device_memory_bytes` counts that
    instead of its file: the record already holds the weights (the plan)."""
    spec = pkg.manifest.input
    row = int(np.prod(spec.shape[1:])) * np.dtype(spec.dtype).itemsize
    recorded = pkg.manifest.kind == "engine" and activation_mb(pkg) > 0
    total = 0
    for b, path in pkg.batch_paths.items():
        total += (0 if recorded else path.stat().st_size) + b * row
    return total / 2**20 + activation_mb(pkg)


def shadow_fits(serving_mb: float, candidate_mb: float, in_use_mb: float, budget_mb: float) -> None:
    """Shadow evaluation holds both models at once: the serving one (counted in `in_use_mb`, the process's
    memory now) and the candidate (`candidate_mb`, its `estimate_mb`). SwapError (over_budget) when both do
    not fit: the offer is refused, never turned into a stop-the-world swap (push it without shadow for that)."""
    if in_use_mb + candidate_mb <= budget_mb:
        return
    raise SwapError(
        f"shadow evaluation needs the candidate ({candidate_mb:.1f} MB) loaded beside the serving model "
        f"({serving_mb:.1f} MB of the {in_use_mb:.1f} MB in use): over the {budget_mb:.0f} MB budget. Push it "
        "without shadow for a stop-the-world swap, or raise memory.budget_mb",
        code=Code.OVER_BUDGET,
    )
