"""The publisher thread takes its queue in groups and commits each before it takes more (issue 18): a
producer that keeps the queue full never makes it hold more in memory than the spool keeps."""

from __future__ import annotations

import json
from pathlib import Path

from edged.daemon.config import MqttConfig, SpoolConfig
from edged.daemon.delivery.publisher import Publisher
from edged.daemon.delivery.spool import Spool

from .conftest import free_port, wait_until


def test_a_full_queue_is_committed_in_groups_and_nothing_is_dropped(tmp_path: Path) -> None:
    """1,000 events of 1 kB wait in the queue when the thread starts (the broker is away: they stay in the
    spool). The spool holds at most 256 kB uncommitted. Taking the whole queue before committing dropped
    the oldest ~750 from memory; taken a group at a time, every one is committed, in order."""
    spool = Spool(tmp_path / "s.db", 10**8, 3600, max_unsaved_bytes=256 * 1024)
    pub = Publisher(MqttConfig(host="127.0.0.1", port=free_port()), SpoolConfig(), spool, "dev", "edged/dev",
                    "0" * 32, dict, queue_size=1000)  # fmt: skip
    for i in range(1000):
        pub.submit_event({"type": "e", "n": i, "pad": "x" * 1000})
    pub.start()
    try:
        wait_until(lambda: pub.spooled == 1000 and spool.pending_commit == 0, 30, "the queue spooled")
        assert spool.dropped_unsaved == 0 and pub.dropped_queue_full == 0
        assert spool.rows == 1000
    finally:
        pub.stop(timeout_s=0.5)
    assert pub.left_in_spool == 1000


def test_a_full_queue_drops_what_comes_and_counts_it(tmp_path: Path) -> None:
    """The hand-over is a bounded deque now (not a queue.Queue): submit() still never blocks, drops what
    comes when `queue_size` wait, and counts it; what was queued is spooled in order."""
    spool = Spool(tmp_path / "s.db", 10**8, 3600)
    pub = Publisher(MqttConfig(host="127.0.0.1", port=free_port()), SpoolConfig(), spool, "dev", "edged/dev",
                    "0" * 32, dict, queue_size=3)  # fmt: skip
    for i in range(5):
        pub.submit_event({"type": "e", "n": i})
    assert pub.queue_full and pub.dropped_queue_full == 2
    pub.start()
    try:
        wait_until(lambda: pub.spooled == 3 and spool.pending_commit == 0, 30, "the queue spooled")
        assert not pub.queue_full
        assert [json.loads(r.payload)["n"] for r in spool.after(0, 10)] == [0, 1, 2]
    finally:
        pub.stop(timeout_s=0.5)
