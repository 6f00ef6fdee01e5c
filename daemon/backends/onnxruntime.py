"""ONNX Runtime: CPU by default, CUDA / TensorRT execution providers where installed.

``onnxruntime`` is imported when a backend opens, so a machine without it gets "onnxruntime backend
unavailable: <reason>" instead of an ImportError at import time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType

import numpy as np

from edged.daemon.host.extras import missing_message
from edged.errors import BackendError, EngineLoadError, InferenceError
from edged.models.footprint import working_bytes

from .base import TensorInfo

logger = logging.getLogger(__name__)

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
        except ImportError as exc:  # not installed (named with its extra), or installed and broken (its reason)
            fix = missing_message(exc.name or "") if isinstance(exc, ModuleNotFoundError) else None
            raise BackendError(f"onnxruntime backend unavailable: {fix or exc}") from exc
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
        try:
            self._arena_bytes = working_bytes(model)
        except EngineLoadError as exc:  # a graph the planner cannot read (ONNX Runtime could): count what is known
            logger.warning("%s: its arena is not counted in its memory figure: %s", model, exc)
            self._arena_bytes = 0
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
        """Weights, one batch of inputs and outputs, and ONNX Runtime's arena (the planned peak of intermediate
        tensors times footprint.ARENA_FACTOR: what admission counted for this model)."""
        io = sum(
            int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
            for t in self._inputs + self._outputs
            if min(t.shape) > 0 and t.dtype != "unknown"
        )
        return self._model_bytes + io + self._arena_bytes

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
