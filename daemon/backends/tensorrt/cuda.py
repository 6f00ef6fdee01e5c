"""The few CUDA driver calls the TensorRT backend and builder make, behind one adapter with two bindings.

    cuda-python   NVIDIA's ``cuda-bindings`` (``cuda.bindings.driver``, 12.6+; ``from cuda import cuda`` in the
                  ``cuda-python`` releases before): every call returns ``(CUresult, *values)``, checked here
    pycuda        ``pycuda.driver``: raises ``pycuda.driver.Error``; keeps its own per-thread context stack

Chosen at run time: cuda-python when it imports, else pycuda. cuda-python first because it ships wheels for
aarch64 and x86_64 (cp310 included, JetPack 6's Python), so a Jetson installs it without compiling; pycuda has
no aarch64 wheel and builds on the device (nvcc, python3-dev, g++). Both call the same driver functions, so an
install that has both behaves the same either way; ``edged doctor`` says which one runs and why.

Every failed call raises ``CudaError`` naming the driver function and CUDA's reason ("cuMemAlloc failed:
CUDA_ERROR_OUT_OF_MEMORY: out of memory"); ``api.translate`` turns it into the project's error. Contexts
are per thread in CUDA: the backend makes all of these calls from its one CUDA thread (``tensorrt.py``).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from edged.errors import BackendError, CudaError

__all__ = ["CUDA_PYTHON_API", "CudaApi", "CudaError", "CudaPython", "Pycuda", "load_cuda"]

# every cuda-python driver function the adapter calls: name -> (arguments, values returned after the CUresult);
# tests/test_cuda_api.py checks both against the real bindings' signatures and documented returns
CUDA_PYTHON_API: dict[str, tuple[int, int]] = {
    "cuInit": (1, 0),
    "cuDeviceGet": (1, 1),
    "cuDeviceGetAttribute": (2, 1),
    "cuDeviceGetName": (2, 1),
    "cuDevicePrimaryCtxRetain": (1, 1),
    "cuDevicePrimaryCtxRelease": (1, 0),
    "cuCtxPushCurrent": (1, 0),
    "cuCtxPopCurrent": (0, 1),
    "cuCtxGetCurrent": (0, 1),
    "cuStreamCreate": (1, 1),
    "cuStreamSynchronize": (1, 0),
    "cuStreamDestroy": (1, 0),
    "cuMemAlloc": (1, 1),
    "cuMemFree": (1, 0),
    "cuMemHostAlloc": (2, 1),
    "cuMemFreeHost": (1, 0),
    "cuMemcpyHtoDAsync": (4, 0),
    "cuMemcpyDtoHAsync": (4, 0),
    "cuMemcpyHtoD": (3, 0),
    "cuMemGetInfo": (0, 2),
    "cuGetErrorName": (1, 1),
    "cuGetErrorString": (1, 1),
}


class CudaApi(Protocol):
    binding: str  # "cuda-python" | "pycuda"
    version: str
    why: str  # why this binding was chosen

    def init(self) -> None: ...
    def compute_capability(self, ordinal: int = 0) -> tuple[int, int]: ...
    def device_name(self, ordinal: int = 0) -> str: ...
    def retain_primary(self, ordinal: int = 0) -> Any: ...
    def push(self, ctx: Any) -> None: ...
    def pop(self) -> None: ...
    def release(self, ctx: Any) -> None: ...
    def stack_depth(self) -> int: ...
    def stream(self) -> Any: ...
    def stream_handle(self, stream: Any) -> int: ...
    def synchronize(self, stream: Any) -> None: ...
    def destroy_stream(self, stream: Any) -> None: ...
    def mem_alloc(self, nbytes: int) -> Any: ...
    def device_ptr(self, mem: Any) -> int: ...
    def mem_free(self, mem: Any) -> None: ...
    def host_empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray: ...
    def host_free(self, array: np.ndarray) -> None: ...
    def htod_async(self, dst: Any, src: np.ndarray, stream: Any) -> None: ...
    def dtoh_async(self, dst: np.ndarray, src: Any, stream: Any) -> None: ...
    def htod(self, dst: Any, src: np.ndarray) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...


class CudaPython:
    """cuda-python's driver module (`driver`: ``cuda.bindings.driver`` or a stand-in of its shape)."""

    binding = "cuda-python"

    def __init__(self, driver: Any, version: str = "unknown", why: str = "") -> None:
        self.d = driver
        self.version = version
        self.why = why
        self._ok = driver.CUresult.CUDA_SUCCESS

    def _call(self, name: str, *args: Any) -> Any:
        try:
            out = getattr(self.d, name)(*args)
        except RuntimeError as exc:  # no libcuda: cuda.pathfinder's DynamicLibNotFoundError at the first call
            raise CudaError(f"{name} failed: {exc}") from exc
        if out[0] != self._ok:
            raise CudaError(f"{name} failed: {self._reason(out[0])}")
        rest = out[1:]
        return rest[0] if len(rest) == 1 else (rest or None)

    def _reason(self, err: Any) -> str:
        name = self.d.cuGetErrorName(err)
        text = self.d.cuGetErrorString(err)
        parts = [v[1].decode(errors="replace") for v in (name, text) if v[0] == self._ok and v[1]]
        return ": ".join(parts) or f"CUresult {int(err)}"

    def init(self) -> None:
        self._call("cuInit", 0)

    def compute_capability(self, ordinal: int = 0) -> tuple[int, int]:
        dev = self._call("cuDeviceGet", ordinal)
        attr = self.d.CUdevice_attribute
        major = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        minor = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        return int(major), int(minor)

    def device_name(self, ordinal: int = 0) -> str:
        name = self._call("cuDeviceGetName", 256, self._call("cuDeviceGet", ordinal))
        return bytes(name).split(b"\0")[0].decode(errors="replace")

    def retain_primary(self, ordinal: int = 0) -> Any:
        dev = self._call("cuDeviceGet", ordinal)
        return dev, self._call("cuDevicePrimaryCtxRetain", dev)

    def push(self, ctx: Any) -> None:
        self._call("cuCtxPushCurrent", ctx[1])

    def pop(self) -> None:
        self._call("cuCtxPopCurrent")

    def release(self, ctx: Any) -> None:
        self._call("cuDevicePrimaryCtxRelease", ctx[0])

    def stack_depth(self) -> int:
        """Contexts on this thread's stack (popped to count, pushed back in order)."""
        popped = []
        while int(self._call("cuCtxGetCurrent")):
            popped.append(self._call("cuCtxPopCurrent"))
        for c in reversed(popped):
            self._call("cuCtxPushCurrent", c)
        return len(popped)

    def stream(self) -> Any:
        return self._call("cuStreamCreate", 0)

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def synchronize(self, stream: Any) -> None:
        self._call("cuStreamSynchronize", stream)

    def destroy_stream(self, stream: Any) -> None:
        self._call("cuStreamDestroy", stream)

    def mem_alloc(self, nbytes: int) -> Any:
        return self._call("cuMemAlloc", max(int(nbytes), 1))

    def device_ptr(self, mem: Any) -> int:
        return int(mem)

    def mem_free(self, mem: Any) -> None:
        self._call("cuMemFree", mem)

    def host_empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ptr = int(self._call("cuMemHostAlloc", max(nbytes, 1), 0))
        raw = (ctypes.c_byte * max(nbytes, 1)).from_address(ptr)
        flat: np.ndarray = np.frombuffer(memoryview(raw).cast("B"), np.dtype(dtype), int(np.prod(shape)))
        return flat.reshape(shape)

    def host_free(self, array: np.ndarray) -> None:
        self._call("cuMemFreeHost", array.ctypes.data)

    def htod_async(self, dst: Any, src: np.ndarray, stream: Any) -> None:
        self._call("cuMemcpyHtoDAsync", dst, src.ctypes.data, src.nbytes, stream)

    def dtoh_async(self, dst: np.ndarray, src: Any, stream: Any) -> None:
        self._call("cuMemcpyDtoHAsync", dst.ctypes.data, src, dst.nbytes, stream)

    def htod(self, dst: Any, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src)
        self._call("cuMemcpyHtoD", dst, src.ctypes.data, src.nbytes)

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._call("cuMemGetInfo")
        return int(free), int(total)


