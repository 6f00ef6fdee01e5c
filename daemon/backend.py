"""Inference backends behind one interface (DESIGN.md §3), in the shape of Polygraphy's runners.

A backend is opened on a model file, reports its I/O spec and memory footprint, runs
``infer({input_name: batch}) -> {output_name: array}``, and is closed (``close()`` frees what it
holds; it is a context manager; ``__del__`` frees nothing). Heavy imports happen inside the
backend, and a missing one is reported with its reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import numpy as np

from edged.errors import BackendError, EngineLoadError, InferenceError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


class Backend(Protocol):
    name: str
    # True when inference runs on this process's CPU threads: its cost is then judged on CPU time, which
    # other processes' load does not inflate (wall time does, several-fold on a busy device); a GPU
    # backend's cost is its wall time.
    cpu_bound: bool

    @property
    def inputs(self) -> list[TensorInfo]: ...

    @property
    def outputs(self) -> list[TensorInfo]: ...

    @property
    def memory_bytes(self) -> int: ...

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. The arrays returned belong to the caller, who may keep them while the next
        batch runs (a backend with preallocated output buffers returns copies)."""

    def close(self) -> None: ...

    def __enter__(self) -> Backend: ...

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
}
_ORT_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


class OnnxRuntimeBackend:
    """ONNX Runtime: CPU by default, CUDA / TensorRT execution providers where installed."""

    name = "onnxruntime"

    def __init__(
        self, model: Path, threads: int = 0, providers: tuple[str, ...] = ("cpu",), optimize: bool = True
    ) -> None:
        """`optimize=False` runs the graph as written: Q/DQ pairs stay float arithmetic (simulated
        quantization, what an accuracy check of a TensorRT-bound QDQ model wants on a CPU)."""
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendError(f"onnxruntime backend unavailable: {exc}") from exc
        if not model.is_file():
            raise EngineLoadError(f"{model}: model file not found")
        available = set(ort.get_available_providers())
        wanted = [_ORT_PROVIDERS[p] for p in providers]
        missing = [p for p in wanted if p not in available]
        if missing:
            raise BackendError(f"onnxruntime here lacks {', '.join(missing)} (it has {', '.join(sorted(available))})")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        opts.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        try:
            self._session = ort.InferenceSession(str(model), sess_options=opts, providers=wanted)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types, all from RuntimeError or not
            raise EngineLoadError(f"{model}: ONNX Runtime cannot load it: {exc}") from exc
        self._model_bytes = model.stat().st_size
        self._inputs = [self._info(i) for i in self._session.get_inputs()]
        self._outputs = [self._info(o) for o in self._session.get_outputs()]
        self._output_names = [o.name for o in self._outputs]
        self.cpu_bound = self._session.get_providers() == ["CPUExecutionProvider"]
        self._closed = False

    @staticmethod
    def _info(arg: object) -> TensorInfo:
        shape = tuple(d if isinstance(d, int) else -1 for d in getattr(arg, "shape"))  # noqa: B009
        return TensorInfo(getattr(arg, "name"), shape, _ORT_TYPES.get(getattr(arg, "type"), "unknown"))  # noqa: B009

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self._outputs

    @property
    def memory_bytes(self) -> int:
        """Weights plus one batch of inputs and outputs; the arena's peak is on top of this."""
        io = sum(
            int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
            for t in self._inputs + self._outputs
            if min(t.shape) > 0 and t.dtype != "unknown"
        )
        return self._model_bytes + io

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise InferenceError("infer() on a closed backend")
        try:
            values = self._session.run(self._output_names, feeds)
        except Exception as exc:  # translate ORT's exceptions at the boundary
            raise InferenceError(f"ONNX Runtime failed on a batch: {exc}") from exc
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            del self._session

    def __enter__(self) -> OnnxRuntimeBackend:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def tensorrt_unavailable_reason() -> str | None:
    """Why the TensorRT backend cannot run here, or None when tensorrt imports and a GPU is visible."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as exc:
        return f"tensorrt backend unavailable: {exc}"
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
    deserializes it; `has_onnx` says whether the package carries the ONNX model to rebuild from."""
    if kind == "engine":
        if choice == "onnxruntime":
            raise BackendError(f"{model}: a TensorRT engine cannot run on the onnxruntime backend")
        reason = tensorrt_unavailable_reason()
        if reason:
            raise BackendError(f"{model}: {reason}")
        from .trt import TensorRTBackend

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
