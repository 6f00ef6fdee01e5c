"""``edged build-engine``: an ONNX model (float, or INT8 QDQ from ``edged quantize --target tensorrt``)
-> a TensorRT engine package whose manifest says what the engine needs.

Run it on a device of the target type (engines are tied to the TensorRT version, the GPU's compute
capability and the L4T release). The plan file is TensorRT's own bytes, nothing prepended, so
trtexec and DeepStream read it too; every fact about it goes into ``manifest.json``. The ONNX model
rides along in the package (unless ``carry_onnx`` is false) so a device that cannot load the engine
can say how to rebuild it.

A source with several fixed batches (manifest ``extra_batches``) gives one engine per batch, each with one
profile (min = opt = max): ``model.engine`` at the largest, ``model.b<N>.engine`` at each smaller one (listed
in the engine package's ``extra_batches``), all with the same precision and builder options; the largest is
built first.

INT8 from a float model (``--calib FRAMES``) goes through explicit quantization on every TensorRT version
(``qdq.py``): edged's Q/DQ quantizer runs on the frames, the Q/DQ model is checked against the float one on
them, and the engines are built from it (the smaller batches from it rebatched, so every engine has its
scales); the package carries that Q/DQ model and ``source.int8`` says how the int8 came about. TensorRT's
own calibrator (deprecated from 10.1, gone in 11) is not used.
"""

from __future__ import annotations

import datetime as dt
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.daemon.backends.tensorrt.build import BuilderOptions, BuiltEngine, Precision, build_engine
from edged.errors import Code, QuantizeError
from edged.models.compat import l4t_release
from edged.models.package import Manifest, Package, publish_package, sha256_file

from .frames import read_frames
from .qdq import qdq_for_tensorrt
from .tool import ensure_empty, load_source


