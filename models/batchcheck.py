"""Proof on values that a model computes, row for row, what its reference computes: the check that makes a
rebatched model (``rebatch.py``) or a package's smaller batches (``extra_batches``) safe to serve.

A batch changed in a graph can go wrong without any shape showing it (a ``Reshape`` whose first dimension
is not the batch, rewritten as if it were: every shape right, the boxes off by hundreds of pixels). So
every place that makes or accepts a model at several batches runs it on real values and compares each
row of each output with its reference, within the golden pair's tolerance:

- ``edged model init``: each batch written against the source export itself, run one image at a time;
- ``edged model pack`` / ``verify`` / ``init`` (cli/model_init.py ``check_model``): each batch of a package
  against its smallest, so a package made by an older edged is caught too;
- a swap on the device (daemon/lifecycle/admission.py): each batch the backend runs against its smallest.

The probe rows: the golden image (when the package has one) in every row, then distinct random rows (a
model that mixes rows, or reads another row's values, differs there). Numpy only: the device's runtime
imports this, never ONNX.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edged.errors import Code, PackageError

Run = Callable[[np.ndarray], dict[str, np.ndarray]]  # one batch in, its outputs by name out

ATOL, RTOL = 1e-3, 1e-2  # the golden pair's defaults


def probe_inputs(shape: list[int], dtype: str, golden: np.ndarray | None = None, seed: int = 0) -> list[np.ndarray]:
    """Batches of `shape` to compare on: the golden rows tiled (if given), then distinct random rows in the
    range of the input (0-255 for uint8, else 0-1 as most preprocessing gives)."""
    rng = np.random.default_rng(seed)
    out = []
    if golden is not None and golden.size:
        out.append(np.ascontiguousarray(np.broadcast_to(golden[:1], shape), dtype=dtype))
    if np.dtype(dtype) == np.uint8:
        out.append(rng.integers(0, 256, shape, dtype=np.uint8))
    else:
        out.append(rng.uniform(0, 1, shape).astype(dtype))
    return out


def run_in_batches(run: Run, x: np.ndarray, batch: int) -> dict[str, np.ndarray]:
    """`x`'s rows through a model that takes `batch` rows at a time (the last chunk padded with its own last
    row, the padding's outputs dropped); outputs concatenated row for row."""
    parts: dict[str, list[np.ndarray]] = {}
    n = x.shape[0]
    for start in range(0, n, batch):
        chunk = x[start : start + batch]
        rows = chunk.shape[0]
        if rows < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - rows, axis=0)])
        for name, value in run(np.ascontiguousarray(chunk)).items():
            value = np.asarray(value)
            if value.ndim == 0 or value.shape[0] != batch:
                raise PackageError(
                    f"output {name!r} is {list(value.shape)} at batch {batch}: its first dimension is not the batch, "
                    "so its rows cannot be compared (edged's decoders read the batch first)",
                    code=Code.BATCH_MISMATCH,
                )
            parts.setdefault(name, []).append(value[:rows])
    return {name: np.concatenate(values) for name, values in parts.items()}


def compare_rows(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str, atol: float = ATOL, rtol: float = RTOL
) -> None:
    """Every row of every output of `got` equals `want`'s within atol + rtol * |want|, else
    PackageError(batch_mismatch) naming the output, the row and the largest difference."""
    for name, ref in want.items():
        out = got.get(name)
        if out is None or out.shape != ref.shape:
            raise PackageError(
                f"{where}: output {name!r} is {None if out is None else list(out.shape)}, the reference gives "
                f"{list(ref.shape)}",
                code=Code.BATCH_MISMATCH,
            )
        a, b = out.astype(np.float64), ref.astype(np.float64)
        diff = np.abs(a - b)
        off = (diff > atol + rtol * np.abs(b)) | (np.isnan(a) != np.isnan(b))
        if off.any():
            row = int(np.argwhere(off)[0][0])
            raise PackageError(
                f"{where}: output {name!r} differs from the reference: {int(off.sum())} of {off.size} values off "
                f"(first in row {row}), by up to {float(np.nanmax(diff)):.4g} (atol {atol:g}, rtol {rtol:g}); "
                "this batch does not compute what the model computes one image at a time",
                code=Code.BATCH_MISMATCH,
            )


def check_batches(
    runs: dict[int, Run],
    reference: tuple[int, Run],
    shape: list[int],
    dtype: str,
    golden: np.ndarray | None = None,
    atol: float = ATOL,
    rtol: float = RTOL,
    where: str = "model",
) -> list[int]:
    """Each of `runs` (batch -> run) against `reference` (its batch, its run) on the probe rows of
    `probe_inputs` at the largest batch; returns the batches checked. `shape` is the input at any batch."""
    largest = max([*runs, reference[0]])
    full = [largest, *shape[1:]]
    ref_batch, ref_run = reference
    for x in probe_inputs(full, dtype, golden):
        want = run_in_batches(ref_run, x, ref_batch)
        for b, run in sorted(runs.items()):
            compare_rows(run_in_batches(run, x, b), want, f"{where} at batch {b}", atol, rtol)
    return sorted(runs)
