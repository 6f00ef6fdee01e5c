"""inference.dedicated_core: the inference thread on a core of its own, every other thread of the daemon
(MQTT, cameras, GStreamer's streaming threads, publisher) on the rest; read from /proc as it serves."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edged.daemon.host import affinity
from edged.models.demo import DemoAssets

from .conftest import base_config, wait_until, write_config

ALLOWED = sorted(os.sched_getaffinity(0))


def parse_list(text: str) -> frozenset[int]:
    """A Cpus_allowed_list ("0-2,5") as a set."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cores)


def cores_of(pid: int) -> dict[int, tuple[frozenset[int], float]]:
    """Each thread of `pid`: (the cores it may run on, its CPU seconds so far)."""
    out: dict[int, tuple[frozenset[int], float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list"))
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        out[int(tid)] = (parse_list(line.split(":", 1)[1].strip()), cpu_s)
    return out


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two cores to give one away")
def test_the_inference_thread_runs_alone_on_its_core(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    sub = subscribe(broker, "edged/test-01/results/#")
    cams = [{"name": f"c{i}", "uri": f"file://{demo.video}", "realtime": False, "loop": True} for i in range(2)]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["inference"]["dedicated_core"] = True
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    wait_until(lambda: len(sub.results()) >= 200, 120, "results from both cameras")
    now = cores_of(d.proc.pid)
    engine, others = frozenset(ALLOWED[-1:]), frozenset(ALLOWED[:-1])
    on_engine = [tid for tid, (cores, _) in now.items() if cores == engine]
    assert len(on_engine) == 1, (now, d.output()[-2000:])
    assert {cores for tid, (cores, _) in now.items() if tid not in on_engine} == {others}, now
    # CPU since each thread began: some 50 batches of inference against a camera's share of decoding (the
    # main thread, which loaded and warmed the model, aside)
    (tid,) = on_engine
    busiest = max(cpu for t, (_, cpu) in now.items() if t not in (tid, d.proc.pid))
    assert now[tid][1] > 0 and now[tid][1] >= busiest, "the thread alone on its core is the one running the engine"
    assert "inference.dedicated_core: the inference thread on core" in d.output()
    d.stop()


def test_off_by_default_and_refused_with_a_reason_where_it_cannot_help(caplog: pytest.LogCaptureFixture) -> None:
    from edged.daemon.config.runtime import InferenceConfig

    assert InferenceConfig().dedicated_core is False
    assert affinity.plan(False, True, 1) is None
    caplog.set_level(logging.WARNING)
    assert affinity.plan(True, False, 1) is None
    assert "not applied: the engine does not run on the CPU" in caplog.text
    assert affinity.plan(True, True, 0) is None
    assert "onnxruntime.threads is 0" in caplog.text
    if len(ALLOWED) >= 2:
        split = affinity.plan(True, True, 1)
        assert split is not None and split.engine == {ALLOWED[-1]} and split.others == set(ALLOWED[:-1])
