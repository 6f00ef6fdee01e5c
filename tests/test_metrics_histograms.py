"""Prometheus latencies as histograms (issue 27): `edged_inference_latency_seconds` and
`edged_capture_to_result_seconds` were window percentiles exported as a gauge with a `quantile` label, which
Prometheus cannot aggregate across a fleet. They are cumulative `_bucket{le=...}`, `_sum` and `_count` since
the start now (daemon/latency.py's buckets), scraped here from a running daemon's /metrics and parsed with
prometheus_client's own parsers; telemetry's p50/p95/p99 stay as they were."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from edged.daemon.latency import LATENCY_BUCKETS_MS, Window
from edged.models.demo import DemoAssets

from .conftest import base_config, free_port, wait_until, write_config
from .test_health import get, ready

HISTOGRAMS = ("edged_inference_latency_seconds", "edged_capture_to_result_seconds")


def scrape(port: int, accept: str = "") -> tuple[dict[str, str], dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """(family name -> type, (sample name, sorted labels) -> value) of one /metrics scrape."""
    status, _, body = get(port, "/metrics", accept)
    assert status == 200, status
    parse = openmetrics_families if accept else text_string_to_metric_families
    fams = list(parse(body.decode()))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}
    return {f.name: f.type for f in fams}, samples


def buckets(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of a histogram, in `le` order (+Inf last)."""
    got = [(float(dict(labels)["le"]), v) for (n, labels), v in samples.items() if n == f"{name}_bucket"]
    return sorted(got)


def check_histogram(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> tuple[float, float]:
    """The histogram's invariants; returns (count, sum)."""
    bs = buckets(samples, name)
    assert [le for le, _ in bs] == [b / 1000.0 for b in LATENCY_BUCKETS_MS] + [math.inf], name
    counts = [n for _, n in bs]
    assert all(a <= b for a, b in pairwise(counts)), f"{name}: not cumulative: {counts}"
    count, total = samples[(f"{name}_count", ())], samples[(f"{name}_sum", ())]
    assert counts[-1] == count, f"{name}: +Inf {counts[-1]} != _count {count}"
    # _sum agrees with the buckets: the mean lies between the largest bound no sample is under and the
    # smallest bound every sample is under
    mean = total / count
    lo = max((le for le, n in bs if n == 0), default=0.0)
    hi = min(le for le, n in bs if n == count)
    assert lo <= mean <= hi, f"{name}: mean {mean:.4f} s outside ({lo}, {hi}] of the buckets {bs}"
    return count, total


def test_window_counts_every_sample_since_the_start_into_inclusive_buckets() -> None:
    w = Window(size=4, buckets_ms=(1, 10, 100))
    for v in (0.5, 1.0, 1.5, 10.0, 99.0, 100.0, 250.0, 3.0):
        w.add(v)
    h = w.histogram()
    assert h.bounds_ms == (1.0, 10.0, 100.0)
    assert h.cumulative == (2, 5, 7) and h.count == 8  # `le` inclusive: 1.0 in le=1, 100.0 in le=100
    assert h.sum_ms == pytest.approx(465.0)
    assert w.percentiles((50,)) == {"p50": 99.5}  # the window keeps its last 4 samples only: 99, 100, 250, 3
    with pytest.raises(ValueError, match="strictly ascending"):
        Window(buckets_ms=(1, 5, 5))


def test_metrics_latencies_are_histograms_a_fleet_can_aggregate(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    port = free_port()
    cams = [{"name": "lobby", "uri": "synthetic://?fps=15"}, {"name": "dock", "uri": "synthetic://?fps=15"}]
    cfg = base_config(broker, demo, tmp_path, cams, health={"enabled": True, "port": port})
    sub = subscribe(broker, "edged/#")
    d = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    try:
        wait_until(lambda: ready(port)[0] == 200, 60, "/readyz 200")
        wait_until(lambda: scrape(port)[1].get(("edged_inference_batches_total", ()), 0) >= 20, 60, "20 batches")
        types, samples = scrape(port)
        for name in HISTOGRAMS:
            assert types[name] == "histogram", types.get(name)
            assert not any(n == name and "quantile" in dict(lb) for n, lb in samples), "the old quantile gauge"

        # one scrape where the inference histogram counted every batch the counter counted (the two are
        # updated a few instructions apart by the inference thread, so a scrape can fall between them)
        seen: dict[str, Any] = {}

        def consistent() -> bool:
            _, s = scrape(port)
            seen["samples"] = s
            return s[("edged_inference_latency_seconds_count", ())] == s[("edged_inference_batches_total", ())]

        wait_until(consistent, 10, "_count == edged_inference_batches_total in one scrape")
        s = seen["samples"]
        batches, infer_s = check_histogram(s, "edged_inference_latency_seconds")
        frames, c2r_s = check_histogram(s, "edged_capture_to_result_seconds")
        results = s[("edged_inference_results_total", ())]
        assert batches >= 20 and 0 < frames <= results, (batches, frames, results)
        # plausible sums: BlazeFace at batch 4 on one ONNX Runtime thread takes milliseconds, not seconds,
        # and a frame's capture-to-result includes its batch's inference
        assert 0.0005 < infer_s / batches < 2.0 and infer_s / batches <= c2r_s / frames < 10.0, (infer_s, c2r_s)
        print(
            f"\n{int(batches)} batches, mean {1000 * infer_s / batches:.1f} ms; {int(frames)} frames, capture to "
            f"result mean {1000 * c2r_s / frames:.1f} ms"
        )
        # counted since the start: the next scrape never has fewer
        wait_until(lambda: scrape(port)[1][("edged_inference_latency_seconds_count", ())] > batches, 20, "more")

        # OpenMetrics too, for a scraper that asks for it
        types, samples = scrape(port, "application/openmetrics-text; version=1.0.0")
        for name in HISTOGRAMS:
            assert types[name] == "histogram"
            check_histogram(samples, name)

        # telemetry's window percentiles stay as they were
        def telemetry() -> dict[str, Any] | None:
            msgs = [m.json() for m in sub.on("telemetry")]
            return next((t for t in reversed(msgs) if t["inference"]["infer_ms"]), None)

        wait_until(lambda: telemetry() is not None, 20, "telemetry with latencies")
        t = telemetry()
        assert t is not None and set(t["inference"]["infer_ms"]) == {"p50", "p95", "p99"}
        assert set(t["inference"]["capture_to_result_ms"]) == {"p50", "p95", "p99"}
    finally:
        sub.close()
    assert d.stop() == 0, d.output()[-3000:]
