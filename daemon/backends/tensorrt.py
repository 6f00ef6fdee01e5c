"""TensorRT (>= 10): the engine backend and the engine builder, behind the same interface as ONNX Runtime.

Thin on purpose, in Polygraphy's shape: every native status is checked and raises a typed error;
buffers (pinned host, device) and the CUDA stream are allocated once when the engine opens;
``close()`` frees them and pops nothing it did not push. TensorRT API differences between versions
live in ``_Api`` only. ``tensorrt`` and ``pycuda`` are imported inside, so a machine without them
gets "tensorrt backend unavailable: <reason>" instead of an ImportError.

Nothing here can run on the project's CI machines (no GPU); ``scripts/gpu-check.sh`` runs the tests
that exercise it on a machine that has TensorRT and a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from edged.errors import BackendError, EngineLoadError, InferenceError
from edged.models.compat import DeviceFacts, check_engine

from .base import TensorInfo

logger = logging.getLogger(__name__)

Precision = Literal["fp16", "int8", "fp32"]


def _import() -> tuple[Any, Any]:
    try:
        import pycuda.driver as cuda
        import tensorrt as trt
    except ImportError as exc:
        raise BackendError(f"tensorrt backend unavailable: {exc}") from exc
    return trt, cuda


class _Logger:
    """A trt.ILogger that forwards to logging (TensorRT calls it from its own threads)."""

    @staticmethod
    def make(trt: Any) -> Any:
        class Forward(trt.ILogger):  # type: ignore[misc]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.errors: list[str] = []

            def log(self, severity: Any, msg: str) -> None:
                if severity <= trt.ILogger.Severity.ERROR:
                    self.errors.append(msg)
                    logger.error("tensorrt: %s", msg)
                elif severity == trt.ILogger.Severity.WARNING:
                    logger.warning("tensorrt: %s", msg)
                else:
                    logger.debug("tensorrt: %s", msg)

        return Forward()


class _Api:
    """The one place that knows which TensorRT version spells what."""

    def __init__(self, trt: Any) -> None:
        self.trt = trt
        self.version = str(trt.__version__)

    def device_memory(self, engine: Any) -> int:
        size = getattr(engine, "device_memory_size_v2", None)  # 10.1+; device_memory_size is gone in 11
        return int(size if size is not None else engine.device_memory_size)

    def io(self, engine: Any) -> tuple[list[TensorInfo], list[TensorInfo]]:
        trt = self.trt
        inputs: list[TensorInfo] = []
        outputs: list[TensorInfo] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            info = TensorInfo(
                name,
                tuple(int(d) for d in engine.get_tensor_shape(name)),
                np.dtype(trt.nptype(engine.get_tensor_dtype(name))).name,
            )
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(info)
        return inputs, outputs


def device_facts(root: Path = Path("/")) -> DeviceFacts:
    """This machine's TensorRT version and GPU compute capability, plus the L4T files under `root`."""
    trt, cuda = _import()
    cuda.init()
    major, minor = cuda.Device(0).compute_capability()
    return DeviceFacts.read(root, tensorrt=str(trt.__version__), compute_capability=f"{major}.{minor}")


