"""bench/fleet.py kept working (a tiny run), and consumers scaling out: three copies of the example
consumer (examples/shared_consumer.py) on one MQTT v5 shared subscription split a simulated fleet's
results, each result to one of them, none lost (counted by `seq` against the broker's PUBACKs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.conftest import REPO, Broker, free_port, wait_until


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(REPO / "bench"))  # bench/fleet.py imports its sibling fleet_wire
fleet = load(REPO / "bench" / "fleet.py")
example = load(REPO / "examples" / "shared_consumer.py")


def test_a_tiny_fleet_run_reports_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    args = ["--sessions", "20", "--seconds", "2", "--warmup", "1", "--consumers", "2", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fleet.py"), *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["sessions"] == 20 and doc["lost"] == 0 and doc["acked_by_broker"] > 0
    assert doc["subscription"] == "$share/fleet/edged/+/results/+" and all(n > 0 for n in doc["per_consumer"])
    assert sum(doc["per_consumer"]) >= doc["acked_by_broker"]
    assert 300 < doc["payload_bytes"] < 400 and doc["broker_cpu_pct_of_one_core"] >= 0
    assert "latency" in out.with_suffix(".txt").read_text()


def test_three_shared_consumers_split_a_fleet_with_nothing_lost(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.start()
    handled: list[list[tuple[str, int]]] = [[], [], []]
    members = []
    try:
        for i in range(3):
            c = example.SharedConsumer(
                broker.host,
                broker.port,
                "analytics",
                f"analytics-{i}-{free_port()}",
                lambda r, i=i: handled[i].append((r["device"], r["seq"])),
            )
            c.start()
            members.append(c)
        for c in members:
            wait_until(c.subscribed.is_set, 10, "a member subscribed")
        names = [f"sim-{i:03d}" for i in range(20)]
        start = time.monotonic() + 0.5
        args: dict[str, Any] = {"payload": 348, "rate": 27.0, "warmup": 0.0}
        out: list[dict[str, Any]] = []
        t = threading.Thread(target=lambda: out.append(fleet.run_devices(broker.port, names, args, start, start + 3.0)))
        t.start()
        t.join(90)
        assert out, "the simulated fleet did not finish"
        acked = {(dev, s) for dev, seqs in out[0]["acked"].items() for s in seqs}
        assert len(acked) > 20 * 27 * 2 and out[0]["unacked"] == 0
        wait_until(lambda: sum(len(h) for h in handled) >= len(acked), 30, "every acknowledged result at a consumer")
        got = [set(h) for h in handled]
        assert set().union(*got) == acked, "a result the broker acknowledged never reached the group"
        assert all(len(g) > len(acked) / 6 for g in got), [len(g) for g in got]  # each member takes a share
        assert not (got[0] & got[1] or got[0] & got[2] or got[1] & got[2]), "one result went to two members"
    finally:
        for c in members:
            c.stop()
        broker.stop()
