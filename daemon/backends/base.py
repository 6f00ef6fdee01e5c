"""What every backend is: the `Backend` protocol and the `TensorInfo` of its inputs and outputs.

Its own module so that a backend imports it without importing the factory in ``__init__`` (which opens
the backends): no import loop between the package and its members.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


class Backend(Protocol):
    name: str
    # True when inference runs on this process's CPU threads: its cost is then judged on CPU time, which
    # other processes' load does not inflate (wall time does, several-fold on a busy device); a GPU
    # backend's cost is its wall time.
    cpu_bound: bool

    @property
    def inputs(self) -> list[TensorInfo]: ...

    @property
    def outputs(self) -> list[TensorInfo]: ...

    @property
    def memory_bytes(self) -> int: ...

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. The arrays returned belong to the caller, who may keep them while the next
        batch runs (a backend with preallocated output buffers returns copies)."""

    def close(self) -> None: ...

    def __enter__(self) -> Backend: ...

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