class TensorRTBackend:
    """A deserialized engine, one execution context, one stream, buffers allocated once."""

    name = "tensorrt"
    cpu_bound = False

    def __init__(self, engine_file: Path, compatibility: dict[str, Any], has_onnx: bool = False) -> None:
        trt, cuda = _import()
        self._cuda = cuda
        api = _Api(trt)
        check_engine(compatibility, device_facts(), str(engine_file), has_onnx)  # before deserializing
        if not engine_file.is_file():
            raise EngineLoadError(f"{engine_file}: engine file not found")
        cuda.init()
        self._ctx = cuda.Device(0).retain_primary_context()
        self._ctx.push()
        try:
            self._log = _Logger.make(trt)
            self._runtime = trt.Runtime(self._log)
            self._engine = self._runtime.deserialize_cuda_engine(engine_file.read_bytes())
            if self._engine is None:
                raise EngineLoadError(f"{engine_file}: TensorRT cannot deserialize it: {'; '.join(self._log.errors)}")
            self._context = self._engine.create_execution_context()
            if self._context is None:
                raise EngineLoadError(f"{engine_file}: no execution context (out of device memory?)")
            self._inputs, self._outputs = api.io(self._engine)
            self._device_memory = api.device_memory(self._engine)
            self._stream = cuda.Stream()
            self._host: dict[str, np.ndarray] = {}
            self._device: dict[str, Any] = {}
            for t in self._inputs + self._outputs:
                if min(t.shape) < 0:
                    raise EngineLoadError(
                        f"{engine_file}: tensor {t.name} has a dynamic shape {t.shape}; edged runs fixed-batch "
                        "engines (build with one profile, min = opt = max)"
                    )
                self._host[t.name] = cuda.pagelocked_empty(t.shape, np.dtype(t.dtype))
                self._device[t.name] = cuda.mem_alloc(self._host[t.name].nbytes)
                if not self._context.set_tensor_address(t.name, int(self._device[t.name])):
                    raise EngineLoadError(f"{engine_file}: set_tensor_address({t.name}) failed")
        except BaseException:
            self._ctx.pop()
            raise
        self._ctx.pop()
        self._closed = False

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self._outputs

    @property
    def memory_bytes(self) -> int:
        """The context's device memory plus our I/O buffers (on Jetson both come out of the shared RAM)."""
        return self._device_memory + sum(int(h.nbytes) for h in self._host.values())

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise InferenceError("infer() on a closed backend")
        cuda = self._cuda
        self._ctx.push()
        try:
            for t in self._inputs:
                np.copyto(self._host[t.name], feeds[t.name], casting="same_kind")
                cuda.memcpy_htod_async(self._device[t.name], self._host[t.name], self._stream)
            if not self._context.execute_async_v3(self._stream.handle):
                raise InferenceError(f"execute_async_v3 failed: {'; '.join(self._log.errors[-3:])}")
            for t in self._outputs:
                cuda.memcpy_dtoh_async(self._host[t.name], self._device[t.name], self._stream)
            self._stream.synchronize()
        except cuda.Error as exc:
            raise InferenceError(f"CUDA error during inference: {exc}") from exc
        finally:
            self._ctx.pop()
        return {t.name: self._host[t.name].copy() for t in self._outputs}  # callers keep them past the next batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ctx.push()
        try:
            for mem in self._device.values():
                mem.free()
            self._device.clear()
            self._host.clear()
            del self._context, self._engine, self._runtime
        finally:
            self._ctx.pop()
            self._ctx.detach()

    def __enter__(self) -> TensorRTBackend:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class BuiltEngine:
    path: Path
    tensorrt: str
    compute_capability: str
    device_memory_bytes: int
    seconds: float


