"""Inference backends behind one interface (docs/architecture.md), in the shape of Polygraphy's runners.

A backend is opened on a model file, reports its I/O spec and memory footprint, runs
``infer({input_name: batch}) -> {output_name: array}``, and is closed (``close()`` frees what it
holds; it is a context manager; ``__del__`` frees nothing). Heavy imports happen inside the
backend, and a missing one is reported with its reason.

    base.py         the Backend protocol, TensorInfo
    onnxruntime.py  ONNX Runtime (CPU; CUDA / TensorRT execution providers where installed)
    tensorrt/       TensorRT engines: the backend (``__init__.py``: tensorrt and the CUDA binding imported
                    inside, every CUDA call on the engine's own thread), ``api.py`` (the one TensorRT version
                    adapter, 8.6 to 11.x, and the translation of native failures), ``build.py`` (the engine
                    builder: `edged build-engine`, model.build_on_device), ``cuda.py`` (the CUDA driver calls
                    behind one adapter: cuda-python, else pycuda)

``open_backend`` picks one for a model file; ``tensorrt_unavailable_reason`` says why TensorRT cannot
run here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from edged.errors import BackendError
from edged.models.compat import unsupported_tensorrt

from .base import Backend, TensorInfo
from .onnxruntime import OnnxRuntimeBackend

__all__ = ["Backend", "OnnxRuntimeBackend", "TensorInfo", "open_backend", "tensorrt_unavailable_reason"]

logger = logging.getLogger(__name__)


def tensorrt_unavailable_reason() -> str | None:
    """Why the TensorRT backend cannot run here, or None when tensorrt imports and a GPU is visible."""
    try:
        import tensorrt
    except ImportError as exc:
        return f"tensorrt backend unavailable: {exc}"
    refused = unsupported_tensorrt(str(getattr(tensorrt, "__version__", "unknown")))
    if refused:
        return f"tensorrt backend unavailable: {refused}"
    if not any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvhost-gpu", "/dev/nvgpu/igpu0/ctrl")):
        return "tensorrt backend unavailable: no NVIDIA GPU device node"
    return None


def open_backend(
    kind: Literal["onnx", "engine"],
    model: Path,
    choice: Literal["auto", "onnxruntime", "tensorrt"] = "auto",
    threads: int = 0,
    providers: tuple[str, ...] = ("cpu",),
    compatibility: dict[str, Any] | None = None,
    has_onnx: bool = False,
) -> Backend:
    """Pick and open a backend. `auto`: TensorRT for engines, ONNX Runtime for ONNX models.

    An engine's `compatibility` (from its manifest) is checked against this device before TensorRT
    deserializes it; `has_onnx` says whether the package carries the ONNX model to rebuild from. An engine that
    cannot load here, for whatever reason (no GPU, TensorRT missing or unsupported, incompatible, corrupt, out
    of memory), raises EngineLoadError (IncompatibleEngine when the manifest already says so)."""
    if kind == "engine":
        if choice == "onnxruntime":
            raise BackendError(f"{model}: a TensorRT engine cannot run on the onnxruntime backend")
        # no device-node guess here: the backend starts CUDA, and a failure to (no GPU, a driver that does not
        # start, no tensorrt/pycuda) is an EngineLoadError, so a start rolls the version back, a swap refuses it
        from .tensorrt import TensorRTBackend

        logger.info("opening %s on tensorrt (pid %d)", model, os.getpid())
        return TensorRTBackend(model, compatibility or {}, has_onnx)
    if choice == "tensorrt":
        reason = tensorrt_unavailable_reason()
        raise BackendError(
            f"{model}: backend 'tensorrt' takes a TensorRT engine package (edged build-engine), this is an ONNX "
            "model" + (f" ({reason})" if reason else "")
        )
    logger.info("opening %s on onnxruntime (threads=%s, providers=%s, pid %d)", model, threads, providers, os.getpid())
    return OnnxRuntimeBackend(model, threads=threads, providers=providers)
