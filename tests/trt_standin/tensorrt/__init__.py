"""A stand-in for the TensorRT Python bindings (see ../README.md): enough surface for edged's backend and
builder to reach the call that fails, failing with what the real bindings raise or return."""

from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any, ClassVar

import numpy as np


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def _builds() -> bool:
    """TRT_STANDIN_BUILD=1: the builder "builds" (a three-layer network, a plan of placeholder bytes, an
    engine whose inspector names its layers as a DLA build does), so what edged records of a build can be
    read without a GPU. Nothing is computed."""
    return os.environ.get("TRT_STANDIN_BUILD") == "1"


# What each build was asked, in order (tests clear it): the ONNX file parsed, the network's creation flags,
# the builder flags set, the profile's shapes, whether a calibrator calibrated or read its cache.
BUILDS: list[dict[str, Any]] = []
# The calls that do CUDA work inside TensorRT (deserialize, create a context, execute, destroy an engine), each
# with its thread: (call, thread ident). Tests swap in a fresh list.
CALLS: list[tuple[str, int]] = []


def _rec(name: str) -> None:
    CALLS.append((name, threading.get_ident()))


# A stand-in plan: these bytes, then the profile's input name and shape as JSON (the engine deserialized from
# it has that input and an output of as many rows), so an engine built at batch B reports batch B.
PLAN_MAGIC = b"stand-in plan"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # TRT_STANDIN_VERSION: the version the stand-in says it is (10.3.0, JetPack 6.1/6.2)
        return "8.5.2.2" if _fault() == "old_version" else os.environ.get("TRT_STANDIN_VERSION", "10.3.0")
    raise AttributeError(f"module 'tensorrt' has no attribute '{name}'")


def _version() -> tuple[int, ...]:
    return tuple(int(p) for p in str(__getattr__("__version__")).split(".")[:2])


# What the real bindings 10.1-10.x say, through PyErr_WarnEx, whenever Python reads or sets
# IBuilderConfig.int8_calibrator (utils::deprecateMember in python/src/infer/pyCore.cpp)
CALIBRATOR_DEPRECATION = "Use Deprecated in TensorRT 10.1. Superseded by explicit quantization. instead."


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


class IInt8EntropyCalibrator2:
    def __init__(self) -> None:
        pass


class _Engine:
    num_io_tensors = 2
    device_memory_size_v2 = 1 << 20

    def __init__(self, plan: bytes = b"") -> None:
        name, shape = "input", (4, 256, 256, 3)
        if plan.startswith(PLAN_MAGIC) and len(plan) > len(PLAN_MAGIC):
            name, dims = json.loads(plan[len(PLAN_MAGIC) :])
            shape = tuple(dims)
        self._input = name
        self._tensors = {name: shape, "output": (shape[0], 896, 16)}

    def get_tensor_name(self, i: int) -> str:
        return list(self._tensors)[i]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name]

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def get_tensor_mode(self, name: str) -> int:
        return TensorIOMode.INPUT if name == self._input else TensorIOMode.OUTPUT

    def create_execution_context(self) -> Any:
        _rec("create_execution_context")
        return _Context()

    def __del__(self) -> None:
        _rec("engine.destroy")

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

    def execute_async_v3(self, stream_handle: int) -> bool:
        _rec("execute_async_v3")
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
        _rec("deserialize_cuda_engine")
        if _fault() == "corrupt":
            self._logger.log(  # what TensorRT 10 logs for a plan that is not one
                ILogger.Severity.ERROR,
                "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion "
                "plan->header.magicTag == rt::kPLAN_MAGIC_TAG failed.)",
            )
            return None
        return _Engine(bytes(plan))


class _Layer:
    def __init__(self, name: str) -> None:
        self.name = name


class _Network:
    _layers: ClassVar[list[str]] = ["conv", "relu", "nms"]
    num_layers = 3

    def __init__(self, flags: int) -> None:
        self.flags = flags
        self.onnx = ""

    def get_layer(self, i: int) -> _Layer:
        return _Layer(self._layers[i])


class OnnxParser:
    num_errors = 0

    def __init__(self, network: _Network, logger: ILogger) -> None:
        self._network = network

    def parse_from_file(self, path: str) -> bool:
        self._network.onnx = path
        return True


class _TimingCache:
    def serialize(self) -> bytes:
        return b"cache"


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

    def set_shape(self, name: str, *shapes: Any) -> None:
        self.shapes[name] = tuple(tuple(int(d) for d in s) for s in shapes)


class _Config:
    default_device_type = DeviceType.GPU
    DLA_core = -1
    progress_monitor: Any = None

    def __init__(self) -> None:
        self.flags: set[int] = set()
        self.profiles: list[_Profile] = []
        self.calibrator: Any = None  # what TensorRT itself holds (its C++ side reads it without a warning)

    @property
    def int8_calibrator(self) -> Any:
        if _version() >= (10, 1):
            warnings.warn(CALIBRATOR_DEPRECATION, DeprecationWarning, stacklevel=2)
        return self.calibrator

    @int8_calibrator.setter
    def int8_calibrator(self, calibrator: Any) -> None:
        if _version() >= (10, 1):
            warnings.warn(CALIBRATOR_DEPRECATION, DeprecationWarning, stacklevel=2)
        self.calibrator = calibrator

    def set_memory_pool_limit(self, pool: int, size: int) -> None:
        pass

    def set_flag(self, flag: int) -> None:
        self.flags.add(flag)

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

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
        return _Network(flags)

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        shapes = [(name, s) for p in config.profiles for name, s in p.shapes.items()]
        record: dict[str, Any] = {
            "onnx": network.onnx,
            "network_flags": network.flags,
            "flags": sorted(config.flags),
            "profiles": [p.shapes for p in config.profiles],
            "calibration": None,
        }
        calibrator = config.calibrator
        if calibrator is not None:  # as TensorRT does: its cache if it has one, else every batch, then the cache
            if calibrator.read_calibration_cache():
                record["calibration"] = "cache"
            else:
                n = 0
                while calibrator.get_batch(["input"]) is not None:
                    n += 1
                calibrator.write_calibration_cache(b"stand-in calibration cache")
                record["calibration"] = f"{n} batches"
        BUILDS.append(record)
        name, (_, opt, _) = shapes[0] if shapes else ("input", ((), (4, 256, 256, 3), ()))
        return PLAN_MAGIC + json.dumps([name, list(opt)]).encode()