def build_engine(
    onnx_file: Path,
    out: Path,
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision = "fp16",
    workspace_mb: int = 1024,
    timing_cache: Path | None = None,
    dla_core: int | None = None,
    progress: Callable[[str], None] | None = None,
    calibration: list[np.ndarray] | None = None,
    calibration_cache: Path | None = None,
) -> BuiltEngine:
    """ONNX -> a serialized engine with one fixed-shape profile.

    INT8 takes the explicit scales of a QDQ model (`edged quantize --target tensorrt`). For a float
    model, and only as a fallback, `calibration` batches (preprocessed as the daemon does) drive
    TensorRT's entropy calibrator, whose scales are kept in `calibration_cache` for the next build;
    TensorRT 10 deprecates this implicit quantization in favour of Q/DQ."""
    trt, cuda = _import()
    say = progress or (lambda m: logger.info("%s", m))
    api = _Api(trt)
    log = _Logger.make(trt)
    start = time.monotonic()
    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    try:
        major, minor = cuda.Device(0).compute_capability()
        builder = trt.Builder(log)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, log)
        if not parser.parse_from_file(str(onnx_file)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineLoadError(f"{onnx_file}: TensorRT's ONNX parser refused it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
        if precision in ("fp16", "int8"):
            config.set_flag(trt.BuilderFlag.FP16)  # layers without Q/DQ may still take fp16
        if precision == "int8":
            config.set_flag(trt.BuilderFlag.INT8)
            if calibration or (calibration_cache and calibration_cache.is_file()):
                config.int8_calibrator = _entropy_calibrator(trt, cuda, calibration or [], calibration_cache)
        if dla_core is not None:
            if builder.num_DLA_cores <= dla_core:
                raise BackendError(f"DLA core {dla_core} asked for; this device has {builder.num_DLA_cores}")
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = dla_core
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, input_shape, input_shape, input_shape)
        config.add_optimization_profile(profile)
        cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
        cache = config.create_timing_cache(cache_bytes)
        config.set_timing_cache(cache, ignore_mismatch=False)
        config.progress_monitor = _progress_monitor(trt, say)
        say(f"building a {precision} engine for {input_name}{list(input_shape)} (this takes minutes)")
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise EngineLoadError(f"{onnx_file}: the TensorRT build failed: {'; '.join(log.errors[-5:])}")
        out.write_bytes(memoryview(plan))  # the plan exactly as TensorRT wrote it: trtexec/DeepStream read it
        if timing_cache:
            timing_cache.write_bytes(memoryview(config.get_timing_cache().serialize()))
        engine = trt.Runtime(log).deserialize_cuda_engine(out.read_bytes())
        if engine is None:
            raise EngineLoadError(f"{out}: the engine just built does not deserialize: {'; '.join(log.errors)}")
        memory = api.device_memory(engine)
    finally:
        ctx.pop()
        ctx.detach()
    return BuiltEngine(out, api.version, f"{major}.{minor}", memory, time.monotonic() - start)


def cached_engine(
    onnx_file: Path,
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision,
    cache_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """`model.build_on_device`: the engine for this ONNX model on this device, built on first use.

    Cached under a key of model hash + TensorRT version + compute capability + precision + batch, so
    a TensorRT upgrade or another GPU builds anew and never loads a stale plan."""
    import hashlib

    facts = device_facts()
    h = hashlib.sha256()
    with onnx_file.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    key = f"{h.hexdigest()[:16]}-trt{facts.tensorrt}-sm{facts.compute_capability}-{precision}-b{input_shape[0]}"
    engine = cache_dir / f"{key}.engine"
    compatibility = {
        "tensorrt": facts.tensorrt,
        "compute_capability": facts.compute_capability,
        "l4t": facts.l4t,
        "platform": facts.platform,
    }
    if engine.is_file():
        return engine, compatibility
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = engine.with_suffix(".partial")
    build_engine(onnx_file, tmp, input_name, input_shape, precision, progress=progress)
    tmp.replace(engine)  # a crash mid-build leaves a .partial, never a truncated .engine
    return engine, compatibility


def _entropy_calibrator(trt: Any, cuda: Any, batches: list[np.ndarray], cache: Path | None) -> Any:
    class Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = iter(batches)
            self._device = cuda.mem_alloc(batches[0].nbytes) if batches else None

        def get_batch_size(self) -> int:
            return int(batches[0].shape[0]) if batches else 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = next(self._batches, None)
            if batch is None or self._device is None:
                return None
            cuda.memcpy_htod(self._device, np.ascontiguousarray(batch))
            return [int(self._device)]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache and cache.is_file() else None

        def write_calibration_cache(self, data: Any) -> None:
            if cache:
                cache.write_bytes(bytes(data))

    return Calibrator()


def _progress_monitor(trt: Any, say: Callable[[str], None]) -> Any:
    class Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        """Top-level phases and their steps, at most one line every 2 s (TensorRT calls from many threads)."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._steps: dict[str, int] = {}
            self._last = 0.0

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if parent_phase is None:
                self._steps[phase_name] = num_steps
                say(f"tensorrt: {phase_name}")

        def step_complete(self, phase_name: str, step: int) -> bool:
            total = self._steps.get(phase_name)
            now = time.monotonic()
            if total and now - self._last > 2:
                self._last = now
                say(f"tensorrt: {phase_name} {step + 1}/{total}")
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            self._steps.pop(phase_name, None)

    return Monitor()
