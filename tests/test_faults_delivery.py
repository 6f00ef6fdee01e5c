"""Faults on the delivery path, each against real components: a full filesystem (a real 2 MB tmpfs),
a broker whose ACL refuses our publishes (the shipped systemd/mosquitto/edged.acl), the state
directory deleted under a running daemon, a corrupt spool file, a wall clock that jumps."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.app import Daemon
from edged.daemon.config import MqttConfig, SpoolConfig, load_config
from edged.daemon.delivery.publisher import Publisher
from edged.daemon.delivery.spool import Spool, SpoolError
from edged.daemon.telemetry import RunSummary
from edged.models.demo import DemoAssets

from .conftest import REPO, Broker, Message, base_config, free_port, wait_progress, wait_until, write_config
from .test_delivery import cams, seqs_of
from .test_systemd import NotifySocket


def _query(db: Path, sql: str) -> list[Any]:
    """Read a spool file with plain sqlite3, read-only (never creating it); [] while the daemon has
    not created its table yet."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.OperationalError:
        return []
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()


def spool_rows(db: Path) -> int:
    return len(_query(db, "SELECT id FROM messages"))


def spool_seqs(db: Path) -> list[int]:
    """The `seq` of every result in a spool file."""
    rows = _query(db, "SELECT payload FROM messages WHERE topic LIKE '%/results/%' ORDER BY id")
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
@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted on `mnt` (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "tiny", "2m") as mnt:
        yield mnt


def fill(fs: Path) -> bool:
    """Take every free byte of `fs` with a file of our own (again: the spool gives space back when it
    can, from its WAL and its reserve file)."""
    with open(fs / "filler", "ab", buffering=0) as f:
        for chunk in (65536, 512):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return True


def test_a_recovery_that_fails_half_way_is_retried_until_it_works(tmp_path: Path) -> None:
    """A corrupt spool whose replacement cannot be created (the filesystem is full) leaves no open file:
    every later call says SpoolError (which the publisher retries with backoff), and once there is room
    again the spool opens a new file and takes messages, instead of failing on a closed connection for
    good."""
    with tmpfs(tmp_path / "fs", "1m") as fs:
        spool = Spool(fs / "spool.db", 2**20, 0)
        spool.append("edged/t/results/a", b"before", 1)
        spool.commit()
        fill(fs)
        with pytest.raises(SpoolError, match="cannot create a new spool file"):
            spool.recover_corrupt("a read said the file is corrupt")
        assert list(fs.glob("spool.db.corrupt-*"))  # moved aside: only the new file failed
        spool.append("edged/t/results/a", b"after", 1)
        for _ in range(3):  # still full: an error the caller can retry, never another kind
            with pytest.raises(SpoolError):
                spool.commit()
            with pytest.raises(SpoolError):
                spool.after(0, 10)
        (fs / "filler").unlink()
        spool.commit()
        assert [r.payload for r in spool.after(0, 10)] == [b"after"]
        assert spool.lost == 1
        spool.close()