class Pycuda:
    """pycuda's driver module (`driver`: ``pycuda.driver`` or a stand-in of its shape)."""

    binding = "pycuda"

    def __init__(self, driver: Any, version: str = "unknown", why: str = "") -> None:
        self.d = driver
        self.version = version
        self.why = why

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except self.d.Error as exc:  # pycuda's text already names the driver call ("cuMemAlloc failed: ...")
            raise CudaError(str(exc)) from exc

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._guard():
            return fn(*args)

    def init(self) -> None:
        self._call(self.d.init)

    def compute_capability(self, ordinal: int = 0) -> tuple[int, int]:
        major, minor = self._call(lambda: self.d.Device(ordinal).compute_capability())
        return int(major), int(minor)

    def device_name(self, ordinal: int = 0) -> str:
        return str(self._call(lambda: self.d.Device(ordinal).name()))

    def retain_primary(self, ordinal: int = 0) -> Any:
        return self._call(lambda: self.d.Device(ordinal).retain_primary_context())

    def push(self, ctx: Any) -> None:
        self._call(ctx.push)

    def pop(self) -> None:
        self._call(self.d.Context.pop)

    def release(self, ctx: Any) -> None:
        # pycuda releases a primary context only on the thread that retained it (elsewhere detach() does
        # nothing, silently: pycuda's cuda.hpp, context::detach); the backend's one CUDA thread is that thread
        self._call(ctx.detach)

    def stack_depth(self) -> int:
        popped = []
        with self._guard():
            while (c := self.d.Context.get_current()) is not None:
                popped.append(c)
                self.d.Context.pop()
            for c in reversed(popped):
                c.push()
        return len(popped)

    def stream(self) -> Any:
        return self._call(self.d.Stream)

    def stream_handle(self, stream: Any) -> int:
        return int(stream.handle)

    def synchronize(self, stream: Any) -> None:
        self._call(stream.synchronize)

    def destroy_stream(self, stream: Any) -> None:
        pass  # pycuda destroys a stream when its last reference goes (the caller drops it)

    def mem_alloc(self, nbytes: int) -> Any:
        return self._call(self.d.mem_alloc, max(int(nbytes), 1))

    def device_ptr(self, mem: Any) -> int:
        return int(mem)

    def mem_free(self, mem: Any) -> None:
        self._call(mem.free)

    def host_empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return self._call(self.d.pagelocked_empty, shape, np.dtype(dtype))  # type: ignore[no-any-return]

    def host_free(self, array: np.ndarray) -> None:
        base = getattr(array, "base", None)
        if base is not None and hasattr(base, "free"):  # pycuda's HostAllocation
            self._call(base.free)

    def htod_async(self, dst: Any, src: np.ndarray, stream: Any) -> None:
        self._call(self.d.memcpy_htod_async, dst, src, stream)

    def dtoh_async(self, dst: np.ndarray, src: Any, stream: Any) -> None:
        self._call(self.d.memcpy_dtoh_async, dst, src, stream)

    def htod(self, dst: Any, src: np.ndarray) -> None:
        self._call(self.d.memcpy_htod, dst, np.ascontiguousarray(src))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._call(self.d.mem_get_info)
        return int(free), int(total)


