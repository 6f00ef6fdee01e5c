"""CUDA from one thread (issue 27): every CUDA and TensorRT call a TensorRT backend makes comes from one thread
of its own, whichever threads open it, run it and close it, and every context push is popped there.

No GPU here: the stand-in CUDA bindings (tests/trt_standin: pycuda's `driver` and cuda-python's
`cuda.bindings.driver`) keep a context stack per thread, as CUDA does, refuse allocations and copies without a
current context, release a pycuda primary context only on the thread that retained it (as pycuda does), and
record the thread of every call; the stand-in TensorRT records the thread of deserialize, execute and engine
destruction. The sequence is the daemon's: the loader opens on one thread, the inference loop runs batches on
another, a swap opens the next engine and closes the old one from a third, the daemon closes at the end.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from edged.daemon.backends.tensorrt import TensorRTBackend
from edged.errors import EngineLoadError, InferenceError
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standin.cuda.bindings import driver as standin_cuda_python
from tests.trt_standin.pycuda import driver as standin_pycuda
from tests.trt_standins import use_standins

T = TypeVar("T")
DRIVERS = {"pycuda": standin_pycuda, "cuda-python": standin_cuda_python}
# a small engine: the stand-in deserializes a plan into an engine with this input (and an output of 2 rows)
PLAN = standin_trt.PLAN_MAGIC + b'["input", [2, 8, 8, 3]]'


class Caller:
    """A thread that stays alive for the test (so no thread ident is reused) and runs what it is handed."""

    def __init__(self, name: str) -> None:
        self._work: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self._work.get()) is not None:
            work, out = item
            try:
                out.put((True, work()))
            except BaseException as exc:
                out.put((False, exc))

    def run(self, work: Callable[[], T]) -> T:
        out: queue.Queue[Any] = queue.Queue()
        self._work.put((work, out))
        ok, value = out.get(timeout=60)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    @property
    def ident(self) -> int:
        assert self.thread.ident is not None
        return self.thread.ident

    def stop(self) -> None:
        self._work.put(None)
        self.thread.join(10)


@pytest.fixture
def callers() -> Any:
    made = [Caller(n) for n in ("loader", "inference", "swap", "opener")]
    yield made
    for c in made:
        c.stop()


@pytest.fixture(params=list(DRIVERS))
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in binding `request.param` with a fresh record; `import tensorrt` gets the stand-in."""
    monkeypatch.delenv("TRT_STANDIN_FAULT", raising=False)
    use_standins(monkeypatch, binding=request.param)
    d = DRIVERS[request.param]
    monkeypatch.setattr(d, "STATE", d.State())
    monkeypatch.setattr(standin_trt, "CALLS", [])
    return d


def open_engine(path: Path) -> TensorRTBackend:
    return TensorRTBackend(path, {"tensorrt": str(standin_trt.__version__)})


def pushes_popped(calls: list[tuple[str, int]], thread: int) -> bool:
    """Whether, on `thread`, every push is popped and the stack never goes below empty."""
    depth = 0
    for name, ident in calls:
        if ident == thread and name in ("cuCtxPushCurrent", "cuCtxPopCurrent"):
            depth += 1 if name == "cuCtxPushCurrent" else -1
            if depth < 0:
                return False
    return depth == 0


def test_every_cuda_call_of_a_backend_comes_from_one_thread(driver: Any, callers: list[Caller], tmp_path: Path) -> None:
    loader, inference, swap, opener = callers
    for v in (1, 2):
        (tmp_path / f"v{v}.engine").write_bytes(PLAN)
    feed = {"input": np.ones((2, 8, 8, 3), np.float32)}
    one = loader.run(lambda: open_engine(tmp_path / "v1.engine"))
    for _ in range(3):
        out = inference.run(lambda: one.infer(feed))
    assert out["output"].shape == (2, 896, 16)
    two = opener.run(lambda: open_engine(tmp_path / "v2.engine"))  # a swap: the next engine opens...
    swap.run(one.close)  # ...and the old one closes from another thread
    inference.run(lambda: two.infer(feed))
    two.close()  # the daemon's stop, on the main thread

    cuda_calls, trt_calls = driver.STATE.calls, standin_trt.CALLS
    threads = {ident for _, ident in cuda_calls + trt_calls}
    caller_threads = {c.ident for c in callers} | {threading.get_ident()}
    # two backends, two threads of their own; no caller's thread made a CUDA or TensorRT call
    assert len(threads) == 2 and not threads & caller_threads, (threads, caller_threads)
    for thread in threads:
        mine = [name for name, ident in cuda_calls if ident == thread]
        assert mine.count("cuDevicePrimaryCtxRetain") == 1 and mine.count("cuDevicePrimaryCtxRelease") == 1, mine
        assert "cuMemcpyHtoDAsync" in mine and "cuMemFree" in mine, mine
        assert pushes_popped(cuda_calls, thread), mine
        done = [name for name, ident in trt_calls if ident == thread]
        assert {"deserialize_cuda_engine", "execute_async_v3", "engine.destroy"} <= set(done), done
    # everything given back: every retain released, every allocation freed, each CUDA thread's stack empty
    assert driver.STATE.retained == 0 and driver.STATE.allocated == 0
    assert one.cuda_stack_depth == 0 and two.cuda_stack_depth == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("edged-cuda")]  # the threads ended
    with pytest.raises(InferenceError, match="closed backend"):
        inference.run(lambda: one.infer(feed))


def test_a_failed_open_gives_everything_back_on_its_own_thread(
    driver: Any, callers: list[Caller], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "model.engine").write_bytes(PLAN)
    monkeypatch.setenv("TRT_STANDIN_FAULT", "oom")  # the first cuMemAlloc fails, after the engine deserialized
    loader = callers[0]
    with pytest.raises(EngineLoadError, match="out of GPU memory"):
        loader.run(lambda: open_engine(tmp_path / "model.engine"))
    threads = {ident for _, ident in driver.STATE.calls + standin_trt.CALLS}
    assert len(threads) == 1 and loader.ident not in threads
    assert pushes_popped(driver.STATE.calls, threads.pop())
    assert driver.STATE.retained == 0 and driver.STATE.allocated == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("edged-cuda")]
