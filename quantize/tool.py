"""``edged quantize``: a float ONNX model -> an INT8 (QDQ) or FP16 model package, behind an accuracy gate.

The model comes as a package (folder or tar) or as an ``.onnx`` file with a spec: a manifest
(``manifest.json`` beside the model, or ``--spec FILE``) that says how to preprocess and decode it.
The quantized model is evaluated against the float one through the daemon's preprocessing and
decoder; a package is written only when the report passes (or with ``force``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edged.daemon.decoders import DecodeOptions
from edged.errors import Code, PackageError, QuantizeError
from edged.models.package import MANIFEST, Manifest, Package, open_package, parse_manifest, publish_package, sha256_file

from .frames import Frame, read_frames
from .int8 import Judge, Method, Target, convert_fp16, quantize_int8
from .report import AccuracyReport, Gate, ModelRun, compare, run_model

logger = logging.getLogger(__name__)

REPORT_FILE = "quantize-report.json"


@dataclass(frozen=True)
class Source:
    model: Path
    manifest: Manifest
    labels_file: Path | None
    package: Path | None = None  # its verified package folder (None: a bare .onnx with a spec)


@dataclass(frozen=True)
class Outcome:
    report: AccuracyReport
    package: Package | None  # None when the gate failed and nothing was forced
    float_nodes: list[str]


def ensure_empty(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise QuantizeError(f"{out}: exists and is not empty; choose another --out or remove it")


def load_source(model: Path, spec: Path | None, scratch: Path) -> Source:
    """The float model and the manifest that says how to feed and decode it."""
    try:
        return _load_source(model, spec, scratch)
    except PackageError as exc:
        raise QuantizeError(str(exc), code=exc.code) from exc


def _load_source(model: Path, spec: Path | None, scratch: Path) -> Source:
    if model.suffix != ".onnx":
        if spec is not None:
            raise QuantizeError(f"{model}: --spec goes with an .onnx file; a package brings its own manifest")
        pkg = open_package(model, scratch=scratch)
        if pkg.manifest.kind != "onnx":
            raise QuantizeError(f"{model}: a {pkg.manifest.kind} package; quantize takes an ONNX model")
        labels = pkg.root / pkg.manifest.labels_file if pkg.manifest.labels_file else None
        return Source(pkg.model_path, pkg.manifest, labels, pkg.root)
    if not model.is_file():
        raise QuantizeError(f"{model}: no such ONNX file", code=Code.NOT_FOUND)
    spec = spec or model.parent / MANIFEST
    if not spec.is_file():
        raise QuantizeError(
            f"{model}: an ONNX file alone does not say how to preprocess frames or decode outputs; "
            f"give --spec MANIFEST.json (input, decoder, labels) or a model package"
        )
    try:
        data = spec.read_bytes()
    except OSError as exc:
        raise QuantizeError(f"{spec}: cannot read it: {exc.strerror}") from exc
    manifest = parse_manifest(data, str(spec))
    labels = spec.parent / manifest.labels_file if manifest.labels_file else None
    return Source(model, manifest, labels if labels and labels.is_file() else None)


def quantize(
    model: Path,
    calib: Path | None,
    evaluate: Path,
    out: Path,
    *,
    spec: Path | None = None,
    precision: Literal["int8", "fp16"] = "int8",
    target: Target = "cpu",
    exclude: tuple[str, ...] = (),
    keep_heads_float: bool = True,
    method: Method = "percentile",
    search: bool = True,
    calib_frames: int | None = 64,
    eval_frames: int | None = None,
    score_threshold: float = 0.5,
    gate: Gate = Gate(),  # noqa: B008 - frozen dataclass, safe as a default
    version: int | None = None,
    force: bool = False,
    threads: int = 0,
    batches: tuple[int, ...] | None = None,
    progress: Callable[[str], None] | None = None,
    fold: bool = False,
) -> Outcome:
    """`batches`: the fixed batches the new package carries (default: the source's); the largest is the
    source's batch, the smaller ones are the quantized model rebatched (the same scales at every batch).
    `fold`: fold the preprocessing into the float model first (folding.py): the package takes uint8 pixels,
    calibration and the gate feed it uint8 rows, the gate's reference stays the unfolded float model. A folded
    source needs no flag: it is quantized as it comes (its preprocessing nodes stay float)."""
    say = progress or (lambda m: logger.info("%s", m))
    ensure_empty(out)
    with tempfile.TemporaryDirectory(prefix="edged-quantize-") as tmp_dir:
        tmp = Path(tmp_dir)
        src = load_source(model, spec, tmp)
        if src.manifest.precision != "fp32":
            raise QuantizeError(f"{model}: already {src.manifest.precision}; quantize starts from the float model")
        if precision == "int8" and calib is None:
            raise QuantizeError("int8 needs calibration frames (--calib)")
        eval_set = read_frames(evaluate, eval_frames, say)
        calib_set = read_frames(calib, calib_frames, say) if precision == "int8" and calib is not None else []
        ref = src  # the gate's reference: the float model as given (unfolded, when --fold folds it here)
        folding: dict[str, Any] | None = None
        if fold and src.manifest.input.folded is None:
            from .folding import fold_source

            src, folding = fold_source(src, src.package, tmp, calib_set or eval_set, say)
        elif fold:
            say(f"{model}: folded already (input.folded); quantizing it as it is")
        m = src.manifest
        wanted = tuple(sorted(set(batches))) if batches else tuple(m.batch_files)
        if wanted[-1] != m.input.batch or wanted[0] < 1:
            raise QuantizeError(
                f"--batch {','.join(map(str, wanted))}: the largest must be the model's own batch {m.input.batch} "
                "(`edged model init --batch` makes a float package at other batches)"
            )
        qpath = tmp / "model.onnx"
        float_nodes: list[str] = []
        opts = DecodeOptions(score_threshold=score_threshold)
        simulate = precision == "int8" and target == "tensorrt"
        searched = "not run"
        if precision == "int8":
            judge = _judge(ref, m, calib_set, opts, gate, threads, simulate, say) if search else None
            q = quantize_int8(
                src.model, qpath, m.input, calib_set, target, exclude, keep_heads_float, method, judge, say
            )
            float_nodes, searched = q.float_nodes, q.search
        else:
            say(f"converting {src.model.name} to float16 (inputs and outputs stay float32)")
            convert_fp16(src.model, qpath)
        say(f"evaluating the float model on {len(eval_set)} frames")
        want = run_model(ref.model, ref.manifest, eval_set, opts, threads, say)
        say(f"evaluating the {precision} model" + (" (simulated quantization)" if simulate else ""))
        got = run_model(qpath, m, eval_set, opts, threads, say, simulate=simulate)
        report = compare(eval_set, want, got, gate)
        if not report and not force:
            return Outcome(report, None, float_nodes)
        (tmp / "labels.txt").write_text("\n".join(m.labels) + "\n")
        (tmp / REPORT_FILE).write_text(json.dumps(report.to_json(), indent=2) + "\n")
        fields = m.model_dump(by_alias=True, exclude={"files", "golden"}, exclude_none=True)
        fields.update(
            created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            version=version if version is not None else m.version + 1,
            precision=precision,
            model_file="model.onnx",
            labels_file="labels.txt",
            compatibility={**m.compatibility, "quantized_for": target} if precision == "int8" else m.compatibility,
            source={
                **m.source,
                "float_model_sha256": sha256_file(ref.model),
                "quantize": {
                    "target": target,
                    "calibration": method,
                    "float_nodes": float_nodes,
                    "search": searched,
                    "gate_passed": bool(report),
                    **({"fold": folding} if folding is not None else {}),
                },
            },
        )
        files = {"model.onnx": qpath, "labels.txt": tmp / "labels.txt", REPORT_FILE: tmp / REPORT_FILE}
        smaller = smaller_batches(qpath, m, wanted[:-1], simulate, say)
        fields["extra_batches"] = [{"batch": b, "file": path.name} for b, path in smaller.items()]
        files |= {path.name: path for path in smaller.values()}
        return Outcome(report, publish_package(out, fields, files), float_nodes)


def smaller_batches(
    model: Path, m: Manifest, batches: tuple[int, ...], simulate: bool, say: Callable[[str], None]
) -> dict[int, Path]:
    """`model` (at the manifest's batch) rebatched to each of `batches`, beside it as model.b<N>.onnx; each
    row of a random batch must come out as the largest batch's same row does (within float noise)."""
    import numpy as np
    import onnx

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.models.rebatch import rebatch

    spec = m.input
    rng = np.random.default_rng(0)
    if spec.dtype == "uint8":
        x = rng.integers(0, 256, spec.shape, dtype=np.uint8)
    else:
        x = rng.uniform(-1.0, 1.0, spec.shape).astype(spec.dtype)
    out: dict[int, Path] = {}
    if not batches:
        return out
    with OnnxRuntimeBackend(model, threads=1, optimize=not simulate) as largest:
        ref = largest.infer({spec.name: x})
    for b in batches:
        path = model.with_name(f"model.b{b}.onnx")
        try:
            onnx.save(rebatch(onnx.load(str(model)), b), str(path))
        except PackageError as exc:
            raise QuantizeError(f"{model.name} at batch {b}: {exc}", code=exc.code) from exc
        with OnnxRuntimeBackend(path, threads=1, optimize=not simulate) as small:
            got = small.infer({spec.name: x[:b]})
        for name, want in ref.items():
            if got[name].shape != (b, *want.shape[1:]) or not np.allclose(got[name], want[:b], rtol=1e-3, atol=1e-4):
                raise QuantizeError(
                    f"{model.name} at batch {b}: output {name!r} differs from the batch-{spec.batch} rows"
                )
        say(f"batch {b}: {path.name} (the quantized model rebatched; its rows match batch {spec.batch}'s)")
        out[b] = path
    return out


def calibration_gate(gate: Gate) -> Gate:
    """`gate` with half the allowed loss: what a search judges on the calibration frames."""
    return Gate(
        min_agreement=1 - (1 - gate.min_agreement) / 2,
        min_mean_iou=gate.min_mean_iou,
        max_recall_drop=gate.max_recall_drop / 2,
        max_precision_drop=gate.max_precision_drop / 2,
    )


def _judge(
    src: Source,
    manifest: Manifest,
    frames: list[Frame],
    opts: DecodeOptions,
    gate: Gate,
    threads: int,
    simulate: bool,
    say: Callable[[str], None],
) -> Judge:
    """The gate with half the allowed loss, applied on the calibration frames: the evaluation frames stay
    unseen until the end, and the margin stands for how few calibration frames there usually are. `src`: the
    float reference; `manifest`: the candidates' (src's, or its folded package's: uint8 rows)."""
    ref: list[ModelRun] = []
    strict = calibration_gate(gate)

    def judge(candidate: Path) -> bool:
        if not ref:
            ref.append(run_model(src.model, src.manifest, frames, opts, threads))
        got = run_model(candidate, manifest, frames, opts, threads, simulate=simulate)
        report = compare(frames, ref[0], got, strict)
        say(
            f"on the calibration frames: recall/precision vs float {report.recall_vs_float:.3f}/"
            f"{report.precision_vs_float:.3f}" + (" - passes" if report else " - fails")
        )
        return bool(report)

    return judge
