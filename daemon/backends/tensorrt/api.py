"""The one place that knows which TensorRT version spells what, and how its failures read.

Supported: TensorRT 8.6 (JetPack 6.0) to 11.x. What differs between them, and nowhere else:

    network flags     8.6: EXPLICIT_BATCH (0 makes an implicit-batch network the ONNX parser refuses);
                      10.0-10.11: 0 (explicit batch is the only mode); 10.12-10.x: STRONGLY_TYPED;
                      11: 0 (every network is strongly typed, the flag is deprecated and ignored)
    precision         8.6-10.11 (weakly typed): BuilderFlag.FP16 / INT8 (+ the entropy calibrator for
                      float models); 10.12+ (weak typing deprecated in 10.12, removed in 11): strongly
                      typed, no precision flags: fp16 comes from an fp16 ONNX model, int8 from its Q/DQ
                      nodes, fp32 from an fp32 one; a precision the model does not carry is refused
                      with the reason
    calibrator        8.6-10.0: IBuilderConfig.int8_calibrator. 10.1-10.11: the same property, the only way
                      to hand TensorRT a calibrator there, deprecated in 10.1 ("superseded by explicit
                      quantization": no replacement setter exists) and warned on each use; set with
                      that one DeprecationWarning silenced and a log line naming Q/DQ, the route that
                      stays. 10.12+: refused (strongly typed networks take no calibrator); gone in 11
    progress monitor  IProgressMonitor from 10.0
    device memory     device_memory_size_v2 from 10.1 (device_memory_size is gone in 11)
    hardware compat.  HardwareCompatibilityLevel.AMPERE_PLUS from 8.6, SAME_COMPUTE_CAPABILITY from 10.x

``translate`` turns what TensorRT and CUDA (``cuda.CudaError``, from either binding) raise into the
project's errors: a failed cuInit,
TensorRT's ``TypeError: pybind11::init(): factory function returned nullptr`` (what ``trt.Builder`` and
``trt.Runtime`` raise when CUDA cannot start), out of device memory, an attribute another TensorRT
version lacks.

``TRT_API`` lists every TensorRT class member the backend and builder use, so a test checks it against
the real bindings of each supported version (tests/test_tensorrt_api.py): ``required`` must exist in
all of them, ``optional`` only where ``TrtApi`` looks before it uses it.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edged.errors import BackendError
from edged.models.compat import DeviceFacts, unsupported_tensorrt

from .cuda import CudaApi, load_cuda

logger = logging.getLogger(__name__)

Precision = Literal["fp16", "int8", "fp32"]

# Every TensorRT name the backend and builder touch: "Class.member" or a module-level "name".
TRT_API: dict[str, tuple[str, ...]] = {
    "required": (
        "ILogger",
        "ILogger.Severity",
        "Builder",
        "Builder.create_network",
        "Builder.create_builder_config",
        "Builder.create_optimization_profile",
        "Builder.build_serialized_network",
        "Builder.num_DLA_cores",
        "NetworkDefinitionCreationFlag",
        "BuilderFlag",
        "HardwareCompatibilityLevel",
        "OnnxParser",
        "OnnxParser.parse_from_file",
        "OnnxParser.num_errors",
        "OnnxParser.get_error",
        "IBuilderConfig.set_memory_pool_limit",
        "IBuilderConfig.set_flag",
        "IBuilderConfig.add_optimization_profile",
        "IBuilderConfig.create_timing_cache",
        "IBuilderConfig.set_timing_cache",
        "IBuilderConfig.get_timing_cache",
        "IBuilderConfig.default_device_type",
        "IBuilderConfig.DLA_core",
        "IBuilderConfig.builder_optimization_level",
        "IBuilderConfig.hardware_compatibility_level",
        "IOptimizationProfile.set_shape",
        "ITimingCache.serialize",
        "MemoryPoolType.WORKSPACE",
        "BuilderFlag.GPU_FALLBACK",
        "BuilderFlag.VERSION_COMPATIBLE",
        "BuilderFlag.SPARSE_WEIGHTS",
        "DeviceType.DLA",
        "HardwareCompatibilityLevel.AMPERE_PLUS",
        "Runtime",
        "Runtime.deserialize_cuda_engine",
        "Runtime.DLA_core",
        "Runtime.engine_host_code_allowed",
        "ICudaEngine.num_io_tensors",
        "ICudaEngine.get_tensor_name",
        "ICudaEngine.get_tensor_shape",
        "ICudaEngine.get_tensor_dtype",
        "ICudaEngine.get_tensor_mode",
        "ICudaEngine.create_execution_context",
        "TensorIOMode.INPUT",
        "IExecutionContext.set_tensor_address",
        "IExecutionContext.execute_async_v3",
        "nptype",
        # a DLA build's record (8.2+): where the builder places each layer, the engine's layers as built
        "INetworkDefinition.num_layers",
        "INetworkDefinition.get_layer",
        "ILayer.name",
        "IBuilderConfig.can_run_on_DLA",
        "ICudaEngine.create_engine_inspector",
        "EngineInspector.get_engine_information",
        "LayerInformationFormat.JSON",
    ),
    "optional": (
        "NetworkDefinitionCreationFlag.EXPLICIT_BATCH",  # 8.6 needs it; gone in 11
        "NetworkDefinitionCreationFlag.STRONGLY_TYPED",  # 9.x+; what 10.12-10.x builds with
        "BuilderFlag.FP16",  # gone in 11
        "BuilderFlag.INT8",  # gone in 11
        "IBuilderConfig.int8_calibrator",  # gone in 11
        "IInt8EntropyCalibrator2",  # gone in 11
        "IProgressMonitor",  # 10.0+
        "IBuilderConfig.progress_monitor",  # 10.0+
        "ICudaEngine.device_memory_size_v2",  # 10.1+
        "ICudaEngine.device_memory_size",  # gone in 11
        "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY",  # 10.x
    ),
}

# TensorRT 10.12 deprecated weak typing (the precision builder flags); 11 removed it
STRONGLY_TYPED_FROM = (10, 12)
# IBuilderConfig.int8_calibrator (and every calibrator class): deprecated in 10.1, removed in 11. The bindings
# warn through PyErr_WarnEx with this text on every read and write of the property.
CALIBRATOR_DEPRECATED_FROM = (10, 1)
CALIBRATOR_DEPRECATION = r".*Superseded by explicit quantization"
HARDWARE_LEVELS = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-cc": "SAME_COMPUTE_CAPABILITY"}


@dataclass(frozen=True)
class TrtModules:
    """The TensorRT module and the CUDA binding's adapter (`cuda`): the seam where a test hands in
    stand-ins (`TrtModules(standin_trt, Pycuda(standin_driver))`)."""

    trt: Any
    cuda: CudaApi


def load_modules(error: type[BackendError] = BackendError) -> TrtModules:
    """tensorrt and a CUDA binding (cuda-python, else pycuda: `cuda.load_cuda`), or `error` saying which
    is missing."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise error(f"tensorrt backend unavailable: {exc}") from exc
    try:
        cuda = load_cuda(error)
    except BackendError as exc:
        raise error(f"tensorrt backend unavailable: {exc}") from exc
    return TrtModules(trt, cuda)


