"""What every backend is: the `Backend` protocol and the `TensorInfo` of its inputs and outputs, and
`BatchSet`: one backend per fixed batch of a package that carries several (manifest ``extra_batches``).

Its own module so that a backend imports it without importing the factory in ``__init__`` (which opens
the backends): no import loop between the package and its members.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import numpy as np

from edged.errors import InferenceError


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


class BatchSet:
    """The same model at several fixed batches, one backend each, as one `Backend`: `infer` runs the feed on
    the backend of its batch (its first dimension), so the caller picks the batch by the rows it feeds
    (`fixed_batches` says which it may). Inputs and outputs are the largest batch's; memory is all of them.
    Each backend is opened by the caller (so any backend kind can be a member); `close` closes them all."""

    def __init__(self, by_batch: Mapping[int, Backend]) -> None:
        if not by_batch:
            raise ValueError("a BatchSet needs at least one backend")
        self._by_batch = dict(sorted(by_batch.items()))
        self.batches: tuple[int, ...] = tuple(self._by_batch)
        self._largest = self._by_batch[self.batches[-1]]
        self.name = self._largest.name
        self.cpu_bound = self._largest.cpu_bound

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._largest.inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self._largest.outputs

    @property
    def memory_bytes(self) -> int:
        return sum(b.memory_bytes for b in self._by_batch.values())

    def member(self, batch: int) -> Backend:
        """The backend that runs batch `batch`."""
        backend = self._by_batch.get(batch)
        if backend is None:
            raise InferenceError(f"no model at batch {batch} (this package carries {list(self.batches)})")
        return backend

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = {int(v.shape[0]) for v in feeds.values() if v.ndim}
        if len(rows) != 1:
            raise InferenceError(f"feeds of {sorted(rows)} rows: one batch size per run")
        return self.member(rows.pop()).infer(feeds)

    def close(self) -> None:
        for backend in self._by_batch.values():
            backend.close()

    def __enter__(self) -> BatchSet:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def fixed_batches(backend: Backend, largest: int) -> tuple[int, ...]:
    """The batches `backend` runs, smallest first: a `BatchSet`'s, else the one fixed batch `largest`."""
    return backend.batches if isinstance(backend, BatchSet) else (largest,)
