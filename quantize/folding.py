"""``--fold`` for ``edged quantize`` and ``edged build-engine``: the float model's preprocessing folded into its
graph (models/fold.py) before it is quantized or built, so the package takes uint8 pixels.

The fold comes first and everything after it runs on the folded float model: the calibration frames reach the
quantizer as uint8 rows through the folded graph (what the daemon will feed it), the accuracy gate and the
build-engine check feed the same uint8 rows. The fold itself is value-checked by models/fold.py against the
unfolded float model (golden input, calibration frames, random pixels; refused on a mismatch), and
`fold_source` measures and reports the largest difference it saw.

The folded prefix (uint8 -> float, colour order, scale, mean/std, layout) stays in float in the quantized model
(int8.py `prefix_nodes`): the quantizer puts its Q/DQ pair on the first compute layer's input, where the unfolded model
had it on the graph input, so the int8 arithmetic is the unfolded quantization's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.daemon.capture.preprocess import Preprocessor
from edged.errors import PackageError, QuantizeError
from edged.models.package import verify_folder

from .frames import Frame
from .tool import Source

CHECK_FRAMES = 8  # calibration frames the fold's value check runs on (besides the golden input and noise)


def fold_source(
    src: Source, package: Path | None, scratch: Path, frames: Sequence[Frame], say: Callable[[str], None]
) -> tuple[Source, dict[str, Any]]:
    """`src` (an unfolded float ONNX model; `package`: its verified package folder, None for a bare .onnx with
    a spec) folded into `scratch`/folded: the folded source and what the fold check found (the manifest's
    ``source.fold``). QuantizeError(fold_mismatch, ...) when the folded model does not give the unfolded one's
    outputs."""
    from edged.models.fold import fold_package, folded_spec

    spec = src.manifest.input
    if spec.folded is not None:
        raise ValueError("fold_source on a folded model")
    root = package if package is not None else _as_package(src, scratch / "unfolded")
    rows = _letterboxed(folded_spec(spec), frames[:CHECK_FRAMES])
    say(f"folding the preprocessing into {src.model.name} (checked against the unfolded model on values)")
    try:
        pkg = verify_folder(fold_package(root, scratch / "folded", rows))
    except PackageError as exc:
        raise QuantizeError(f"--fold: {exc}", code=exc.code) from exc
    record = fold_drift(src, pkg.model_path, pkg.manifest.input.name, rows)
    worst = max(record["max_abs_diff"].values())
    say(
        f"fold: the folded float model gives the unfolded one's outputs on {len(rows)} frame(s), random pixels "
        f"and the golden input where there is one (largest difference here {worst:.3g}, within atol "
        f"{record['atol']:g} + rtol {record['rtol']:g})"
    )
    labels = pkg.root / pkg.manifest.labels_file if pkg.manifest.labels_file else None
    return Source(pkg.model_path, pkg.manifest, labels, pkg.root), record


def fold_drift(src: Source, folded: Path, pixels_name: str, rows: list[np.ndarray]) -> dict[str, Any]:
    """The folded model on `rows` (uint8 pixels) against the unfolded one on their reference preprocessing:
    per output the largest absolute difference (the numbers behind models/fold.py's pass)."""
    from edged.models.batchcheck import ATOL, RTOL, run_in_batches
    from edged.models.fold import normalise, runner

    spec = src.manifest.input
    g = src.manifest.golden
    noise = np.random.default_rng(1).integers(0, 256, (2, spec.height, spec.width, 3), dtype=np.uint8)
    px = np.concatenate([*(r[None] for r in rows), noise])
    want = run_in_batches(runner(src.model, spec.name), normalise(px, spec), spec.batch)
    got = run_in_batches(runner(folded, pixels_name), px, spec.batch)
    diffs = {k: float(np.max(np.abs(got[k].astype(np.float64) - want[k].astype(np.float64)))) for k in want}
    return {
        "checked_against": "the unfolded float model",
        "rows": int(px.shape[0]),
        "max_abs_diff": {k: round(v, 7) for k, v in diffs.items()},
        "atol": g.atol if g is not None else ATOL,
        "rtol": g.rtol if g is not None else RTOL,
    }


def _letterboxed(spec: Any, frames: Sequence[Frame]) -> list[np.ndarray]:
    """Each frame as the daemon hands a folded model its pixels (its preprocess.py with the folded spec)."""
    pre = Preprocessor(spec)
    rows = []
    for f in frames:
        row = pre.new_row()
        pre.run(f.image, row)
        rows.append(row)
    return rows


def _as_package(src: Source, out: Path) -> Path:
    """A bare .onnx and its spec laid out as a package folder (models/fold.py folds packages)."""
    from edged.models.package import publish_package

    m = src.manifest
    if m.extra_batches:
        raise QuantizeError(f"{src.model}: --fold with --spec takes a one-batch model; fold the package instead")
    fields = m.model_dump(by_alias=True, exclude={"files", "golden"}, exclude_none=True)
    fields["model_file"] = "model.onnx"
    files = {"model.onnx": src.model}
    if src.labels_file is not None:
        fields["labels_file"] = "labels.txt"
        files["labels.txt"] = src.labels_file
    else:
        fields["labels_file"] = None
    publish_package(out, fields, files)
    return out
