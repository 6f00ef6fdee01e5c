"""Faults on the delivery path, each against real components: a full filesystem (a real 2 MB tmpfs),
a broker whose ACL refuses our publishes (the shipped systemd/mosquitto/edged.acl), the state
directory deleted under a running daemon, a corrupt spool file, a wall clock that jumps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.spool import Spool
from edged.models.demo import DemoAssets

from .conftest import REPO, Broker, Message, base_config, free_port, wait_until, write_config
from .test_delivery import cams, seqs_of


def spool_rows(db: Path) -> int:
    con = sqlite3.connect(str(db))
    try:
        return int(con.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
    finally:
        con.close()


def spool_seqs(db: Path) -> list[int]:
    """The `seq` of every result in a spool file, read with plain sqlite3."""
    con = sqlite3.connect(str(db))
    try:
        rows = con.execute("SELECT payload FROM messages WHERE topic LIKE '%/results/%' ORDER BY id").fetchall()
    finally:
        con.close()
    return [json.loads(r[0])["seq"] for r in rows]


# --- finding 4: age is not judged on the wall clock ----------------------------------------------
class Clock:
    """A monotonic clock we move by hand (the Spool's `clock` seam)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_spool_age_ignores_wall_clock_jumps(tmp_path: Path) -> None:
    # A spool written by an earlier edged on a board without an RTC, before NTP: rows dated 2001.
    legacy = tmp_path / "legacy.db"
    con = sqlite3.connect(str(legacy))
    con.execute(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload BLOB NOT NULL, "
        "qos INTEGER NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL)"
    )
    con.executemany(
        "INSERT INTO messages (topic, payload, qos, created, size) VALUES ('t', ?, 1, ?, 3)",
        [(b"old", 978307200.0 + i) for i in range(10)],
    )
    con.commit()
    con.close()
    spool = Spool(legacy, 10**6, max_age_s=3600)  # the wall clock now says 2026: 25 years "later"
    spool.commit()
    assert spool.rows == 10 and spool.dropped == 0  # not dropped as 25 years old
    spool.close()

    # New rows, written while the wall clock said 1970, then it jumps by 56 years: still not dropped.
    clock, wall = Clock(), Clock(0.0)
    spool = Spool(tmp_path / "s.db", 10**6, max_age_s=3600, clock=clock, wall=wall)
    for i in range(5):
        spool.append("t", b"%d" % i, 1)
    spool.commit()
    wall.t = 1.8e9
    clock.t += 3000  # 50 minutes of running time
    spool.commit()
    assert spool.rows == 5
    clock.t += 601  # genuinely older than max_age_s: dropped
    spool.append("t", b"new", 1)
    spool.commit()
    assert spool.rows == 1 and spool.dropped == 5
    clock.t += 1000
    spool.close()

    # Across a restart (a reboot resets the monotonic clock): the age goes on from the file's clock.
    boot = Clock(5.0)
    again = Spool(tmp_path / "s.db", 10**6, max_age_s=3600, clock=boot, wall=wall)
    again.commit()
    assert again.rows == 1  # 1000 s old
    boot.t += 2601  # 3601 s old now
    again.commit()
    assert again.rows == 0 and again.dropped == 1
    again.close()


# --- finding 1: a full filesystem -------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path) -> Path:
    """Take every free byte of `fs` with a file of our own."""
    filler = fs / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    try:
        with open(filler, "ab") as f:
            while True:
                f.write(b"\0" * 512)
                f.flush()
    except OSError:
        pass
    return filler


def test_full_disk_keeps_the_publisher_alive_and_delivery_resumes(
    tiny_fs: Path, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker")  # away at first
    doc = base_config(broker, demo, tmp_path, cams(20), state_dir=str(tiny_fs / "state"))
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    db = tiny_fs / "state" / "spool.db"
    wait_until(lambda: db.exists() and len(spool_seqs(db)) >= 20, 60, "results in the spool")
    filler = fill(tiny_fs)
    wait_until(lambda: "database or disk is full" in d.output(), 30, "the spool to report the full disk")
    broker.start()
    try:
        sub = subscribe(broker, "edged/test-01/#")
        # still full: the status and the telemetry say so, the committed rows go out
        wait_until(lambda: any(m.json().get("spool") == "failing" for m in sub.on("status")), 30, "status failing")

        def tel() -> list[dict[str, Any]]:
            return [m.json()["mqtt"] for m in sub.on("telemetry")]

        wait_until(lambda: any(t["spool_state"] == "failing" and t["spool_errors"] > 0 for t in tel()), 30, "telemetry")
        assert d.proc.poll() is None
        filler.unlink()  # space again: the messages held in memory are written, then delivered
        wait_until(lambda: any(t["spool_state"] == "ok" and t["acked"] > 0 for t in tel()), 60, "storage ok again")
        last = max(seqs_of(sub.results()))
        wait_until(lambda: max(seqs_of(sub.results())) > last + 20, 30, "new results after the disk was freed")
        assert d.stop() == 0, d.output()[-3000:]
    finally:
        broker.stop()
    got = seqs_of(sub.results())
    t = tel()[-1]
    print(f"\nfull disk: {len(got)} results delivered, seq 1..{got[-1]}, {t['spool_errors']} storage errors")
    assert got == list(range(1, got[-1] + 1))  # nothing lost: what waited in memory was written later
    assert "storage works again" in d.output() and "Traceback" not in d.output()


# --- finding 2: PUBACK with a failure reason code -------------------------------------------------
@dataclass
class AuthSubscriber:
    """A subscriber with a user name (the ACL's `backend`)."""

    broker: Broker
    username: str
    pattern: str = "edged/#"

    def __post_init__(self) -> None:
        self.messages: list[Message] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{free_port()}", protocol=mqtt.MQTTv5)
        self.client.username_pw_set(self.username)
        subscribed = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(self.pattern, qos=1)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(self.broker.host, self.broker.port)
        self.client.loop_start()
        assert subscribed.wait(10), "subscriber could not subscribe"

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(Message(msg.topic, bytes(msg.payload), bool(msg.retain)))

    def results(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(m.payload) for m in self.messages if "/results/" in m.topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_refused_publishes_stay_in_the_spool_and_go_once_the_acl_allows(
    start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    shipped = (REPO / "systemd" / "mosquitto" / "edged.acl").read_text()
    acl = tmp_path / "edged.acl"
    acl.write_text(shipped)  # as a site gets it: each device confined to edged/<its user name>/#
    broker = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}")
    broker.start()
    sub = None
    try:
        sub = AuthSubscriber(broker, "backend")
        # the device's user name is not its device id: every publish to edged/test-01/... is refused
        doc = base_config(broker, demo, tmp_path, cams(10), mqtt={"host": broker.host, "port": broker.port,
                                                                   "username": "cam-07"})  # fmt: skip
        d = start_daemon(write_config(tmp_path / "c.yaml", doc))
        refusal = "the broker refused a publish to edged/test-01/results/cam: Not authorized (0x87)"
        wait_until(lambda: refusal in d.output(), 60, "the refusal in the log")
        wait_until(lambda: d.output().count("retried with backoff") >= 1, 10, "the log line")
        db = tmp_path / "state" / "spool.db"
        wait_until(lambda: len(spool_seqs(db)) >= 30, 30, "refused results kept in the spool")
        assert sub.results() == []
        assert d.output().count(refusal) == 1  # logged once per topic and reason, not per message
        # the site fixes its ACL (the device's user may write its device id's prefix) and reloads mosquitto
        acl.write_text(shipped + "\nuser cam-07\ntopic readwrite edged/test-01/#\n")
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "accepts publishes to edged/test-01/results/cam again" in d.output(), 90, "the retry")
        wait_until(lambda: len(sub.results()) >= 40, 30, "the kept results")
        assert d.stop() == 0, d.output()[-3000:]
        got = seqs_of(sub.results())
        tel = [json.loads(m.payload)["mqtt"] for m in sub.messages if m.topic.endswith("/telemetry")]
        print(f"\nACL: {tel[-1]['refused']} refusals, then {len(got)} results delivered, seq 1..{got[-1]}")
        assert got == list(range(1, got[-1] + 1))  # the refused ones too, none deleted as delivered
        assert tel and tel[-1]["refused"] > 0
    finally:
        if sub is not None:
            sub.close()
        broker.stop()


# --- finding 3: the state directory deleted while running -----------------------------------------
def test_state_dir_deleted_while_running_keeps_the_spool_and_says_so(
    start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    away = Broker(tmp_path)  # never started: everything stays in the spool
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(away, demo, tmp_path, cams(20))))
    state = tmp_path / "state"
    db = state / "spool.db"
    wait_until(lambda: db.exists() and len(spool_seqs(db)) >= 20, 60, "results in the spool")
    shutil.rmtree(state)
    wait_until(lambda: "was deleted while running; re-created it" in d.output(), 10, "the re-creation")
    n = len(spool_seqs(db))
    wait_until(lambda: len(spool_seqs(db)) >= n + 20, 30, "results after the deletion, in the new file")
    assert d.stop() == 0, d.output()[-3000:]
    out = d.output()
    kept, rows = spool_seqs(db), spool_rows(db)  # results, and results with events
    summary = next(ln for ln in out.splitlines() if ln.startswith("edged: ") and "results in" in ln)
    print(f"\nafter rm -rf of the state directory: {summary}")
    assert f"mqtt: {rows} messages not acknowledged at stop; they stay in the spool ({db})" in out
    assert kept == list(range(1, kept[-1] + 1))  # the results from before the deletion too
    # the run summary is truthful: results produced, spooled, none delivered, all left in the spool
    assert f"edged: {len(kept)} results in " in summary
    assert f"{rows} messages spooled, 0 delivered, {rows} left in the spool, 0 dropped" in summary


# --- finding 5: a corrupt spool file --------------------------------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_spool_is_quarantined_and_the_daemon_serves(
    damage: str, broker: Broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "spool.db"
    if damage == "garbage":
        db.write_bytes(os.urandom(64 * 1024))
    else:  # a spool of 2,000 messages cut in half (a full disk, a bad card)
        s = Spool(db, 10**8, 3600)
        for i in range(2000):
            s.append("edged/test-01/events", json.dumps({"i": i}).encode().ljust(600), 1)
        s.close()
        os.truncate(db, db.stat().st_size // 2)
    sub = subscribe(broker, "edged/test-01/#")
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams())))
    wait_until(lambda: len(sub.results()) >= 10, 60, "results from a daemon started on a corrupt spool")

    def events() -> list[dict[str, Any]]:
        return [m.json() for m in sub.on("events") if m.json().get("type") == "spool_recovered"]

    wait_until(lambda: len(events()) == 1, 10, "the spool_recovered event")
    assert d.stop() == 0, d.output()[-3000:]
    ev = events()[0]
    aside = Path(ev["quarantined"])
    assert ev["reason"] == "corrupt" and ev["path"] == str(db) and aside.parent == state
    assert aside.name.startswith("spool.db.corrupt-") and aside.exists()
    assert f"spool: {db} is corrupt" in d.output() and str(aside) in d.output()
    assert seqs_of(sub.results()) == list(range(1, max(seqs_of(sub.results())) + 1))
