"""Nothing lost: the durable spool and the MQTT session, through broker outages and crashes.
Real mosquitto on 127.0.0.1, real daemon processes killed with real signals."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import MqttConfig, SpoolConfig
from edged.daemon.delivery import session
from edged.daemon.delivery.publisher import Publisher
from edged.daemon.delivery.spool import Spool
from edged.models.demo import DemoAssets
from edged.protocol.backoff import Backoff

from .conftest import Broker, base_config, free_port, wait_until, write_config


@pytest.fixture
def persistent_broker(tmp_path: Path) -> Iterator[Broker]:
    (tmp_path / "broker").mkdir()
    b = Broker(tmp_path / "broker", persistence=True)
    b.start()
    yield b
    b.stop()


def seqs_of(results: list[dict[str, Any]], boot_id: str | None = None) -> list[int]:
    return sorted({r["seq"] for r in results if boot_id is None or r["boot_id"] == boot_id})


def spooled_results(state_dir: Path) -> int:
    """How many results the daemon's spool holds, committed (read-only, beside the running daemon)."""
    path = state_dir / "spool.db"
    if not path.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
            return int(db.execute("SELECT COUNT(*) FROM messages WHERE topic LIKE '%/results/%'").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet, or busy
        return 0


def captured(result: dict[str, Any]) -> float:
    """A result's capture time (its `captured_at`, ISO 8601 UTC), as a Unix time."""
    return dt.datetime.fromisoformat(result["captured_at"].replace("Z", "+00:00")).timestamp()


def cams(fps: int = 10) -> list[dict[str, Any]]:
    return [{"name": "cam", "uri": f"synthetic://?fps={fps}", "fps_max": fps}]


def test_spool_bounds_and_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=3600)
    for i in range(100):
        spool.append("t", json.dumps({"i": i}).encode().ljust(200), 1)
    spool.commit()
    assert spool.bytes <= 10_000 and spool.dropped == 50 and spool.rows == 50
    rows = spool.after(0, 1000)
    assert [json.loads(r.payload)["i"] for r in rows] == list(range(50, 100))  # the oldest went first
    spool.delete([r.id for r in rows[:10]])
    assert [r.id for r in spool.after(0, 5)] == [r.id for r in rows[10:15]]  # acknowledged: not sent again
    spool.commit()  # deletes reach the file with the next commit (merged with its inserts)
    assert spool.rows == 40 and spool.bytes == 40 * 200
    spool.close()
    again = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=0.001)  # reopened: rows survive...
    assert again.rows == 40
    time.sleep(0.01)
    again.commit()  # ...until the age bound drops them
    assert again.rows == 0 and again.dropped == 40


def outage_loses_nothing(broker: Broker, subscribe, start_daemon, demo: DemoAssets, tmp: Path, outage_s: float) -> None:
    """The broker away for `outage_s` while the daemon serves at 10 fps: every result arrives, in order."""
    sub = subscribe(broker, "edged/test-01/results/#", persistent=True)
    doc = base_config(broker, demo, tmp, cams())
    d = start_daemon(write_config(tmp / "c.yaml", doc))
    wait_until(lambda: len(sub.results()) >= 20, 60, "results before the outage")
    broker.stop()
    time.sleep(outage_s)  # the outage itself: time passing is the point
    back = time.time()
    broker.start()

    def live() -> bool:  # results keep coming after the broker is back: ones captured 2 s after its return
        return any(captured(r) > back + 2 for r in sub.results())

    wait_until(live, 60, "results captured after the broker's return")
    assert d.stop() == 0, d.output()[-2000:]
    boot = sub.results()[0]["boot_id"]
    wait_until(lambda: len(seqs_of(sub.results(), boot)) == max(seqs_of(sub.results(), boot)), 30, "the backlog")
    got = seqs_of(sub.results(), boot)
    n_msgs = len(sub.results())
    print(f"\noutage of {outage_s} s: {len(got)} results, seq 1..{got[-1]}, {n_msgs - len(got)} duplicates")
    assert got == list(range(1, got[-1] + 1)) and got[-1] >= 20 + 10 * outage_s * 0.8  # the outage's results too


