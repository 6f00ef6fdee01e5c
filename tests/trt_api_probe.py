"""Run by tests/test_tensorrt_api.py in a subprocess, with one version's real TensorRT bindings on
sys.path and a stand-in libnvinfer (every factory returns NULL, as libnvinfer does when CUDA cannot start).
Prints JSON: the bindings' version, which names of edged's TensorRT surface (trt_api.TRT_API) exist, and
what edged's backend and builder raise when they reach their first native call.

An API check, not an execution test: nothing is built or run on a GPU."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

trt: Any = importlib.import_module("tensorrt_bindings")
sys.modules["tensorrt"] = trt  # what `import tensorrt` gives once the metapackage is installed

from edged.daemon.backends.tensorrt import TensorRTBackend  # noqa: E402
from edged.daemon.backends.tensorrt.api import TRT_API, TrtApi, TrtModules  # noqa: E402
from edged.daemon.backends.tensorrt.build import (  # noqa: E402
    _entropy_calibrator,
    _progress_monitor,
    build_engine,
    cached_engines,
    make_logger,
)
from edged.daemon.backends.tensorrt.cuda import Pycuda  # noqa: E402
from edged.errors import EdgedError  # noqa: E402
from tests.trt_standin.pycuda import driver  # noqa: E402  (CUDA itself "starts"; TensorRT cannot)

cuda = Pycuda(driver)


def exists(name: str) -> bool:
    obj: Any = trt
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def outcome(call: Any) -> str:
    try:
        call()
    except EdgedError as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # what the check reports as untranslated
        return f"UNTRANSLATED {type(exc).__name__}: {exc}"
    return "no error"


def main() -> None:
    removed = os.environ.get("TRT_API_REMOVE")
    if removed:  # the check's own test: this version without one attribute
        owner, _, attr = removed.rpartition(".")
        delattr(getattr(trt, owner) if owner else trt, attr)
    tmp = Path(sys.argv[1])
    onnx_fp32, plan = Path(sys.argv[2]), tmp / "model.engine"
    plan.write_bytes(b"plan")
    modules = TrtModules(trt, cuda)
    report: dict[str, Any] = {
        "version": str(trt.__version__),
        "surface": {n: exists(n) for kind in ("required", "optional") for n in TRT_API[kind]},
    }
    try:
        api = TrtApi(trt)
        report["adapter"] = {"network_flags": api.network_flags(), "strongly_typed": api.strongly_typed}
    except Exception as exc:
        report["adapter"] = {"error": f"{type(exc).__name__}: {exc}"}
    # edged's Python subclasses of TensorRT's interfaces, built on the real base classes (no native call)
    report["subclasses"] = {
        "logger": outcome(lambda: make_logger(trt).log(trt.ILogger.Severity.WARNING, "probe")),
        "monitor": outcome(lambda: _progress_monitor(trt, print).phase_start("probe", None, 1))
        if hasattr(trt, "IProgressMonitor")
        else "absent",
        "calibrator": outcome(lambda: _entropy_calibrator(trt, cuda, [], None).get_batch(["input"]))
        if hasattr(trt, "IInt8EntropyCalibrator2")
        else "absent",
    }
    report["load"] = outcome(lambda: TensorRTBackend(plan, {"tensorrt": str(trt.__version__)}, modules=modules))
    shape = (4, 256, 256, 3)
    report["build_fp16"] = outcome(lambda: build_engine(onnx_fp32, tmp / "a", "input", shape, "fp16", modules=modules))
    report["build_default"] = outcome(lambda: build_engine(onnx_fp32, tmp / "c", "input", shape, modules=modules))
    report["build_fp32"] = outcome(lambda: build_engine(onnx_fp32, tmp / "b", "input", shape, "fp32", modules=modules))
    # model.build_on_device with no build_precision: what the model is, as the loader asks it
    report["build_on_device"] = outcome(
        lambda: cached_engines({4: onnx_fp32}, "input", shape, None, tmp / "engines", modules=modules)
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
