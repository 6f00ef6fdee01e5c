#!/usr/bin/env python3
"""What CUDA-from-one-thread costs per batch: the TensorRT backend hands each `infer` to its CUDA thread and
waits (daemon/backends/tensorrt/__init__.py, `_CudaThread`). Measured here without a GPU: the bare hand-off (a no-op
run on the backend's thread against the same no-op called directly), and a stand-in engine's whole `infer`
(tests/trt_standin: pycuda's shape, nothing computed), so the figure is the hand-off alone. On a GPU a batch
takes milliseconds; this prints how many microseconds of it the hand-off is.

    python bench/trt_handoff.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_us(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """The median over `rounds` of the mean µs per call of `fn`."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    from edged.daemon.backends.tensorrt import TensorRTBackend, _CudaThread
    from edged.daemon.backends.tensorrt.api import TrtModules
    from edged.daemon.backends.tensorrt.cuda import Pycuda
    from tests.trt_standin import tensorrt as trt
    from tests.trt_standin.pycuda import driver

    def noop() -> None:
        return None

    thread = _CudaThread("bench")
    direct = per_call_us(noop, args.calls)
    handed = per_call_us(lambda: thread.call(noop), args.calls)
    thread.stop()
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "model.engine"
        plan.write_bytes(trt.PLAN_MAGIC + b'["input", [1, 4, 4, 3]]')
        feed = {"input": np.ones((1, 4, 4, 3), np.float32)}
        with TensorRTBackend(plan, {"tensorrt": str(trt.__version__)}, modules=TrtModules(trt, Pycuda(driver))) as be:
            driver.STATE.calls = []  # the stand-in records every call: keep the list short
            calls = max(args.calls // 10, 100)
            infer = per_call_us(lambda: be.infer(feed), calls)
    print(f"no-op called directly:               {direct:8.2f} µs")
    print(f"no-op on the CUDA thread (hand-off): {handed:8.2f} µs  (hand-off {handed - direct:.2f} µs)")
    print(f"stand-in infer() through the thread: {infer:8.2f} µs")
    print(f"hand-off per batch / a 5 ms GPU batch: {(handed - direct) / 5000:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