def test_full_disk_keeps_the_publisher_alive_and_delivery_resumes(
    tiny_fs: Path, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker")  # away at first
    doc = base_config(broker, demo, tmp_path, cams(20), state_dir=str(tiny_fs / "state"))
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    db = tiny_fs / "state" / "spool.db"
    wait_until(lambda: db.exists() and len(spool_seqs(db)) >= 20, 60, "results in the spool")
    wait_until(lambda: fill(tiny_fs) and "cannot write new messages" in d.output(), 30, "the full disk", step=0.5)
    broker.start()
    try:
        sub = subscribe(broker, "edged/test-01/#")
        # still full: the status and the telemetry say so, the committed rows go out
        wait_until(lambda: any(m.json().get("spool") == "failing" for m in sub.on("status")), 30, "status failing")

        def tel() -> list[dict[str, Any]]:
            return [m.json()["mqtt"] for m in sub.on("telemetry")]

        wait_until(lambda: any(t["spool_state"] == "failing" and t["spool_errors"] > 0 for t in tel()), 30, "telemetry")
        assert d.proc.poll() is None
        (tiny_fs / "filler").unlink()  # space again: the messages held in memory are written, then delivered
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


def test_spool_does_not_fill_a_small_filesystem_by_itself(
    subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """The finding's own run: the state directory on a tiny tmpfs, the broker away; the spool alone
    would fill it. It keeps to a quarter of the filesystem (the oldest dropped, counted), so its
    writes never fail, and when the broker returns the rest is delivered in order."""
    with tmpfs(tmp_path / "tiny", "512k") as fs:
        (tmp_path / "broker").mkdir()
        broker = Broker(tmp_path / "broker", persistence=True)
        # the subscriber's session (persistent, kept across the broker's restart) exists before the daemon can
        # reach the broker, so what the daemon drains the moment it is back is queued for it, not raced
        broker.start()
        sub = subscribe(broker, "edged/test-01/#", persistent=True)
        broker.stop()  # away at first
        doc = base_config(broker, demo, tmp_path, cams(30), state_dir=str(fs / "state"))
        d = start_daemon(write_config(tmp_path / "c.yaml", doc))
        db = fs / "state" / "spool.db"
        # how soon the spool reaches its bound depends on how fast this machine infers: wait while results
        # keep coming (the daemon's log grows during its start, the spool's newest seq while it serves)
        wait_progress(
            lambda: "spool: over its bounds (0.12 MB" in d.output(),
            lambda: (len(d.output()), max(spool_seqs(db), default=0)),
            60,
            "the spool at its filesystem bound",
            step=0.5,
        )
        broker.start()
        try:
            wait_progress(lambda: len(sub.results()) >= 100, lambda: len(sub.results()), 30, "the results delivered")
            assert d.stop() == 0, d.output()[-3000:]
        finally:
            broker.stop()
        free_kb = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize // 1024
    tel = [m.json()["mqtt"] for m in sub.on("telemetry")]
    got = seqs_of(sub.results())
    print(f"\n512 kB tmpfs: {tel[-1]['spool_dropped']} oldest dropped, then seq {got[0]}..{got[-1]}; {free_kb} kB free")
    assert "cannot write" not in d.output() and tel[-1]["spool_errors"] == 0  # never full
    assert got[0] > 1 and got == list(range(got[0], got[-1] + 1))  # the oldest went, the rest in order
    assert tel[-1]["spool_dropped"] >= got[0] - 1


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


def test_a_held_topics_retry_does_not_send_other_topics_again(subscribe, tmp_path: Path) -> None:
    """While the broker refuses one topic, its rows are retried with backoff from the first held one: the
    other topics' rows between them, delivered and deleted meanwhile, are not sent again on every retry."""
    acl = tmp_path / "edged.acl"
    acl.write_text("topic readwrite edged/dev/b/#\ntopic read #\n")  # anonymous: edged/dev/a is refused
    broker = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}")
    broker.start()
    spool = Spool(tmp_path / "s.db", 10**8, 3600)
    for i, topic in enumerate("abab", 1):
        spool.append(f"edged/dev/{topic}/x", b"row%d" % i, 1)
    spool.commit()
    pub = Publisher(MqttConfig(host=broker.host, port=broker.port), SpoolConfig(), spool, "dev", "edged/dev",
                    "0" * 32, dict)  # fmt: skip
    try:
        sub = subscribe(broker, "edged/dev/#")
        pub.start()
        wait_until(lambda: pub.refused >= 4, 20, "the held topic retried")  # a first refusal, then retries
        wait_until(lambda: len(sub.on("dev/b/x")) >= 2, 10, "b's rows")
        assert sorted(m.payload for m in sub.on("dev/b/x")) == [b"row2", b"row4"], "each delivered once"
        # deleted from the file with the publisher's next commit (within commit_interval_ms), not at the PUBACK
        wait_until(lambda: pub.acked == 2 and spool.rows == 2, 10, "b's rows acknowledged and deleted from the file")
        assert sorted(m.payload for m in sub.on("dev/b/x")) == [b"row2", b"row4"], "still each delivered once"
    finally:
        pub.stop(timeout_s=0.5)
        broker.stop()


def test_a_stop_does_not_wait_for_refused_topics(start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    """Rows the broker refuses stay for the next start; a stop waits for what is in flight, not for them
    (it used to spend its whole 5 s delivery timeout on every stop while an ACL refused the device)."""
    acl = tmp_path / "edged.acl"
    acl.write_text((REPO / "systemd" / "mosquitto" / "edged.acl").read_text())
    broker = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}")
    broker.start()
    try:
        doc = base_config(broker, demo, tmp_path, cams(10), mqtt={"host": broker.host, "port": broker.port,
                                                                   "username": "cam-07"})  # fmt: skip
        d = start_daemon(write_config(tmp_path / "c.yaml", doc))
        wait_until(lambda: "Not authorized (0x87)" in d.output(), 60, "the refusal in the log")
        t0 = time.monotonic()
        assert d.stop() == 0, d.output()[-3000:]
        took = time.monotonic() - t0
        assert took < 4.0, f"the stop took {took:.1f} s"
        assert spool_rows(tmp_path / "state" / "spool.db") > 0  # kept for the next start
    finally:
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
    for _ in range(20):  # `rm -rf` again if the daemon wrote a file into the folder while it was emptied
        try:
            shutil.rmtree(state)
            break
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    wait_until(lambda: "was deleted while running; re-created it" in d.output(), 10, "the re-creation")
    n = len(spool_seqs(db))
    wait_until(lambda: len(spool_seqs(db)) >= n + 20, 30, "results after the deletion, in the new file")
    # the lock file went with the directory: it is taken again, so a second daemon still cannot start here
    wait_until(lambda: "lock file" in d.output() and "taken again" in d.output(), 10, "the lock taken again")
    second = start_daemon(tmp_path / "c.yaml")
    assert second.proc.wait(30) == 1, second.output()[-3000:]
    assert f"another edged (pid {d.proc.pid}) holds the lock" in second.output()
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


def test_state_dir_replaced_by_a_file_says_what_is_lost(start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    """When the spool cannot be re-created (its directory is now a file), the log and the summary say
    how many messages are lost, and never that they stay in the spool."""
    away = Broker(tmp_path)
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(away, demo, tmp_path, cams(20))))
    state = tmp_path / "state"
    wait_until(lambda: (state / "spool.db").exists() and spool_rows(state / "spool.db") >= 20, 60, "a spool")
    # the folder renamed away and a file renamed into its place (a rmtree races the daemon, which re-creates
    # its state folder and writes into it meanwhile); again if the daemon made the folder anew in between
    prepared = tmp_path / "state.file"
    prepared.write_text("not a directory\n")
    for i in range(50):
        if state.is_dir():
            state.rename(tmp_path / f"state.gone{i}")
        with contextlib.suppress(IsADirectoryError):
            prepared.rename(state)
            break
    assert state.is_file()
    wait_until(lambda: "was deleted and cannot be re-created" in d.output(), 10, "the failure to re-create it")
    assert d.stop() == 0, d.output()[-3000:]
    out = d.output()
    lost = re.search(r"spool: (\d+) messages are lost at stop", out)
    summary = next(ln for ln in out.splitlines() if ln.startswith("edged: ") and "results in" in ln)
    print(f"\n{lost.group(0) if lost else None}; {summary}")
    assert lost is not None and int(lost.group(1)) >= 20
    assert "stay in the spool" not in out
    assert f"0 left in the spool, {lost.group(1)} dropped" in summary


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