def test_broker_outage_of_6_s_loses_nothing(
    persistent_broker: Broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    outage_loses_nothing(persistent_broker, subscribe, start_daemon, demo, tmp_path, 6)


@pytest.mark.slow
def test_broker_outage_of_30_s_loses_nothing(
    persistent_broker: Broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    outage_loses_nothing(persistent_broker, subscribe, start_daemon, demo, tmp_path, 30)


def test_broker_away_at_start_then_sigkill_then_restart(
    subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker")  # not started yet: the daemon starts without it
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams()))
    d1 = start_daemon(cfg)
    wait_until(lambda: "serving 1 camera(s)" in d1.output(), 60, "the daemon to serve without a broker")
    wait_until(lambda: spooled_results(tmp_path / "state") >= 20, 30, "20 results committed to the spool")
    d1.stop(signal.SIGKILL)  # results are in the spool, none acknowledged
    broker.start()
    try:
        sub = subscribe(broker, "edged/test-01/results/#")
        d2 = start_daemon(cfg)
        wait_until(lambda: len({r["boot_id"] for r in sub.results()}) == 2, 60, "results of both runs")
        first = [r for r in sub.results() if r["boot_id"] != sub.results()[-1]["boot_id"]]
        old = seqs_of(first)
        assert old == list(range(1, len(old) + 1)) and len(old) >= 20, old[:5]  # every committed one
        assert d2.stop() == 0
        assert "from before this start will be sent" in d2.output()
    finally:
        broker.stop()


def test_spool_limit_drops_oldest_and_says_so(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    away = Broker(tmp_path)  # configured, not started
    doc = base_config(away, demo, tmp_path, cams(20), spool={"max_mb": 0.02, "commit_interval_ms": 50})
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    wait_until(lambda: "serving 1 camera(s)" in d.output(), 60, "serving")
    # results of ~500 bytes at 20 fps: past 20 kB within ~2 s, and the spool says so
    wait_until(lambda: "spool: over its bounds" in d.output(), 30, "the spool to drop its oldest")
    away.start()
    try:
        sub = subscribe(away, "edged/test-01/#")
        wait_until(lambda: any(m.json()["mqtt"]["spool_dropped"] > 0 for m in sub.on("telemetry")), 30, "the count")
        wait_until(lambda: len(sub.results()) > 20, 30, "results")
        assert d.stop() == 0
    finally:
        away.stop()
    tel = [m.json()["mqtt"] for m in sub.on("telemetry")]
    assert max(t["spool_mb"] for t in tel) <= 0.021
    got = seqs_of(sub.results())
    assert got[0] > 1 and got == list(range(got[0], got[-1] + 1))  # the oldest were dropped, the rest in order


def test_oversized_message_is_refused_locally(broker, subscribe, tmp_path: Path) -> None:
    sub = subscribe(broker, "edged/dev/#")
    pub = Publisher(MqttConfig(host=broker.host, port=broker.port), SpoolConfig(commit_interval_ms=20),
                    Spool(tmp_path / "s.db", 10**8, 3600), "dev", "edged/dev", "0" * 32, dict)  # fmt: skip
    pub.start()
    try:
        wait_until(lambda: pub.connected, 10, "connected")
        pub.submit_event({"type": "big", "blob": "x" * 300_000})
        pub.submit_event({"type": "small"})
        wait_until(lambda: any(m.json().get("type") == "small" for m in sub.on("events")), 10, "the small event")
        assert pub.oversized == 1 and pub.connects == 1 and pub.connected  # the connection stayed up
        assert not any(m.json().get("type") == "big" for m in sub.on("events"))
    finally:
        pub.stop()


def test_publishing_threads_never_write_the_socket_themselves(broker, subscribe, tmp_path: Path) -> None:
    """Snapshots, replies and telemetry are published from other threads than the spool's while the network
    thread reads and writes: only the network thread may touch the socket, or two threads interleave their
    packets in one stream (partial writes of big payloads) and the broker drops us for a malformed packet."""
    sub = subscribe(broker, "edged/dev/#")
    pub = Publisher(MqttConfig(host=broker.host, port=broker.port), SpoolConfig(commit_interval_ms=20),
                    Spool(tmp_path / "s.db", 10**8, 3600), "dev", "edged/dev", "0" * 32, dict)  # fmt: skip
    pub.start()
    big = bytes(range(256)) * 1000  # 256 KB: the largest payload, more than a socket takes in one write
    rounds = 40
    not_sent: list[int] = []

    def send(k: int) -> None:
        for i in range(rounds):
            if not pub.publish_direct(f"edged/dev/snapshot/cam{k}", big, qos=0):
                not_sent.append(k)
            pub.submit_event({"type": "tick", "thread": k, "i": i})

    try:
        wait_until(lambda: pub.connected, 10, "connected")
        threads = [threading.Thread(target=send, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_until(lambda: len(sub.on("events")) >= 3 * rounds or pub.connects > 1, 20, "every spooled event")
        assert pub.connects == 1 and not not_sent and "malformed" not in broker.log_tail(), broker.log_tail()
        assert sorted((m.json()["thread"], m.json()["i"]) for m in sub.on("events")) == [
            (k, i) for k in range(3) for i in range(rounds)
        ]
    finally:
        pub.stop()
    wait_until(lambda: "Client edged-dev disconnected." in broker.log_tail(), 10, "a clean disconnect")
    wait_until(lambda: sub.on("status")[-1].json()["state"] == "stopped", 10, "stopped")  # and no last will after


def test_a_stop_never_reconnects_after_its_disconnect(broker, subscribe, tmp_path: Path, monkeypatch) -> None:
    """After the DISCONNECT is written the network thread stops: it must not reconnect in the moment before
    the stop reaches it (a session opened then and closed by the stop makes the broker publish the last will,
    "offline", over "stopped"). Reconnect waits of 0 make that moment as wide as it gets."""

    class NoWait(Backoff):
        def next_s(self) -> float:
            return 0.0

    monkeypatch.setattr(session, "reconnect_backoff", lambda max_s: NoWait(1.0, max_s))
    stops = 8
    for k in range(stops):
        pub = Publisher(MqttConfig(host=broker.host, port=broker.port), SpoolConfig(),
                        Spool(tmp_path / f"s{k}.db", 10**6, 60), "dev", "edged/dev", "0" * 32, dict)  # fmt: skip
        pub.start()
        wait_until(lambda: pub.connected, 10, "connected")  # noqa: B023
        pub.stop()
        assert pub.connects == 1, f"stop {k}: connected {pub.connects} times"
    wait_until(lambda: broker.log_tail(20000).count("Client edged-dev disconnected.") == stops, 10, "clean disconnects")
    log = broker.log_tail(20000)
    assert log.count("as edged-dev") == stops and "edged-dev closed its connection" not in log, log
    late = subscribe(broker, "edged/dev/status")
    wait_until(lambda: bool(late.on("status")), 10, "the retained status")
    assert late.on("status")[-1].json()["state"] == "stopped"


def test_unreachable_broker_backs_off(tmp_path: Path) -> None:
    pub = Publisher(MqttConfig(host="127.0.0.1", port=free_port()), SpoolConfig(), Spool(tmp_path / "s.db", 10**6, 60),
                    "dev", "edged/dev", "0" * 32, dict)  # fmt: skip
    pub.start()
    time.sleep(6.5)
    failures = pub.connect_failures
    pub.stop(timeout_s=0.5)
    # full jitter: waits drawn from [0, 1], [0, 2], [0, 4] … s: 3 to 8 tries in 6.5 s (simulated: 7 or
    # more in under 0.2 % of runs), never a tight loop
    assert 3 <= failures <= 10
    assert "Connection refused" in pub.last_error


def test_broker_away_at_start_then_appears(subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker", persistence=True)
    # the subscriber's session (persistent, kept by the broker across its restart) exists before the daemon
    # can reach the broker: whatever the daemon sends the moment the broker is back is queued for it, so
    # the test does not race the daemon's reconnect with its own subscription
    broker.start()
    sub = subscribe(broker, "edged/test-01/results/#", persistent=True)
    broker.stop()
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams())))
    wait_until(lambda: "serving 1 camera(s)" in d.output(), 60, "the daemon to serve without a broker")
    wait_until(lambda: spooled_results(tmp_path / "state") >= 20, 30, "results in the spool")
    broker.start()
    try:
        wait_until(lambda: len(sub.results()) >= 40, 30, "the spooled results and new ones")
        assert d.stop() == 0
        got = seqs_of(sub.results())
        assert got == list(range(1, got[-1] + 1)) and got[-1] >= 40
    finally:
        broker.stop()


# --- the result's bytes, encoded without building the document (daemon/delivery/payload.py) ------------------


def _result(dets: list[Any], **kw: Any) -> Any:
    from edged.daemon.capture.camera import FrameMeta
    from edged.daemon.capture.preprocess import Transform
    from edged.daemon.inference import Result

    t = Transform(0.5, 0.5, 0.0, 12.0, kw.pop("width", 960), 540)
    meta = FrameMeta(kw.pop("frame", 17), kw.pop("captured_at", 1_764_000_000.1234567), 100.0, t, 100.0)
    return Result(
        kw.pop("camera", "cam0"),
        meta,
        dets,
        kw.pop("infer_ms", 12.3456),
        kw.pop("done_mono", 100.0423),
        kw.pop("name", "blazeface-back"),
        kw.pop("version", 3),
    )


def test_result_bytes_are_the_documents_bytes_on_real_and_made_up_results(demo: DemoAssets) -> None:
    """result_bytes writes exactly what dumps(result_payload(...)) writes: real detections of the demo model on a
    real frame, then values chosen to be awkward (NumPy floats, long and negative numbers, escapes and non-ASCII
    in names, tracks and zones, no detections, a float that is not finite, which takes the long way)."""
    import random

    import cv2
    import numpy as np

    from edged.daemon.backends import OnnxRuntimeBackend
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.daemon.decoders import DecodeOptions, build_decoder
    from edged.daemon.decoders.base import Detection
    from edged.daemon.delivery.payload import result_bytes, result_payload
    from edged.protocol.schemas import dumps

    def same(r: Any, device: str = "dev-1", boot: str = "b" * 32, seq: int = 1) -> bytes:
        got = result_bytes(r, device, boot, seq)
        assert got == dumps(result_payload(r, device, boot, seq))
        return got

    pkg = demo.packages["blazeface-back"]
    m = pkg.manifest
    cap = cv2.VideoCapture(str(demo.video))
    cap.set(cv2.CAP_PROP_POS_FRAMES, 150)  # two people in view
    pre = Preprocessor(m.input)
    batch = np.zeros(m.input.shape, pre.new_row().dtype)
    tfs = [pre.run(cap.read()[1], batch[i]) for i in range(m.input.batch)]
    cap.release()
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as be:
        out = be.infer({m.input.name: batch})
        decoder = build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in be.outputs})
    rows = decoder.decode(out, tfs, DecodeOptions(score_threshold=0.5))
    assert sum(len(r) for r in rows) >= 2, "the demo frames should show faces"
    for seq, row in enumerate(rows, 1):
        doc = json.loads(same(_result(row), seq=seq))
        assert [d["score"] for d in doc["detections"]] == [round(d.score, 4) for d in row]

    rnd = random.Random(34)
    for i in range(300):
        dets = [
            Detection(
                rnd.choice(["face", "person", 'quo"te\\', "caf\u00e9", "\u732b", "tab\t"]),
                rnd.randrange(0, 90),
                rnd.choice([rnd.random(), float(np.float64(rnd.random())), 1.0, 0.99995, 1e-7]),
                tuple(
                    rnd.choice([rnd.uniform(-1e4, 1e4), np.float64(rnd.uniform(0, 960)), 0.05, 5e-324]) for _ in "xyxy"
                ),
                rnd.choice([None, rnd.randrange(1, 10**12)]),
                tuple(rnd.sample(["door", "yard", "\u00e9t\u00e9"], rnd.randrange(0, 3))),
            )
            for _ in range(rnd.randrange(0, 5))
        ]
        r = _result(
            dets,
            frame=rnd.randrange(0, 10**9),
            captured_at=rnd.uniform(0, 4e9),
            infer_ms=rnd.choice([rnd.uniform(0, 500), np.float64(3.14159), 0.0]),
            done_mono=100.0 + rnd.uniform(-1, 10),
            camera=rnd.choice(["cam0", "porte d\u2019entr\u00e9e", 'a"b']),
            name=rnd.choice(["blazeface-back", "yolo\u00e9"]),
            version=rnd.choice([1, 7, "2"]),
        )
        same(r, device=rnd.choice(["dev-1", "d\u00e9v"]), boot=rnd.choice(["0" * 32, "f" * 32]), seq=i)
    nan = _result([Detection("face", 0, float("nan"), (0.0, 1.0, 2.0, float("inf")))])
    assert b"NaN" in same(nan) and b"Infinity" in same(nan)  # json's own spelling


def test_the_kept_seconds_write_the_same_time_stamps_as_iso() -> None:
    """payload._iso keeps each second's text and rounds the microseconds as datetime does: the same text as
    schemas.iso at the edges of a millisecond, a second, a day and a year, before the epoch, and at random."""
    import random

    from edged.daemon.delivery.payload import _iso
    from edged.protocol.schemas import iso

    edges = [0.0, 0.0005, 0.0004999, 0.9995, 0.99949999, 0.9999994, 0.9999995, 0.9999996, 0.5e-6, 1.5e-6, 2.5e-6]
    bases = [0, 59, 86_399, 1_767_225_599, 1_764_000_000, 4_102_444_799, -86_400]
    stamps = [b + e for b in bases for e in edges] + [-0.0004, 253_402_300_799.5]
    rnd = random.Random(34)
    stamps += [rnd.uniform(0, 4.2e9) for _ in range(20_000)] + [
        rnd.randrange(0, 4 * 10**9) / 1000 for _ in range(5_000)
    ]
    wrong = [(ts, _iso(ts), iso(ts)) for ts in stamps if _iso(ts) != iso(ts)]
    assert not wrong, wrong[:5]
