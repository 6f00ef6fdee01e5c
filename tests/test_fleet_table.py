"""`edged fleet` over a simulated fleet on a real mosquitto: 50 real MQTT sessions (bench/fleet_table.py's
simulator, the daemon's retained documents and last will), some of which die (SIGKILL: the broker publishes
their wills) or stop cleanly. The table is complete, an offline device shows the time its will was
published, and the filters and formats keep what they say. The 1,000-session figures are
bench/fleet_table.py's (bench/results/fleet-table.txt)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from edged.deploy.fleet import Seen, render, rows
from edged.protocol.schemas import schema
from tests.conftest import REPO, Broker, edged_cli


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sim = _load(REPO / "bench" / "fleet_table.py")  # the simulator, as the benchmark runs it

DEVICES = 50
DYING = range(0, 5)  # one simulator process; device 0 stops cleanly first, 1-4 die with it
STOPPED = 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, float]]:
    work = tmp_path_factory.mktemp("fleet-broker")
    b = Broker(work, extra="allow_anonymous true\nmax_queued_messages 100000")
    b.start()
    dying = sim.start_sessions(b.port, DYING.start, len(DYING), stop_ids=(STOPPED,))
    alive = sim.start_sessions(b.port, DYING.stop, DEVICES - len(DYING))
    killed_at = time.time()
    os.killpg(dying.pid, signal.SIGKILL)
    dying.wait(10)
    try:
        yield b, killed_at
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        alive.wait(10)
        b.stop()


def table(b: Broker, *args: str) -> tuple[str, str]:
    r = edged_cli("fleet", "--host", b.host, "--port", str(b.port), *args, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, r.stderr


def epoch(iso_z: str) -> float:
    return datetime.fromisoformat(iso_z.replace("Z", "+00:00")).timestamp()


def test_the_table_is_complete_and_shows_when_a_device_went_offline(fleet: tuple[Broker, float]) -> None:
    b, killed_at = fleet
    out, _ = table(b, "--format", "json")
    got: dict[str, dict[str, Any]] = {r["device"]: r for r in json.loads(out)}
    assert sorted(got) == [sim.device_id(i) for i in range(DEVICES)]
    for i in DYING:
        row = got[sim.device_id(i)]
        if i == STOPPED:
            assert row["state"] == "stopped", row
            continue
        assert row["state"] == "offline", row
        # the broker published the will when the process died: the table's time is that moment, to the
        # second the broker counts in (its clock and ours are this machine's)
        assert row["since"] is not None and killed_at - 2 <= epoch(row["since"]) <= killed_at + 3, (row, killed_at)
    assert all(got[sim.device_id(i)]["state"] == "online" for i in range(DYING.stop, DEVICES))
    ten = got[sim.device_id(10)]  # every tenth device is on version 4, on probation
    assert ten["model"] == "faces@4" and ten["probation"] == "v4 12/60 s" and ten["spool_rows"] == 300
    seven = got[sim.device_id(7)]
    assert seven["last_error"] == "mqtt: connection refused" and seven["temp_c"] == 47.0
    assert got[sim.device_id(33)]["throttle"] == "hot x0.5"
    assert all(r["shadow"] is None for r in got.values())


def test_filters_and_formats(fleet: tuple[Broker, float]) -> None:
    b, _ = fleet
    out, err = table(b)
    lines = out.splitlines()
    assert lines[0].split() == ["DEVICE", "STATE", "SINCE", "EDGED", "MODEL", "PROBATION", "TEMP_C", "THROTTLE",
                                "SPOOL_ROWS", "LAST_ERROR"]  # fmt: skip
    assert len(lines) == DEVICES + 1 and "fence missing" not in err, err
    out, _ = table(b, "--offline", "--format", "csv")
    offline = list(csv.DictReader(io.StringIO(out)))
    assert {r["device"] for r in offline} == {sim.device_id(i) for i in DYING}
    out, _ = table(b, "--version", "faces@4", "--group", "yard", "--format", "json")
    assert {r["device"] for r in json.loads(out)} == {sim.device_id(i) for i in range(0, DEVICES, 10)}
    out, _ = table(b, "--error", "--format", "json")
    assert {r["device"] for r in json.loads(out)} == {sim.device_id(i) for i in range(DEVICES) if i % 50 == 7}


def test_a_will_without_an_expiry_interval_shows_no_time_and_a_shadow_shows_its_column() -> None:
    """An older daemon's will carries no Message Expiry Interval: offline, with no time rather than a guess;
    a model state that reports a shadow model makes the column appear."""
    seen = Seen(
        statuses={"a": {"state": "offline", "since": "2026-01-01T00:00:00.000Z"}, "b": {"state": "online"}},
        model_states={"b": {"name": "faces", "active": 3, "probation": None, "shadow": "faces@4"}},
    )
    a, b = rows(seen)
    assert (a.state, a.since) == ("offline", None)
    assert b.shadow == "faces@4" and "SHADOW" in render([a, b], "table").splitlines()[0]
    assert "SHADOW" not in render([a], "table")


def test_the_simulator_writes_what_the_schemas_take() -> None:
    d = sim.docs(10)
    for schema_id, doc in (("edged.telemetry/1", d["telemetry"]), ("edged.model-state/1", d["model/state"]),
                           ("edged.status/1", d["status"])):  # fmt: skip
        jsonschema.validate(doc, schema(schema_id))