# --- finding 1 (the watchdog's part): a stuck publisher, a dead one ------------------------------
@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def test_watchdog_sees_a_stuck_publisher_and_a_dead_one_stops_the_daemon(
    broker: Broker, notify_socket: NotifySocket, demo: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # ping every 1 s; stalled after 1 s without progress
    cfg = load_config(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams(10))))
    daemon = Daemon(cfg)
    summary: list[RunSummary] = []
    t = threading.Thread(target=lambda: summary.append(daemon.run(duration_s=60, install_signals=False)))
    t.start()
    try:
        wait_until(lambda: len(notify_socket.lines("WATCHDOG")) >= 2, 30, "watchdog pings")
        # another process holds the spool's write lock: the publisher blocks in its commit (SQLite's
        # 5 s busy timeout), makes no progress, and the watchdog is not petted
        other = sqlite3.connect(str(tmp_path / "state" / "spool.db"), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        wait_until(
            lambda: any(line == "WATCHDOG=trigger" for _, line in notify_socket.lines("WATCHDOG")), 10, "the trigger"
        )
        triggered_at = notify_socket.lines("WATCHDOG")[-1][0]
        pings = [ts for ts, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=1"]
        assert [ts for ts in pings if locked_at + 1.5 < ts <= triggered_at] == []
        other.execute("ROLLBACK")
        other.close()
        released = time.monotonic()
        wait_until(
            lambda: any(ts > released for ts, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=1"),
            15,
            "pings again once the publisher moves",
        )
        # a bug kills the publisher thread (an exception raised into it): the daemon stops, non-zero
        thread = daemon.publisher._thread
        assert thread.ident is not None
        for _ in range(20):  # the thread may be inside a handler that drops one message; raise again
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(RuntimeError))
            thread.join(0.5)
            if not thread.is_alive():
                break
        t.join(30)
        assert not t.is_alive() and summary
        assert summary[0].failure.startswith("the publisher thread died: RuntimeError"), summary[0]
    finally:
        daemon.request_stop()
        t.join(30)


def test_the_run_summary_counts_qos_0_results_as_delivered(
    broker: Broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    doc = base_config(broker, demo, tmp_path, cams(20), mqtt={"host": broker.host, "port": broker.port, "qos": 0})
    d = start_daemon(write_config(tmp_path / "c.yaml", doc), "--duration", "3")
    assert d.proc.wait(60) == 0, d.output()[-3000:]
    summary = next(ln for ln in d.output().splitlines() if ln.startswith("edged: ") and "results in" in ln)
    m = re.search(r"edged: (\d+) results .* (\d+) messages spooled, (\d+) delivered, (\d+) left in the spool", summary)
    assert m, summary
    results, spooled, delivered, left = (int(g) for g in m.groups())
    # how many results 3 s give depends on the machine (beside two busy loops on 2 cores: 10, not 60); the
    # counts agreeing is the point, over a run that served (the duration counts from the first batch)
    assert results > 0 and delivered + left == spooled and delivered >= results, summary
