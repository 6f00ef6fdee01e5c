"""A stand-in for pycuda.driver: its exception tree and the calls edged makes, failing like the real ones.

It keeps what pycuda and CUDA keep, so a test can see misuse: a context stack per thread (`Context.pop` with
none current raises, as pycuda's context::pop does), a primary context released only by `detach()` on the
thread that retained it (elsewhere pycuda's detach does nothing, silently: cuda.hpp, context::detach), and
allocations, streams and copies refused without a current context (CUDA_ERROR_INVALID_CONTEXT). Every call is
recorded with its thread in `STATE.calls`; a test swaps in a fresh `State()`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np


class Error(Exception):  # pycuda._driver.Error
    pass


class LogicError(Error):
    pass


class RuntimeError(Error):
    pass


class MemoryError(Error):
    pass


class State:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []  # (call, thread ident)
        self.retained = 0  # primary-context retains not yet released
        self.allocated = 0  # device allocations not yet freed
        self.stacks = threading.local()

    def stack(self) -> list[Context]:
        if not hasattr(self.stacks, "s"):
            self.stacks.s = []
        s: list[Context] = self.stacks.s
        return s


STATE = State()


def _rec(name: str, needs_context: bool = False) -> None:
    STATE.calls.append((name, threading.get_ident()))
    if needs_context and not STATE.stack():
        raise LogicError(f"{name} failed: invalid device context")


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def init(flags: int = 0) -> None:
    _rec("cuInit")
    if _fault() == "no_gpu":
        raise RuntimeError("cuInit failed: no CUDA-capable device is detected")


class Context:
    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def push(self) -> None:
        _rec("cuCtxPushCurrent")
        STATE.stack().append(self)

    @staticmethod
    def pop() -> None:
        _rec("cuCtxPopCurrent")
        if not STATE.stack():
            raise LogicError("context::pop failed: invalid device context - cannot pop non-current context")
        STATE.stack().pop()

    @staticmethod
    def get_current() -> Context | None:
        s = STATE.stack()
        return s[-1] if s else None

    def detach(self) -> None:
        _rec("cuDevicePrimaryCtxRelease")
        if self.thread != threading.get_ident():
            return  # pycuda: "this context's managing thread has exited": nothing released, nothing said
        s = STATE.stack()
        if s and s[-1] is self:
            s.pop()
        STATE.retained -= 1


_Context = Context  # the name older tests patch


class Device:
    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def compute_capability(self) -> tuple[int, int]:
        _rec("cuDeviceGetAttribute")
        return (8, 7)

    def name(self) -> str:
        return "Orin (stand-in)"

    def retain_primary_context(self) -> Context:
        _rec("cuDevicePrimaryCtxRetain")
        STATE.retained += 1
        return Context()


class Stream:
    handle = 1

    def __init__(self) -> None:
        _rec("cuStreamCreate", needs_context=True)

    def synchronize(self) -> None:
        _rec("cuStreamSynchronize", needs_context=True)


class _DeviceAllocation:
    def __int__(self) -> int:
        return 1

    def free(self) -> None:
        _rec("cuMemFree", needs_context=True)
        STATE.allocated -= 1


def pagelocked_empty(shape: Any, dtype: Any) -> np.ndarray:
    _rec("cuMemHostAlloc", needs_context=True)
    return np.empty(shape, dtype)


def mem_alloc(nbytes: int) -> _DeviceAllocation:
    _rec("cuMemAlloc", needs_context=True)
    if _fault() == "oom":
        raise MemoryError("cuMemAlloc failed: out of memory")
    STATE.allocated += 1
    return _DeviceAllocation()


def memcpy_htod(dest: _DeviceAllocation, src: np.ndarray) -> None:
    _rec("cuMemcpyHtoD", needs_context=True)


def memcpy_htod_async(dest: _DeviceAllocation, src: np.ndarray, stream: Stream) -> None:
    _rec("cuMemcpyHtoDAsync", needs_context=True)


def memcpy_dtoh_async(dest: np.ndarray, src: _DeviceAllocation, stream: Stream) -> None:
    _rec("cuMemcpyDtoHAsync", needs_context=True)


def mem_get_info() -> tuple[int, int]:
    _rec("cuMemGetInfo", needs_context=True)
    return (1 << 30, 2 << 30)
