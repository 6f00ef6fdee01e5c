"""Full-jitter back-off (protocol/backoff.py): the helper's distribution, and a fleet of real daemons
that lost their broker at the same instant reconnecting apart rather than in lockstep."""

from __future__ import annotations

import datetime as dt
import random
import re
import statistics
from pathlib import Path

import pytest

from edged.models.demo import DemoAssets
from edged.protocol.backoff import Backoff

from .conftest import Broker, base_config, wait_until, write_config


def test_waits_are_bounded_jittered_and_reset() -> None:
    b = Backoff(1.0, 60.0, uniform=random.Random(7).uniform)
    for n, ceiling in enumerate([1, 2, 4, 8, 16, 32, 60, 60, 60]):  # doubling, capped
        assert b.failures == n and b.ceiling_s() == ceiling
        assert 0 <= b.next_s() <= ceiling
    # many draws of one step: inside [0, ceiling] and spread over all of it (not a fixed or half-range wait)
    for step, top in ((0, 1.0), (3, 8.0), (10, 60.0)):
        rng = random.Random(step)
        waits = []
        for _ in range(2000):
            c = Backoff(1.0, 60.0, uniform=rng.uniform)
            for _ in range(step):
                c.next_s()
            waits.append(c.next_s())
        assert min(waits) >= 0 and max(waits) <= top
        assert min(waits) < 0.05 * top and max(waits) > 0.95 * top  # full jitter: from 0 up to the top
        assert statistics.mean(waits) == pytest.approx(top / 2, rel=0.08)
        assert len({round(w, 6) for w in waits}) > 1900  # no two devices share a schedule
    # a success starts the count again
    b.reset()
    assert b.failures == 0 and b.ceiling_s() == 1.0 and b.due(0.0)
    # the polling form: due again only once the drawn wait has passed
    wait = b.failed(100.0)
    assert 0 <= wait <= 1.0 and b.failures == 1 and b.next_at == 100.0 + wait
    assert b.due(100.0 + wait) and (wait == 0 or not b.due(100.0 + wait / 2))
    for _ in range(200):  # a long outage: capped, no overflow
        assert 0 <= b.next_s() <= 60.0
    with pytest.raises(ValueError, match="base_s"):
        Backoff(0, 1)
    with pytest.raises(ValueError, match="cap_s"):
        Backoff(2, 1)


_CONNECTED = re.compile(r"^(\S+ \S+) INFO +edged\.daemon\.delivery\.publisher: mqtt: connected to", re.M)


def _connect_times(log: str) -> list[float]:
    return [dt.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t in _CONNECTED.findall(log)]


def test_a_fleet_reconnects_apart_after_a_broker_restart(
    broker: Broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """Eight real daemons on one real mosquitto; the broker stops and starts again. Each daemon lost the
    connection at the same instant; with full jitter they come back spread out, not within a few ms.
    With the first waits uniform in [0, 1] s, eight reconnects all inside 0.1 s happen with a
    probability of about 8 * 0.1**7 (one run in a million); in lockstep they land within 2-4 ms."""
    fleet = []
    for i in range(8):
        cam = [{"name": "cam", "uri": "rtsp://127.0.0.1:1/none", "reconnect_min_s": 30, "reconnect_max_s": 60}]
        doc = base_config(broker, demo, tmp_path / f"d{i}", cam, device_id=f"fleet-{i}")
        (tmp_path / f"d{i}").mkdir()
        fleet.append(start_daemon(write_config(tmp_path / f"d{i}" / "c.yaml", doc)))
    wait_until(lambda: all(len(_connect_times(d.output())) == 1 for d in fleet), 60, "eight daemons connected")
    broker.stop()
    wait_until(lambda: all("mqtt: disconnected" in d.output() for d in fleet), 10, "every daemon to see the loss")
    broker.start()
    wait_until(lambda: all(len(_connect_times(d.output())) >= 2 for d in fleet), 20, "every daemon back")
    back = sorted(_connect_times(d.output())[1] for d in fleet)
    spread = back[-1] - back[0]
    print(f"\nreconnects after the restart, relative to the first: {[round(t - back[0], 3) for t in back]}")
    # in lockstep (fixed 1, 2, 4 s steps) all of them land within a few ms of each other
    assert spread > 0.1, f"eight daemons reconnected within {spread * 1000:.0f} ms of each other: no jitter"
