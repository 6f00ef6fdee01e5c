"""A stand-in for the TensorRT Python bindings (see ../README.md): enough surface for edged's backend and
builder to reach the call that fails, failing with what the real bindings raise or return."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return "8.5.2.2" if _fault() == "old_version" else "10.3.0"
    raise AttributeError(f"module 'tensorrt' has no attribute '{name}'")


class _Severity(int):
    pass


class ILogger:
    class Severity:
        INTERNAL_ERROR = _Severity(0)
        ERROR = _Severity(1)
        WARNING = _Severity(2)
        INFO = _Severity(3)
        VERBOSE = _Severity(4)

    def __init__(self) -> None:
        pass

    def log(self, severity: Any, msg: str) -> None:
        pass


class Logger(ILogger):
    def log(self, severity: Any, msg: str) -> None:
        pass


class BuilderFlag:
    FP16, INT8, GPU_FALLBACK, VERSION_COMPATIBLE, SPARSE_WEIGHTS = range(5)


class NetworkDefinitionCreationFlag:
    EXPLICIT_BATCH, STRONGLY_TYPED = range(2)


class TensorIOMode:
    INPUT, OUTPUT = range(2)


class _Engine:
    num_io_tensors = 2
    device_memory_size_v2 = 1 << 20
    _tensors: ClassVar[dict[str, tuple[int, ...]]] = {"input": (4, 256, 256, 3), "output": (4, 896, 16)}

    def get_tensor_name(self, i: int) -> str:
        return list(self._tensors)[i]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name]

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def get_tensor_mode(self, name: str) -> int:
        return TensorIOMode.INPUT if name == "input" else TensorIOMode.OUTPUT

    def create_execution_context(self) -> Any:
        return _Context()


class _Context:
    def set_tensor_address(self, name: str, address: int) -> bool:
        return True


def nptype(dtype: str) -> type:
    return np.float32


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        if _fault() == "nullptr":
            raise TypeError("pybind11::init(): factory function returned nullptr")
        self._logger = logger
        self.DLA_core = -1
        self.engine_host_code_allowed = False

    def deserialize_cuda_engine(self, plan: bytes) -> Any:
        if _fault() == "corrupt":
            self._logger.log(  # what TensorRT 10 logs for a plan that is not one
                ILogger.Severity.ERROR,
                "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion "
                "plan->header.magicTag == rt::kPLAN_MAGIC_TAG failed.)",
            )
            return None
        return _Engine()


class Builder:
    def __init__(self, logger: ILogger) -> None:
        raise TypeError("pybind11::init(): factory function returned nullptr")
