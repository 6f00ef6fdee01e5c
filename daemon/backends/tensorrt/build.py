"""TensorRT engine building: ONNX -> a serialized, fixed-shape engine (``edged build-engine``,
``model.build_on_device``). Version differences go through ``api.TrtApi``, CUDA through ``cuda``
(cuda-python or pycuda); whatever TensorRT or CUDA raise becomes a ``BackendError`` naming the reason
(``api.translate``). A build runs on its caller's thread from the context's push to its pop: everything
that holds device memory (the calibrator's buffer, the engine deserialized to check the plan) is freed
before the pop."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.errors import BackendError, EdgedError, EngineLoadError

from .api import BuilderOptions, Precision, TrtApi, TrtModules, device_facts, load_modules, onnx_precision, translate
from .cuda import CudaApi, CudaError
from .uint8 import trt_ready

__all__ = [
    "BuilderOptions",
    "BuiltEngine",
    "Precision",
    "build_engine",
    "cached_engine",
    "cached_engines",
    "make_logger",
]

logger = logging.getLogger(__name__)


def make_logger(trt: Any) -> Any:
    """A trt.ILogger that forwards to logging and keeps the errors (TensorRT calls it from its threads)."""

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


@dataclass(frozen=True)
class BuiltEngine:
    path: Path
    tensorrt: str
    compute_capability: str
    device_memory_bytes: int  # the context's scratch memory plus the weights (the plan's size)
    seconds: float
    precision: Precision
    # a DLA build: the layers the builder placed on DLA and on the GPU, and the engine's layers as built
    dla: dict[str, Any] | None = None


def build_engine(
    onnx_file: Path,
    out: Path,
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision | None = None,
    workspace_mb: int = 1024,
    timing_cache: Path | None = None,
    dla_core: int | None = None,
    progress: Callable[[str], None] | None = None,
    calibration: list[np.ndarray] | None = None,
    calibration_cache: Path | None = None,
    options: BuilderOptions | None = None,
    modules: TrtModules | None = None,
) -> BuiltEngine:
    """ONNX -> a serialized engine with one fixed-shape profile.

    INT8 takes the explicit scales of a QDQ model (`edged quantize --target tensorrt`). For a float
    model, and only as a fallback on TensorRT 8.6-10.11 (deprecated from 10.1: `TrtApi.set_calibrator`),
    `calibration` batches (preprocessed as the daemon does) drive TensorRT's entropy calibrator, whose
    scales are kept in `calibration_cache`. From 10.12 (strongly typed) the precision comes from the model:
    a precision the model does not carry is refused.
    `precision` None: `TrtApi.default_precision` (the model's own on 11, else int8 for Q/DQ, fp16)."""
    m = modules or load_modules()
    version: str | None = None
    try:
        api = TrtApi(m.trt)
        version = api.version
        carried = onnx_precision(onnx_file)
        precision = precision or api.default_precision(carried)
        calibrate = precision == "int8" and bool(calibration or (calibration_cache and calibration_cache.is_file()))
        api.check_precision(precision, carried, dla_core is not None, calibrate)
        opts = options or BuilderOptions()
        if dla_core is not None and opts.hardware_compatibility != "none":
            raise BackendError("a DLA engine cannot be hardware-compatible: drop --hardware-compatibility")
        batches = (calibration or []) if calibrate else None
        with tempfile.TemporaryDirectory(prefix="edged-trt-") as work:
            parsed = trt_ready(onnx_file, Path(work))  # a uint8 (folded) input straight into its Cast: uint8.py
            if parsed != onnx_file and progress is not None:
                progress(f"{input_name} is uint8 pixels: the engine takes bytes (the Cast to float moved first)")
            args = (parsed, out, input_name, input_shape, precision, workspace_mb, timing_cache, dla_core, progress)
            return _build(api, m, *args, batches, calibration_cache, opts)
    except (EdgedError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise translate(exc, f"{onnx_file}: cannot build a TensorRT engine", BackendError, version) from exc


def _build(
    api: TrtApi,
    m: TrtModules,
    onnx_file: Path,
    out: Path,
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision,
    workspace_mb: int,
    timing_cache: Path | None,
    dla_core: int | None,
    progress: Callable[[str], None] | None,
    calibration: list[np.ndarray] | None,
    calibration_cache: Path | None,
    opts: BuilderOptions,
) -> BuiltEngine:
    trt, cuda = m.trt, m.cuda
    say = progress or (lambda msg: logger.info("%s", msg))
    start = time.monotonic()
    cuda.init()
    major, minor = cuda.compute_capability(0)
    ctx = cuda.retain_primary(0)
    try:
        cuda.push(ctx)
    except BaseException:
        cuda.release(ctx)
        raise
    calibrator: Any = None
    engine: Any = None
    runtime: Any = None
    try:
        log = make_logger(trt)
        builder = trt.Builder(log)
        network = builder.create_network(api.network_flags())
        parser = trt.OnnxParser(network, log)
        if not parser.parse_from_file(str(onnx_file)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineLoadError(f"{onnx_file}: TensorRT's ONNX parser refused it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
        api.set_precision(config, precision)
        if calibration is not None:
            calibrator = _entropy_calibrator(trt, cuda, calibration, calibration_cache)
            api.set_calibrator(config, calibrator)
        api.set_options(config, opts)
        on_dla: list[str] = []
        on_gpu: list[str] = []
        if dla_core is not None:
            if builder.num_DLA_cores <= dla_core:
                raise BackendError(f"DLA core {dla_core} asked for; this device has {builder.num_DLA_cores}")
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = dla_core
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
            on_dla, on_gpu = api.dla_placement(network, config)
            say(f"DLA core {dla_core}: {len(on_dla)} layers on DLA, {len(on_gpu)} fall back to the GPU")
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, input_shape, input_shape, input_shape)
        config.add_optimization_profile(profile)
        cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
        api.timing_cache(config, cache_bytes, str(timing_cache))
        if api.has_progress_monitor:  # 10.0+
            config.progress_monitor = _progress_monitor(trt, say)
        say(f"building a {precision} engine for {input_name}{list(input_shape)} (this takes minutes)")
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise EngineLoadError(f"{onnx_file}: the TensorRT build failed: {'; '.join(log.errors[-5:])}")
        out.write_bytes(memoryview(plan))  # the plan exactly as TensorRT wrote it: trtexec/DeepStream read it
        if timing_cache:
            cache = config.get_timing_cache()
            if cache is not None:
                timing_cache.write_bytes(memoryview(cache.serialize()))
        runtime = trt.Runtime(log)
        if opts.version_compatible:
            runtime.engine_host_code_allowed = True
        engine = runtime.deserialize_cuda_engine(out.read_bytes())
        if engine is None:
            raise EngineLoadError(f"{out}: the engine just built does not deserialize: {'; '.join(log.errors)}")
        memory = api.device_memory(engine) + out.stat().st_size
        dla = None
        if dla_core is not None:
            dla = {"core": dla_core, "layers": on_dla, "gpu_layers": on_gpu}
            built_layers = api.engine_layers(engine)
            if built_layers is not None:
                dla["engine_layers"] = built_layers
    finally:
        # inside the context, before its pop: the calibrator's device buffer and the check's engine
        engine = runtime = None
        if calibrator is not None:
            calibrator.free()
        try:
            cuda.pop()
        finally:
            cuda.release(ctx)
    seconds = time.monotonic() - start
    return BuiltEngine(out, api.version, f"{major}.{minor}", memory, seconds, precision, dla)


def cached_engine(
    onnx_file: Path,
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision | None,
    cache_dir: Path,
    progress: Callable[[str], None] | None = None,
    modules: TrtModules | None = None,
) -> tuple[Path, dict[str, Any]]:
    """`model.build_on_device`: the engine for this ONNX model on this device, built on first use.

    `precision` None: what the model is, as `build_engine` picks it (the model's own precision from
    TensorRT 10.12, strongly typed; int8 for a Q/DQ model and fp16 for a float one before). Cached under a
    key of model hash + TensorRT version + compute capability + precision + batch, so a TensorRT upgrade or
    another GPU builds anew and never loads a stale plan."""
    m = modules or load_modules()
    try:
        facts = device_facts(m)
    except (CudaError, RuntimeError, TypeError) as exc:
        raise translate(exc, "cannot build an engine on this device", BackendError) from exc
    precision = precision or TrtApi(m.trt).default_precision(onnx_precision(onnx_file))
    h = hashlib.sha256()
    with onnx_file.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    key = f"{h.hexdigest()[:16]}-trt{facts.tensorrt}-sm{facts.compute_capability}-{precision}-b{input_shape[0]}"
    plan_file = cache_dir / f"{key}.engine"
    compatibility = {
        "tensorrt": facts.tensorrt,
        "compute_capability": facts.compute_capability,
        "l4t": facts.l4t,
        "platform": facts.platform,
    }
    if plan_file.is_file():
        return plan_file, compatibility
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = plan_file.with_suffix(".partial")
    build_engine(onnx_file, tmp, input_name, input_shape, precision, progress=progress, modules=m)
    tmp.replace(plan_file)  # a crash mid-build leaves a .partial, never a truncated .engine
    return plan_file, compatibility


def cached_engines(
    onnx_files: dict[int, Path],
    input_name: str,
    input_shape: tuple[int, ...],
    precision: Precision | None,
    cache_dir: Path,
    progress: Callable[[str], None] | None = None,
    modules: TrtModules | None = None,
) -> tuple[dict[int, Path], dict[str, Any]]:
    """`cached_engine` for each fixed batch of a package (`onnx_files`: batch -> its ONNX model; `input_shape`
    at any batch): one engine per batch, the largest first, every one at the precision the largest resolves
    to. Each is cached under its own key (its model's hash, its batch)."""
    m = modules or load_modules()
    say = progress or (lambda msg: logger.info("%s", msg))
    order = sorted(onnx_files, reverse=True)
    precision = precision or TrtApi(m.trt).default_precision(onnx_precision(onnx_files[order[0]]))
    engines: dict[int, Path] = {}
    compatibility: dict[str, Any] = {}
    for i, b in enumerate(order):
        if len(order) > 1:
            say(f"engine for batch {b} ({i + 1} of {len(order)})")
        shape = (b, *input_shape[1:])
        engines[b], compatibility = cached_engine(onnx_files[b], input_name, shape, precision, cache_dir, progress, m)
    return dict(sorted(engines.items())), compatibility


def _entropy_calibrator(trt: Any, cuda: CudaApi, batches: list[np.ndarray], cache_file: Path | None) -> Any:
    """TensorRT's entropy calibrator over `batches`; its device buffer is the builder's to `free()` while the
    context is current (garbage collection would free it after the pop)."""

    class Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = iter(batches)
            self._device = cuda.mem_alloc(batches[0].nbytes) if batches else None

        def free(self) -> None:
            if self._device is not None:
                device, self._device = self._device, None
                cuda.mem_free(device)

        def get_batch_size(self) -> int:
            return int(batches[0].shape[0]) if batches else 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = next(self._batches, None)
            if batch is None or self._device is None:
                return None
            cuda.htod(self._device, batch)
            return [cuda.device_ptr(self._device)]

        def read_calibration_cache(self) -> bytes | None:
            return cache_file.read_bytes() if cache_file and cache_file.is_file() else None

        def write_calibration_cache(self, data: Any) -> None:
            if cache_file:
                cache_file.write_bytes(bytes(data))

    return Calibrator()


def _progress_monitor(trt: Any, say: Callable[[str], None]) -> Any:
    class Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        """Every phase's steps, nested ones too, at most one line every 2 s (TensorRT calls from many threads).
        A line means progress: the daemon extends systemd's start timeout on each, so a long nested phase
        (tactic timing) does not look like a hung start."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._steps: dict[str, int] = {}
            self._last = 0.0

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self._steps[phase_name] = num_steps
            if parent_phase is None:
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
