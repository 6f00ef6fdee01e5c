"""TensorRT (8.6 to 11.x): the engine backend, behind the same interface as ONNX Runtime.

Thin on purpose, in Polygraphy's shape: every native status is checked and raises a typed error;
buffers (pinned host, device) and the CUDA stream are allocated once when the engine opens;
``close()`` frees them, stream included, and releases the primary context it retained. TensorRT
version differences live in ``trt_api.TrtApi`` only; whatever TensorRT, CUDA or pycuda raise becomes an
``EngineLoadError`` (at load) or ``InferenceError`` (per batch) through ``trt_api.translate``, so a bad
engine is rolled back at start and refused at a swap like any bad model. ``tensorrt`` and ``pycuda``
are imported inside (``trt_api.load_modules``), or handed in as ``modules`` (the tests' seam).

The builder is ``trt_build``. Nothing here runs on the project's CI machines (no GPU):
tests/test_tensorrt_api.py checks it against the real bindings of each supported TensorRT version, and
``scripts/gpu-check.sh`` runs tests/test_tensorrt.py on a machine with TensorRT and a GPU.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edged.errors import BackendError, EdgedError, EngineLoadError, InferenceError
from edged.models.compat import check_engine

from .base import Backend, BatchSet, TensorInfo
from .trt_api import TrtApi, TrtModules, device_facts, load_modules, translate
from .trt_build import BuiltEngine, Precision, build_engine, cached_engine, cached_engines, make_logger

__all__ = [
    "BuiltEngine",
    "Precision",
    "TensorRTBackend",
    "build_engine",
    "cached_engine",
    "cached_engines",
    "device_facts",
    "open_engines",
]

logger = logging.getLogger(__name__)


class TensorRTBackend:
    """A deserialized engine, one execution context, one stream, buffers allocated once."""

    name = "tensorrt"
    cpu_bound = False

    def __init__(
        self,
        engine_file: Path,
        compatibility: dict[str, Any],
        has_onnx: bool = False,
        modules: TrtModules | None = None,
        root: Path = Path("/"),
    ) -> None:
        """`modules`: tensorrt and pycuda.driver (imported here when None); `root`: where the device's L4T and
        device-tree files are read from (fixture trees in tests)."""
        m = modules or load_modules(EngineLoadError)
        self._cuda = m.cuda
        self._closed = True  # until everything below is held
        self._ctx: Any = None
        self._stream: Any = None
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, Any] = {}
        self._context: Any = None
        self._engine: Any = None
        self._runtime: Any = None
        version: str | None = None
        try:
            api = TrtApi(m.trt)
            version = api.version
            check_engine(compatibility, device_facts(m, root), str(engine_file), has_onnx)  # before deserializing
            if not engine_file.is_file():
                raise EngineLoadError(f"{engine_file}: engine file not found")
            plan = engine_file.read_bytes()
            self._ctx = m.cuda.Device(0).retain_primary_context()
            self._ctx.push()
            try:
                self._open(api, plan, engine_file, compatibility)
            finally:
                self._ctx.pop()
        except BaseException as exc:
            self._release()
            if isinstance(exc, BackendError) and not isinstance(exc, EngineLoadError):
                raise EngineLoadError(str(exc)) from exc  # an unsupported TensorRT: this engine cannot load here
            if isinstance(exc, (EdgedError, KeyboardInterrupt, SystemExit)):
                raise
            raise translate(exc, f"{engine_file}: cannot load the engine", EngineLoadError, version) from exc
        self._closed = False

    def _open(self, api: TrtApi, plan: bytes, engine_file: Path, compatibility: dict[str, Any]) -> None:
        cuda = self._cuda
        self._log = make_logger(api.trt)
        self._runtime = api.trt.Runtime(self._log)
        dla_core = compatibility.get("dla_core")
        if dla_core is not None:
            self._runtime.DLA_core = int(dla_core)  # the core it was built for; the default is core 0
        if compatibility.get("version_compatible"):
            self._runtime.engine_host_code_allowed = True  # a version-compatible plan carries its lean runtime
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise EngineLoadError(f"{engine_file}: TensorRT cannot deserialize it: {'; '.join(self._log.errors)}")
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise EngineLoadError(f"{engine_file}: no execution context (out of device memory?)")
        self._inputs, self._outputs = _io(api, self._engine)
        # the context's scratch memory, and the weights the plan carries (deserialized into GPU memory)
        self._device_memory = api.device_memory(self._engine) + len(plan)
        self._stream = cuda.Stream()
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

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self._outputs

    @property
    def memory_bytes(self) -> int:
        """Weights, the context's device memory and our I/O buffers (on Jetson all come out of the shared RAM)."""
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
        except (cuda.Error, RuntimeError, TypeError) as exc:
            raise translate(exc, "inference failed", InferenceError) from exc
        finally:
            self._ctx.pop()
        return {t.name: self._host[t.name].copy() for t in self._outputs}  # callers keep them past the next batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Free buffers, stream, context, engine and runtime with the CUDA context current, then release the
        primary context retained at open (one detach per retain)."""
        if self._ctx is None:
            return
        ctx, self._ctx = self._ctx, None
        try:
            ctx.push()
        except self._cuda.Error as exc:
            logger.error("cannot make the CUDA context current to free the engine's memory: %s", exc)
            return
        try:
            for mem in self._device.values():
                mem.free()
            self._device.clear()
            self._host.clear()
            self._stream = None  # pycuda destroys the stream when its last reference goes
            self._context = self._engine = self._runtime = None
        finally:
            ctx.pop()
            ctx.detach()

    def __enter__(self) -> TensorRTBackend:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_engines(
    engines: dict[int, Path],
    compatibility: dict[str, Any],
    has_onnx: bool = False,
    modules: TrtModules | None = None,
    root: Path = Path("/"),
) -> Backend:
    """One engine per fixed batch (batch -> its plan file) as one `BatchSet` (the engine alone when there is
    one). They share the device's primary CUDA context (each retains it); when one fails to open, those already
    open are closed and its `EngineLoadError` stands."""
    opened: dict[int, Backend] = {}
    try:
        for b, path in sorted(engines.items()):
            opened[b] = TensorRTBackend(path, compatibility, has_onnx, modules, root)
    except BaseException:
        for backend in opened.values():
            backend.close()
        raise
    return next(iter(opened.values())) if len(opened) == 1 else BatchSet(opened)


def _io(api: TrtApi, engine: Any) -> tuple[list[TensorInfo], list[TensorInfo]]:
    inputs: list[TensorInfo] = []
    outputs: list[TensorInfo] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        info = TensorInfo(
            name,
            tuple(int(d) for d in engine.get_tensor_shape(name)),
            np.dtype(api.trt.nptype(engine.get_tensor_dtype(name))).name,
        )
        (inputs if api.io_mode_is_input(engine, name) else outputs).append(info)
    return inputs, outputs
