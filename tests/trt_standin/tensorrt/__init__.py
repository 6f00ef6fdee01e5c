"""A stand-in for the TensorRT Python bindings (see ../README.md): enough surface for edged's backend and
builder to reach the call that fails, failing with what the real bindings raise or return."""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

import numpy as np


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def _builds() -> bool:
    """TRT_STANDIN_BUILD=1: the builder "builds" (a three-layer network, a plan of placeholder bytes, an
    engine whose inspector names its layers as a DLA build does), so what edged records of a build can be
    read without a GPU. Nothing is computed."""
    return os.environ.get("TRT_STANDIN_BUILD") == "1"


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


class DeviceType:
    GPU, DLA = range(2)


class MemoryPoolType:
    WORKSPACE = 0


class LayerInformationFormat:
    ONELINE, JSON = range(2)


class IProgressMonitor:
    def __init__(self) -> None:
        pass


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

    def create_engine_inspector(self) -> Any:
        return _Inspector()


class _Inspector:
    # the shape trtexec's profile shows for a DLA build: the DLA subgraph is one layer between copies to and
    # from the DLA's memory; the layer DLA cannot run stays a GPU layer
    LAYERS: ClassVar[list[str]] = ["input to nvm", "{ForeignNode[conv...relu]}", "relu from nvm", "nms"]

    def get_engine_information(self, fmt: int) -> str:
        return json.dumps({"Layers": self.LAYERS, "Bindings": ["input", "output"]})


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


class _Layer:
    def __init__(self, name: str) -> None:
        self.name = name


class _Network:
    _layers: ClassVar[list[str]] = ["conv", "relu", "nms"]
    num_layers = 3

    def get_layer(self, i: int) -> _Layer:
        return _Layer(self._layers[i])


class OnnxParser:
    num_errors = 0

    def __init__(self, network: _Network, logger: ILogger) -> None:
        pass

    def parse_from_file(self, path: str) -> bool:
        return True


class _TimingCache:
    def serialize(self) -> bytes:
        return b"cache"


class _Profile:
    def set_shape(self, name: str, *shapes: Any) -> None:
        pass


class _Config:
    default_device_type = DeviceType.GPU
    DLA_core = -1
    progress_monitor: Any = None

    def set_memory_pool_limit(self, pool: int, size: int) -> None:
        pass

    def set_flag(self, flag: int) -> None:
        pass

    def add_optimization_profile(self, profile: _Profile) -> int:
        return 0

    def create_timing_cache(self, data: bytes) -> _TimingCache:
        return _TimingCache()

    def set_timing_cache(self, cache: _TimingCache, ignore_mismatch: bool) -> bool:
        return True

    def get_timing_cache(self) -> _TimingCache:
        return _TimingCache()

    def can_run_on_DLA(self, layer: _Layer) -> bool:
        return layer.name != "nms"


class Builder:
    num_DLA_cores = 2

    def __init__(self, logger: ILogger) -> None:
        if not _builds():
            raise TypeError("pybind11::init(): factory function returned nullptr")

    def create_network(self, flags: int) -> _Network:
        return _Network()

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        return b"stand-in plan"
