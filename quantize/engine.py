"""``edged build-engine``: an ONNX model (float, or INT8 QDQ from ``edged quantize --target tensorrt``)
-> a TensorRT engine package whose manifest says what the engine needs.

Run it on a device of the target type (engines are tied to the TensorRT version, the GPU's compute
capability and the L4T release). The plan file is TensorRT's own bytes, nothing prepended, so
trtexec and DeepStream read it too; every fact about it goes into ``manifest.json``. The ONNX model
rides along in the package (unless ``carry_onnx`` is false) so a device that cannot load the engine
can say how to rebuild it.
"""

from __future__ import annotations

import datetime as dt
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path

from edged.daemon.backends.trt_build import BuilderOptions, Precision, build_engine
from edged.errors import QuantizeError
from edged.models.compat import l4t_release
from edged.models.package import Package, publish_package, sha256_file

from .frames import read_frames
from .int8 import calibration_batches
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
    progress: Callable[[str], None] | None = None,
) -> Package:
    """`options`: trtexec's builder options (optimization level, version-compatible, hardware-compatibility
    level, sparsity), recorded in the manifest: the compatibility they give under `compatibility`, all of
    them under `source.builder`."""
    opts = options or BuilderOptions()
    ensure_empty(out)
    with tempfile.TemporaryDirectory(prefix="edged-engine-") as tmp_dir:
        tmp = Path(tmp_dir)
        src = load_source(model, spec, tmp)
        m = src.manifest
        # what the user asked, else what the build would pick on TensorRT 8.6-10.11 (from 10.12 the model's own,
        # strongly typed, which build_engine resolves); calibration needs an explicit int8 for a float model
        chosen: Precision = precision or ("int8" if m.precision == "int8" else "fp16")
        if dla_core is not None and precision == "fp32":
            raise QuantizeError(
                f"{model}: DLA runs fp16 or int8 only (trtexec forces fp16 there): use --precision fp16"
            )
        batches = None
        if chosen == "int8" and m.precision != "int8":
            if calib is None:
                raise QuantizeError(
                    f"{model}: an int8 engine needs a QDQ model with its scales (`edged quantize --target "
                    "tensorrt`, recommended) or, as a fallback, --calib frames for TensorRT's entropy calibrator"
                )
            batches = calibration_batches(m.input, read_frames(calib, calib_frames, progress))
        engine = tmp / "model.engine"
        built = build_engine(
            src.model,
            engine,
            m.input.name,
            tuple(m.input.shape),
            precision,
            workspace_mb,
            timing_cache,
            dla_core,
            progress,
            calibration=batches,
            calibration_cache=out.with_name(out.name + ".calib-cache") if batches else None,
            options=opts,
        )
        (tmp / "labels.txt").write_text("\n".join(m.labels) + "\n")
        files = {"model.engine": engine, "labels.txt": tmp / "labels.txt"}
        if carry_onnx:
            files["model.onnx"] = src.model
        fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
        if fields.pop("extra_batches", None) and progress is not None:
            progress(
                f"built batch {m.input.batch} only: the tensorrt backend opens one engine per package, so the "
                f"smaller batches {[e.batch for e in m.extra_batches]} are not carried"
            )
        fields.update(
            created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            kind="engine",
            model_file="model.engine",
            labels_file="labels.txt",
            precision=built.precision,
            compatibility={
                "tensorrt": built.tensorrt,
                "compute_capability": built.compute_capability,
                "l4t": l4t_release(),
                "platform": platform.machine(),
                "version_compatible": opts.version_compatible,
                "hardware_compatibility": opts.hardware_compatibility,
                "batch": m.input.batch,
                "device_memory_bytes": built.device_memory_bytes,
                "dla_core": dla_core,
            },
            source={
                **m.source,
                "onnx_sha256": sha256_file(src.model),
                "build_seconds": round(built.seconds, 1),
                "builder": {**opts.record(), "workspace_mb": workspace_mb},
                **({"dla": built.dla} if built.dla is not None else {}),
            },
        )
        pkg = publish_package(out, fields, files)
    return pkg
