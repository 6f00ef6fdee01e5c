"""A stand-in for pycuda.driver: its exception tree and the calls edged makes, failing like the real ones."""

from __future__ import annotations

import os
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


def _fault() -> str:
    return os.environ.get("TRT_STANDIN_FAULT", "")


def init(flags: int = 0) -> None:
    if _fault() == "no_gpu":
        raise RuntimeError("cuInit failed: no CUDA-capable device is detected")


class _Context:
    def push(self) -> None:
        pass

    def pop(self) -> None:
        pass

    def detach(self) -> None:
        pass


class Device:
    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    def compute_capability(self) -> tuple[int, int]:
        return (8, 7)

    def retain_primary_context(self) -> _Context:
        return _Context()


class Stream:
    handle = 1

    def synchronize(self) -> None:
        pass


class _DeviceAllocation:
    def __int__(self) -> int:
        return 1

    def free(self) -> None:
        pass


def pagelocked_empty(shape: Any, dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype)


def mem_alloc(nbytes: int) -> _DeviceAllocation:
    if _fault() == "oom":
        raise MemoryError("cuMemAlloc failed: out of memory")
    return _DeviceAllocation()


def memcpy_htod(dest: _DeviceAllocation, src: np.ndarray) -> None:
    pass
