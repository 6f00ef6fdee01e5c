"""Latency samples, kept two ways: the recent window (percentiles for telemetry: p50/p95/p99 of the last
2048 samples) and, since the daemon started, counts per bucket with their sum (Prometheus histograms on
/metrics, daemon/health.py, which a fleet can aggregate and quantile across devices; window percentiles
cannot be).

The buckets, in ms (exported in seconds, `le` inclusive, then +Inf):

    1  2  5  10  20  35  50  75  100  150  250  500  1000  2500  5000  10000

from a TensorRT engine's 1-5 ms per batch on a GPU, through the 20-150 ms of ONNX Runtime on a CPU and
the capture-to-result of a few batches queued, to the seconds of a device that is overloaded or paused;
every bucket boundary a round number, a few per decade where latencies usually lie.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

LATENCY_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)


@dataclass(frozen=True)
class Histogram:
    """Every sample since the Window was made: `cumulative[i]` samples <= `bounds_ms[i]`; `count` in all
    (the +Inf bucket), `sum_ms` their total."""

    bounds_ms: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    sum_ms: float


class Window:
    """The last `size` samples of a latency in ms, for percentiles in telemetry, and all of them since it
    was made, counted into `buckets_ms` (ascending), for histograms."""

    def __init__(self, size: int = 2048, buckets_ms: Sequence[float] = LATENCY_BUCKETS_MS) -> None:
        bounds = tuple(float(b) for b in buckets_ms)
        if any(b >= c for b, c in pairwise(bounds)):
            raise ValueError(f"histogram buckets must be strictly ascending: {list(bounds)}")
        self._d: deque[float] = deque(maxlen=size)
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # per bucket; the last one above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def add(self, v: float) -> None:
        i = bisect_left(self._bounds, v)  # the first bound >= v: `le` is inclusive
        with self._lock:
            self._d.append(v)
            self._counts[i] += 1
            self._sum += v

    def percentiles(self, qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
        with self._lock:
            data = np.fromiter(self._d, float, len(self._d))
        if data.size == 0:
            return {}
        return {f"p{int(q)}": round(float(v), 2) for q, v in zip(qs, np.percentile(data, qs), strict=True)}

    def histogram(self) -> Histogram:
        """A consistent snapshot of the counts since the start."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for n in counts[:-1]:
            running += n
            cumulative.append(running)
        return Histogram(self._bounds, tuple(cumulative), running + counts[-1], total)