def device_facts(modules: TrtModules | None = None, root: Path = Path("/")) -> DeviceFacts:
    """This machine's TensorRT version and GPU compute capability (CUDA must start), plus the L4T and
    device-tree files under `root`. `modules`: tensorrt and the CUDA binding, imported when None."""
    m = modules or load_modules()
    m.cuda.init()
    major, minor = m.cuda.compute_capability(0)
    return DeviceFacts.read(root, tensorrt=str(m.trt.__version__), compute_capability=f"{major}.{minor}")


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def onnx_precision(path: Path) -> Precision:
    """What an ONNX model carries: int8 (Q/DQ nodes), fp16 (fp16 inputs or weights) or fp32."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.node):
        return "int8"
    fp16 = onnx.TensorProto.FLOAT16
    if any(t.data_type == fp16 for t in g.initializer) or any(i.type.tensor_type.elem_type == fp16 for i in g.input):
        return "fp16"
    return "fp32"


@dataclass(frozen=True)
class BuilderOptions:
    """trtexec's names: --builderOptimizationLevel, --versionCompatible, --hardwareCompatibilityLevel,
    --sparsity=enable."""

    optimization_level: int | None = None
    version_compatible: bool = False
    hardware_compatibility: Literal["none", "ampere+", "same-cc"] = "none"
    sparsity: bool = False

    def record(self) -> dict[str, Any]:
        return {
            "optimization_level": self.optimization_level,
            "version_compatible": self.version_compatible,
            "hardware_compatibility": self.hardware_compatibility,
            "sparsity": self.sparsity,
        }


class TrtApi:
    """TensorRT through one version's spelling. Refuses a version outside 8.6-11.x by name."""

    def __init__(self, trt: Any) -> None:
        self.trt = trt
        self.version = str(getattr(trt, "__version__", "unknown"))
        refused = unsupported_tensorrt(self.version)
        if refused:
            raise BackendError(refused)
        self.major_minor = parse_version(self.version)[:2]
        # weak typing (precision builder flags): deprecated from 10.12, gone in 11; edged builds strongly typed
        # networks from 10.12 on, so an engine's precision is the model's on every version that will stay
        self.strongly_typed = self.major_minor >= STRONGLY_TYPED_FROM or not hasattr(trt.BuilderFlag, "FP16")
        self.calibrator_deprecated = self.major_minor >= CALIBRATOR_DEPRECATED_FROM

    # ---- building -------------------------------------------------------------------------
    def network_flags(self) -> int:
        flags = self.trt.NetworkDefinitionCreationFlag
        if self.major_minor < (10, 0):
            return 1 << int(flags.EXPLICIT_BATCH)  # 8.6: 0 would make an implicit-batch network
        if self.strongly_typed and self.major_minor < (11, 0):
            return 1 << int(flags.STRONGLY_TYPED)  # 10.12-10.x: opt in; weak typing is deprecated there
        return 0  # explicit batch is the only mode; 11 is strongly typed without a flag

    def default_precision(self, model: Precision) -> Precision:
        """What a build without an explicit precision makes: the model's own from 10.12 (strongly typed), else
        int8 for a Q/DQ model and fp16 for a float one."""
        if self.strongly_typed:
            return model
        return "int8" if model == "int8" else "fp16"

    def check_precision(self, precision: Precision, model: Precision, dla: bool, calibrate: bool) -> None:
        """Refuse, with the reason, a precision this TensorRT cannot give this model."""
        if dla and precision == "fp32":
            raise BackendError("DLA runs fp16 or int8 only (trtexec forces fp16 there): build with --precision fp16")
        if not self.strongly_typed:
            return
        if precision != model:
            how = {
                "fp16": "convert the model to fp16 first (`edged quantize --precision fp16`)",
                "int8": "quantize it with Q/DQ first (`edged quantize --target tensorrt`)",
                "fp32": "build from the float model",
            }[precision]
            raise BackendError(
                f"TensorRT {self.version} builds strongly typed networks: the precision comes from the ONNX "
                f"model, which is {model}, not {precision}. To fix: {how}, or build on TensorRT 8.6-10.11 "
                "(weakly typed)"
            )
        if calibrate:
            raise BackendError(
                f"TensorRT {self.version} builds strongly typed networks, which take no calibrator: int8 needs a "
                "Q/DQ model "
                "(`edged quantize --target tensorrt`)"
            )

    def set_precision(self, config: Any, precision: Precision) -> None:
        if self.strongly_typed:
            return  # the network's types are the model's
        if precision in ("fp16", "int8"):
            config.set_flag(self.trt.BuilderFlag.FP16)  # layers without Q/DQ may still take fp16
        if precision == "int8":
            config.set_flag(self.trt.BuilderFlag.INT8)

    def set_calibrator(self, config: Any, calibrator: Any) -> None:
        """TensorRT's implicit INT8 calibration of a float model (weakly typed builds: `check_precision`
        refuses a calibrator on strongly typed ones). From 10.1 the only setter, `int8_calibrator`, is
        deprecated with no replacement but explicit quantization, and each use raises a DeprecationWarning
        (an error where warnings are errors, as in edged's tests): that one warning is silenced here, and
        the log says which route stays."""
        if self.strongly_typed:
            raise BackendError(
                f"TensorRT {self.version} builds strongly typed networks, which take no calibrator: int8 needs "
                "a Q/DQ model (`edged quantize --target tensorrt`)"
            )
        if not self.calibrator_deprecated:
            config.int8_calibrator = calibrator
            return
        logger.warning(
            "TensorRT %s: calibrating in TensorRT (--calib) is deprecated since 10.1 and gone in 11; a Q/DQ "
            "model (`edged quantize --target tensorrt`) builds int8 on every version",
            self.version,
        )
        with warnings.catch_warnings():  # the build runs on one thread; the filters are restored on exit
            warnings.filterwarnings("ignore", CALIBRATOR_DEPRECATION, DeprecationWarning)
            config.int8_calibrator = calibrator

    def set_options(self, config: Any, options: BuilderOptions) -> None:
        trt = self.trt
        if options.optimization_level is not None:
            config.builder_optimization_level = options.optimization_level
        if options.version_compatible:
            config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
        if options.hardware_compatibility != "none":
            level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_LEVELS[options.hardware_compatibility], None)
            if level is None:
                raise BackendError(
                    f"TensorRT {self.version} has no hardware compatibility level "
                    f"{options.hardware_compatibility!r}: use ampere+ or none"
                )
            config.hardware_compatibility_level = level
        if options.sparsity:
            config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)

    @property
    def has_progress_monitor(self) -> bool:
        return hasattr(self.trt, "IProgressMonitor")

    def timing_cache(self, config: Any, data: bytes, source: str) -> Any:
        """A timing cache from `data`; one from another device or TensorRT version is discarded with a
        warning and the build starts from an empty one (it only costs time)."""
        cache = config.create_timing_cache(data) if data else None
        if data and (cache is None or not config.set_timing_cache(cache, ignore_mismatch=False)):
            logger.warning("%s: timing cache from another device or TensorRT version; starting a new one", source)
            cache = None
        if cache is None:
            cache = config.create_timing_cache(b"")
            if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
                raise BackendError("TensorRT cannot create a timing cache")
        return cache

    def dla_placement(self, network: Any, config: Any) -> tuple[list[str], list[str]]:
        """The network's layers the builder places on DLA, and those it leaves to the GPU (fallback), asked
        once the config targets DLA (IBuilderConfig.can_run_on_DLA): TensorRT's answer before the build."""
        on_dla: list[str] = []
        on_gpu: list[str] = []
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            (on_dla if config.can_run_on_DLA(layer) else on_gpu).append(str(layer.name))
        return on_dla, on_gpu

    def engine_layers(self, engine: Any) -> list[str] | None:
        """The built engine's layers as TensorRT's engine inspector names them (fused; a DLA subgraph is one
        layer), or None where the inspector gives nothing readable."""
        inspector = engine.create_engine_inspector()
        if inspector is None:
            return None
        try:
            info = json.loads(inspector.get_engine_information(self.trt.LayerInformationFormat.JSON))
        except (TypeError, ValueError) as exc:
            logger.warning("the engine inspector's layer information is not readable: %s", exc)
            return None
        layers = info.get("Layers") if isinstance(info, dict) else None
        if not isinstance(layers, list):
            return None
        # names only by default (ProfilingVerbosity.LAYER_NAMES_ONLY); a dict with "Name" when detailed
        return [str(x.get("Name", "")) if isinstance(x, dict) else str(x) for x in layers]

    # ---- loading --------------------------------------------------------------------------
    def device_memory(self, engine: Any) -> int:
        size = getattr(engine, "device_memory_size_v2", None)  # 10.1+; device_memory_size is gone in 11
        return int(size if size is not None else engine.device_memory_size)

    def io_mode_is_input(self, engine: Any, name: str) -> bool:
        return bool(engine.get_tensor_mode(name) == self.trt.TensorIOMode.INPUT)


def translate(exc: BaseException, what: str, error: type[BackendError], version: str | None = None) -> BackendError:
    """The project's error for what TensorRT, CUDA or pycuda raised while doing `what`."""
    text = str(exc)
    if isinstance(exc, TypeError) and "nullptr" in text:
        why = "TensorRT could not start (no usable NVIDIA GPU, or its CUDA driver does not start)"
    elif "cuInit" in text or "no CUDA-capable device" in text or "CUDA_ERROR_NO_DEVICE" in text:
        why = f"CUDA does not start here (no usable NVIDIA GPU?): {text}"
    elif "out of memory" in text.lower() or isinstance(exc, MemoryError):
        why = f"out of GPU memory: {text}"
    elif isinstance(exc, AttributeError):
        why = f"this TensorRT ({version or 'unknown version'}) lacks an API edged uses: {text}"
    else:
        why = f"{type(exc).__name__}: {text}"
    return error(f"{what}: {why}")