def _cuda_python() -> tuple[Any, str]:
    """cuda-python's driver module and its version; ImportError when it is not installed."""
    try:
        driver = importlib.import_module("cuda.bindings.driver")  # cuda-bindings 12.6+
        dist = "cuda-bindings"
    except ImportError:
        with warnings.catch_warnings():  # cuda-python 12.6-12.9 still has the old name, deprecated
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            driver = importlib.import_module("cuda.cuda")  # cuda-python before 12.6
        dist = "cuda-python"
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return driver, version


def load_cuda(error: type[BackendError] = BackendError) -> CudaApi:
    """The CUDA binding this process uses: cuda-python when it imports, else pycuda; `error` naming both
    reasons when neither does."""
    try:
        driver, version = _cuda_python()
        return CudaPython(driver, version, "cuda-python is installed (preferred: wheels for aarch64 and x86_64)")
    except ImportError as exc:
        no_cuda_python = str(exc)
    try:
        import pycuda
        import pycuda.driver
    except ImportError as exc:
        raise error(
            f"no CUDA binding: cuda-python ({no_cuda_python}), pycuda ({exc}); install edged[tensorrt] (cuda-bindings)"
        ) from exc
    version = str(getattr(pycuda, "VERSION_TEXT", None) or getattr(pycuda, "__version__", "unknown"))
    return Pycuda(pycuda.driver, version, f"cuda-python is not installed ({no_cuda_python})")
