"""A stand-in for cuda-python's `cuda.bindings.driver`: the calls edged makes, in the real bindings' shape
(every function returns `(CUresult, *values)`; handles are objects that `int()` reads), failing like the
real driver. CUDA's own rules are kept so a test sees misuse: a context stack per thread (a pop with none
current is CUDA_ERROR_INVALID_CONTEXT), allocations, streams and copies refused without a current context.
Every call is recorded with its thread in `STATE.calls`; a test swaps in a fresh `State()`."""

from __future__ import annotations

import ctypes
import enum
import os
import threading
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_CONTEXT = 201


_TEXT = {
    CUresult.CUDA_SUCCESS: b"no error",
    CUresult.CUDA_ERROR_OUT_OF_MEMORY: b"out of memory",
    CUresult.CUDA_ERROR_NO_DEVICE: b"no CUDA-capable device is detected",
    CUresult.CUDA_ERROR_INVALID_CONTEXT: b"invalid device context",
}


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class _Handle:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class CUdevice(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUstream(_Handle):
    pass


class CUdeviceptr(_Handle):
    pass


class State:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.retained = 0
        self.allocated = 0
        self.host: dict[int, Any] = {}  # pinned host buffers by address (ctypes arrays stand in)
        self.stacks = threading.local()

    def stack(self) -> list[CUcontext]:
        if not hasattr(self.stacks, "s"):
            self.stacks.s = []
        s: list[CUcontext] = self.stacks.s
        return s


STATE = State()
OK = CUresult.CUDA_SUCCESS
_PRIMARY = CUcontext(0x1000)


def _rec(name: str, needs_context: bool = False) -> CUresult:
    STATE.calls.append((name, threading.get_ident()))
    if needs_context and not STATE.stack():
        return CUresult.CUDA_ERROR_INVALID_CONTEXT
    return OK


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def cuGetErrorName(error: CUresult) -> tuple[CUresult, bytes]:
    return OK, CUresult(error).name.encode()


def cuGetErrorString(error: CUresult) -> tuple[CUresult, bytes]:
    return OK, _TEXT.get(CUresult(error), b"unknown error")


def cuInit(flags: int) -> tuple[CUresult]:
    _rec("cuInit")
    return (CUresult.CUDA_ERROR_NO_DEVICE if _fault() == "no_gpu" else OK,)


def cuDeviceGet(ordinal: int) -> tuple[CUresult, CUdevice]:
    return _rec("cuDeviceGet"), CUdevice(ordinal)


def cuDeviceGetAttribute(attrib: CUdevice_attribute, dev: CUdevice) -> tuple[CUresult, int]:
    major = attrib == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    return _rec("cuDeviceGetAttribute"), 8 if major else 7


def cuDeviceGetName(length: int, dev: CUdevice) -> tuple[CUresult, bytes]:
    return _rec("cuDeviceGetName"), b"Orin (stand-in)".ljust(length, b"\0")


def cuDevicePrimaryCtxRetain(dev: CUdevice) -> tuple[CUresult, CUcontext]:
    STATE.retained += 1
    return _rec("cuDevicePrimaryCtxRetain"), _PRIMARY


def cuDevicePrimaryCtxRelease(dev: CUdevice) -> tuple[CUresult]:
    STATE.retained -= 1
    return (_rec("cuDevicePrimaryCtxRelease"),)


def cuCtxPushCurrent(ctx: CUcontext) -> tuple[CUresult]:
    STATE.stack().append(ctx)
    return (_rec("cuCtxPushCurrent"),)


def cuCtxPopCurrent() -> tuple[CUresult, CUcontext | None]:
    err = _rec("cuCtxPopCurrent", needs_context=True)
    return (err, None) if err != OK else (OK, STATE.stack().pop())


def cuCtxGetCurrent() -> tuple[CUresult, CUcontext]:
    s = STATE.stack()
    return _rec("cuCtxGetCurrent"), s[-1] if s else CUcontext(0)


def cuStreamCreate(flags: int) -> tuple[CUresult, CUstream | None]:
    err = _rec("cuStreamCreate", needs_context=True)
    return err, CUstream(7) if err == OK else None


def cuStreamSynchronize(stream: CUstream) -> tuple[CUresult]:
    return (_rec("cuStreamSynchronize", needs_context=True),)


def cuStreamDestroy(stream: CUstream) -> tuple[CUresult]:
    return (_rec("cuStreamDestroy", needs_context=True),)


def cuMemAlloc(nbytes: int) -> tuple[CUresult, CUdeviceptr | None]:
    err = _rec("cuMemAlloc", needs_context=True)
    if err == OK and _fault() == "oom":
        err = CUresult.CUDA_ERROR_OUT_OF_MEMORY
    if err != OK:
        return err, None
    STATE.allocated += 1
    return OK, CUdeviceptr(0x2000)


def cuMemFree(ptr: CUdeviceptr) -> tuple[CUresult]:
    err = _rec("cuMemFree", needs_context=True)
    if err == OK:
        STATE.allocated -= 1
    return (err,)


def cuMemHostAlloc(nbytes: int, flags: int) -> tuple[CUresult, int | None]:
    err = _rec("cuMemHostAlloc", needs_context=True)
    if err != OK:
        return err, None
    buf = (ctypes.c_byte * nbytes)()
    STATE.host[ctypes.addressof(buf)] = buf
    return OK, ctypes.addressof(buf)


def cuMemFreeHost(ptr: int) -> tuple[CUresult]:
    err = _rec("cuMemFreeHost", needs_context=True)
    if err == OK and STATE.host.pop(int(ptr), None) is None:
        err = CUresult.CUDA_ERROR_INVALID_CONTEXT
    return (err,)


def cuMemcpyHtoDAsync(dst: CUdeviceptr, src: int, nbytes: int, stream: CUstream) -> tuple[CUresult]:
    return (_rec("cuMemcpyHtoDAsync", needs_context=True),)


def cuMemcpyDtoHAsync(dst: int, src: CUdeviceptr, nbytes: int, stream: CUstream) -> tuple[CUresult]:
    return (_rec("cuMemcpyDtoHAsync", needs_context=True),)


def cuMemcpyHtoD(dst: CUdeviceptr, src: int, nbytes: int) -> tuple[CUresult]:
    return (_rec("cuMemcpyHtoD", needs_context=True),)


def cuMemGetInfo() -> tuple[CUresult, int, int]:
    return _rec("cuMemGetInfo", needs_context=True), 1 << 30, 2 << 30