def build_engine_package(
    model: Path,
    out: Path,
    *,
    spec: Path | None = None,
    precision: Precision | None = None,
    workspace_mb: int = 1024,
    timing_cache: Path | None = None,
    dla_core: int | None = None,
    carry_onnx: bool = True,
    calib: Path | None = None,
    calib_frames: int = 64,
    options: BuilderOptions | None = None,
    batches: tuple[int, ...] | None = None,
    progress: Callable[[str], None] | None = None,
    fold: bool = False,
) -> Package:
    """`options`: trtexec's builder options (optimization level, version-compatible, hardware-compatibility
    level, sparsity), recorded in the manifest: the compatibility they give under `compatibility`, all of
    them under `source.builder`. `batches`: which of the source's fixed batches get an engine (default: all);
    `compatibility.device_memory_bytes` counts every engine (what the daemon's memory budget admits).
    `fold`: fold the preprocessing into the ONNX model first (folding.py, value-checked against the unfolded
    model; `--calib` then calibrates through the folded graph on uint8 rows): the engines take uint8 pixels
    (build.py hands TensorRT the uint8 input straight into a Cast, uint8.py)."""
    opts = options or BuilderOptions()
    ensure_empty(out)
    with tempfile.TemporaryDirectory(prefix="edged-engine-") as tmp_dir:
        tmp = Path(tmp_dir)
        src = load_source(model, spec, tmp)
        frames = read_frames(calib, calib_frames, progress) if calib is not None else []
        folding: dict[str, Any] | None = None
        if fold and src.manifest.input.folded is None:
            from .folding import fold_source

            src, folding = fold_source(src, src.package, _mkdir(tmp / "fold"), frames, progress or _quiet)
        m = src.manifest
        base = src.package if src.package is not None else (spec or src.model).parent
        onnx_files = _source_batches(m, src.model, base, batches)
        largest = max(onnx_files)
        if dla_core is not None and precision == "fp32":
            raise QuantizeError(
                f"{model}: DLA runs fp16 or int8 only (trtexec forces fp16 there): use --precision fp16"
            )
        int8: dict[str, Any] | None = None
        if calib is not None:
            if m.precision == "int8":
                raise QuantizeError(
                    f"--calib: {model} is already int8 (Q/DQ): the engine takes its own scales; drop --calib"
                )
            if precision not in (None, "int8"):
                raise QuantizeError(f"--calib builds an int8 engine; drop it or --precision {precision}")
            qdq = qdq_for_tensorrt(src, onnx_files, frames, _mkdir(tmp / "qdq"), progress=progress)
            onnx_files, precision, int8 = qdq.files, "int8", qdq.record
        elif precision == "int8" and m.precision != "int8":
            raise QuantizeError(
                f"{model}: an int8 engine from a float model needs its scales: --calib FRAMES (edged quantizes it "
                "with Q/DQ on them) or a Q/DQ model from `edged quantize --target tensorrt`"
            )
        elif m.precision == "int8":
            int8 = {"method": "qdq", "by": "the model's own Q/DQ nodes"}
        built: dict[int, BuiltEngine] = {}
        for i, b in enumerate(sorted(onnx_files, reverse=True)):  # the largest first
            engine = tmp / ("model.engine" if b == largest else f"model.b{b}.engine")
            if len(onnx_files) > 1 and progress is not None:
                progress(f"batch {b} ({i + 1} of {len(onnx_files)}): {engine.name} from {onnx_files[b].name}")
            built[b] = build_engine(
                onnx_files[b],
                engine,
                m.input.name,
                (b, *m.input.shape[1:]),
                built[largest].precision if i else precision,  # every batch as the largest was built
                workspace_mb,
                timing_cache,
                dla_core,
                progress,
                options=opts,
            )
        (tmp / "labels.txt").write_text("\n".join(m.labels) + "\n")
        files = {_name(b, largest, "engine"): e.path for b, e in built.items()}
        files["labels.txt"] = tmp / "labels.txt"
        if carry_onnx:
            files |= {_name(b, largest, "onnx"): path for b, path in onnx_files.items()}
        fields = m.model_dump(by_alias=True, exclude={"files", "golden", "extra_batches"}, exclude_none=True)
        fields["input"]["shape"][0] = largest
        if len(built) > 1:
            fields["extra_batches"] = [{"batch": b, "file": _name(b, largest, "engine")} for b in sorted(built)[:-1]]
        top = built[largest]
        fields.update(
            created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            kind="engine",
            model_file="model.engine",
            labels_file="labels.txt",
            precision=top.precision,
            compatibility={
                "tensorrt": top.tensorrt,
                "compute_capability": top.compute_capability,
                "l4t": l4t_release(),
                "platform": platform.machine(),
                "version_compatible": opts.version_compatible,
                "hardware_compatibility": opts.hardware_compatibility,
                "batch": largest,
                "device_memory_bytes": sum(e.device_memory_bytes for e in built.values()),
                "dla_core": dla_core,
            },
            source={
                **m.source,
                "onnx_sha256": sha256_file(onnx_files[largest]),
                "build_seconds": round(sum(e.seconds for e in built.values()), 1),
                "builder": {**opts.record(), "workspace_mb": workspace_mb},
                **({"dla": top.dla} if top.dla is not None else {}),
                **({"int8": int8} if int8 is not None and top.precision == "int8" else {}),
                **({"engines": _engines(built, onnx_files)} if len(built) > 1 else {}),
                **({"fold": folding} if folding is not None else {}),
            },
        )
        pkg = publish_package(out, fields, files)
    return pkg


def _source_batches(m: Manifest, model: Path, base: Path, wanted: tuple[int, ...] | None) -> dict[int, Path]:
    """The source's ONNX file per fixed batch to build (`wanted`, else all), each checked to exist."""
    files = {b: model if b == m.input.batch else base / f for b, f in m.batch_files.items()}
    if wanted:
        missing = sorted(set(wanted) - set(files))
        if missing:
            raise QuantizeError(
                f"--batch {','.join(map(str, sorted(set(wanted))))}: the model carries batches {sorted(files)}, not "
                f"{missing} (`edged model init --batch` makes a package at other batches)"
            )
        files = {b: files[b] for b in wanted}
    for b, path in files.items():
        if not path.is_file():
            raise QuantizeError(f"{path}: the model's batch-{b} file is missing", code=Code.NOT_FOUND)
    return files


def _quiet(message: str) -> None:
    pass


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _name(batch: int, largest: int, ext: str) -> str:
    return f"model.{ext}" if batch == largest else f"model.b{batch}.{ext}"


def _engines(built: dict[int, BuiltEngine], onnx_files: dict[int, Path]) -> list[dict[str, Any]]:
    """Each engine's own facts, smallest batch first (the manifest's totals add them up)."""
    return [
        {
            "batch": b,
            "onnx_sha256": sha256_file(onnx_files[b]),
            "device_memory_bytes": e.device_memory_bytes,
            "build_seconds": round(e.seconds, 1),
            **({"dla": e.dla} if e.dla is not None else {}),
        }
        for b, e in sorted(built.items())
    ]
