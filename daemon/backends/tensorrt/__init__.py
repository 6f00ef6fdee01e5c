"""TensorRT (8.6 to 11.x): the engine backend, behind the same interface as ONNX Runtime.

Thin on purpose, in Polygraphy's shape: every native status is checked and raises a typed error;
buffers (pinned host, device) and the CUDA stream are allocated once when the engine opens;
``close()`` frees them, stream included, and releases the primary context it retained. TensorRT
version differences live in ``api.TrtApi`` only, the CUDA binding's (cuda-python or pycuda) in
``cuda``; whatever TensorRT or CUDA raise becomes an ``EngineLoadError`` (at load) or ``InferenceError``
(per batch) through ``api.translate``, so a bad engine is rolled back at start and refused at a swap like
any bad model. ``tensorrt`` and the CUDA binding are imported inside (``api.load_modules``), or handed
in as ``modules`` (the tests' seam).

CUDA from one thread, by construction: a CUDA context is current per thread (a stack per thread), and pycuda
releases a primary context only on the thread that retained it. So each backend owns one thread,
``_CudaThread``, that makes every CUDA and TensorRT call it makes: retain and push the primary context
(once, for the engine's life), deserialize, allocate, copy, execute, free, destroy the engine, pop and
release. ``__init__``, ``infer`` and ``close`` hand their work to it and wait, with its exception raised
in the caller; whichever threads the loader, the inference loop and a swap run on, the context is pushed
and popped on the same one. The hand-off costs a queue round trip per batch (bench: tens of µs).

The builder is ``build``; ``uint8`` hands it a folded model's uint8 input straight into a Cast, as TensorRT
takes uint8 (the engine's input binding is then uint8: the host copies bytes). Nothing here runs on the
project's CI machines (no GPU):
tests/test_tensorrt_api.py checks it against the real bindings of each supported TensorRT version,
tests/test_trt_thread.py the one-thread rule with a recording stand-in, and ``scripts/gpu-check.sh`` runs
tests/test_tensorrt.py on a machine with TensorRT and a GPU.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from edged.errors import BackendError, EdgedError, EngineLoadError, InferenceError
from edged.models.compat import check_engine

from ..base import Backend, BatchSet, TensorInfo
from .api import TrtApi, TrtModules, device_facts, load_modules, translate
from .build import BuiltEngine, Precision, build_engine, cached_engine, cached_engines, make_logger
from .cuda import CudaError

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
T = TypeVar("T")


class _CudaThread:
    """One thread that runs what it is handed, in order; `call` waits and raises what the work raised. A
    SimpleQueue each way (half the round trip of a ThreadPoolExecutor's futures: bench/trt_handoff.py)."""

    def __init__(self, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]] | None]
        self._work = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._work.get()) is not None:
            work, out = item
            try:
                out.put((True, work()))
            except BaseException as exc:  # crosses back to the caller, who raises it
                out.put((False, exc))

    def call(self, work: Callable[..., T], *args: Any) -> T:
        out: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        with self._lock:
            if self._stopped:
                raise InferenceError("the backend is closed (its CUDA thread has ended)")
            self._work.put((functools.partial(work, *args), out))
        ok, value = out.get()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._work.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()


class TensorRTBackend:
    """A deserialized engine, one execution context, one stream, buffers allocated once, one CUDA thread."""

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
        """`modules`: tensorrt and the CUDA binding (imported here when None); `root`: where the device's L4T
        and device-tree files are read from (fixture trees in tests)."""
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
        # the CUDA thread's context-stack depth after close (0: every push popped); None while open
        self.cuda_stack_depth: int | None = None
        self._thread = _CudaThread(f"edged-cuda-{engine_file.stem}")
        version: str | None = None
        try:
            api = TrtApi(m.trt)
            version = api.version
            self._thread.call(self._open, api, m, engine_file, compatibility, has_onnx, root)
        except BaseException as exc:
            self._thread.stop()
            if isinstance(exc, BackendError) and not isinstance(exc, EngineLoadError):
                raise EngineLoadError(str(exc)) from exc  # an unsupported TensorRT: this engine cannot load here
            if isinstance(exc, (EdgedError, KeyboardInterrupt, SystemExit)):
                raise
            raise translate(exc, f"{engine_file}: cannot load the engine", EngineLoadError, version) from exc
        self._closed = False

    def _open(
        self,
        api: TrtApi,
        m: TrtModules,
        engine_file: Path,
        compatibility: dict[str, Any],
        has_onnx: bool,
        root: Path,
    ) -> None:
        """On the CUDA thread: the compatibility check, then everything the engine holds; on a failure, what
        was taken is given back here before the error leaves."""
        try:
            check_engine(compatibility, device_facts(m, root), str(engine_file), has_onnx)  # before deserializing
            if not engine_file.is_file():
                raise EngineLoadError(f"{engine_file}: engine file not found")
            plan = engine_file.read_bytes()
            self._ctx = self._cuda.retain_primary(0)
            try:
                self._cuda.push(self._ctx)
            except BaseException:
                self._cuda.release(self._ctx)
                self._ctx = None
                raise
            self._deserialize(api, plan, engine_file, compatibility)
        except BaseException:
            self._release()
            raise

    def _deserialize(self, api: TrtApi, plan: bytes, engine_file: Path, compatibility: dict[str, Any]) -> None:
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
        self._stream = cuda.stream()
        self._stream_handle = cuda.stream_handle(self._stream)
        for t in self._inputs + self._outputs:
            if min(t.shape) < 0:
                raise EngineLoadError(
                    f"{engine_file}: tensor {t.name} has a dynamic shape {t.shape}; edged runs fixed-batch "
                    "engines (build with one profile, min = opt = max)"
                )
            self._host[t.name] = cuda.host_empty(t.shape, np.dtype(t.dtype))
            self._device[t.name] = cuda.mem_alloc(self._host[t.name].nbytes)
            if not self._context.set_tensor_address(t.name, cuda.device_ptr(self._device[t.name])):
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
        return self._thread.call(self._infer, feeds)

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """On the CUDA thread, whose context is current from open to close."""
        cuda = self._cuda
        if self._ctx is None:  # closed by another thread after this batch passed the check in infer()
            raise InferenceError("infer() on a closed backend")
        try:
            for t in self._inputs:
                np.copyto(self._host[t.name], feeds[t.name], casting="same_kind")
                cuda.htod_async(self._device[t.name], self._host[t.name], self._stream)
            if not self._context.execute_async_v3(self._stream_handle):
                raise InferenceError(f"execute_async_v3 failed: {'; '.join(self._log.errors[-3:])}")
            for t in self._outputs:
                cuda.dtoh_async(self._host[t.name], self._device[t.name], self._stream)
            cuda.synchronize(self._stream)
        except (CudaError, RuntimeError, TypeError) as exc:
            raise translate(exc, "inference failed", InferenceError) from exc
        return {t.name: self._host[t.name].copy() for t in self._outputs}  # callers keep them past the next batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.call(self._release)
        finally:
            self._thread.stop()

    def _release(self) -> None:
        """On the CUDA thread, with the context current since open: free buffers, stream, execution context,
        engine and runtime, then pop the context and release the primary context (one release per retain).
        A failure to free is logged and the rest still goes; the pop and release always run."""
        if self._ctx is None:
            return
        cuda, ctx, self._ctx = self._cuda, self._ctx, None
        try:
            for mem in self._device.values():
                cuda.mem_free(mem)
            for host in self._host.values():
                cuda.host_free(host)
            if self._stream is not None:
                cuda.destroy_stream(self._stream)
        except CudaError as exc:
            logger.error("freeing the engine's CUDA memory failed: %s", exc)
        finally:
            self._device.clear()
            self._host.clear()
            self._stream = None
            self._context = self._engine = self._runtime = None  # TensorRT frees them here, the context current
            try:
                cuda.pop()
            finally:
                cuda.release(ctx)
            self.cuda_stack_depth = cuda.stack_depth()
            if self.cuda_stack_depth:
                logger.error("the CUDA thread ends with %d context(s) on its stack", self.cuda_stack_depth)

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
