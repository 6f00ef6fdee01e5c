"""The sd_notify protocol against a real AF_UNIX datagram socket, as systemd's NOTIFY_SOCKET is:
READY only after warm-up (and not gated by cameras or the broker), STATUS content, RELOADING on
SIGHUP, STOPPING, WATCHDOG cadence, and no WATCHDOG while the inference loop is stalled."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import numpy as np
import pytest

from edged.daemon.app import Daemon
from edged.daemon.backends import OnnxRuntimeBackend, TensorInfo
from edged.daemon.config import load_config
from edged.models.demo import DemoAssets
from tests.conftest import base_config, free_port, wait_until, write_config


class NotifySocket:
    """What systemd listens on: an AF_UNIX datagram socket; every datagram kept with its arrival time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def lines(self, key: str) -> list[tuple[float, str]]:
        return [(t, line) for t, m in self.messages for line in m.split("\n") if line.startswith(key + "=")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def test_ready_status_watchdog_reload_stopping(
    broker, start_daemon, notify_socket: NotifySocket, demo: DemoAssets, tmp_path: Path
) -> None:
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True}]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "1000000"}
    d = start_daemon(cfg, "--duration", "30", env=env)
    wait_until(lambda: bool(notify_socket.lines("READY")), 60, "READY=1")
    ready_at = notify_socket.lines("READY")[0][0]
    assert "warm-up batch" in d.output()  # the model was loaded and warmed up before READY
    assert not [t for t, _ in notify_socket.lines("WATCHDOG") if t < ready_at]

    def pings() -> list[float]:
        return [t for t, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=1"]

    wait_until(lambda: len(pings()) >= 7, 15, "watchdog pings while serving")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: bool(notify_socket.lines("RELOADING")), 10, "RELOADING=1")
    wait_until(lambda: len(notify_socket.lines("READY")) >= 2, 10, "READY=1 after the reload")
    assert notify_socket.lines("MONOTONIC_USEC")
    reloaded_at = notify_socket.lines("READY")[1][0]
    wait_until(lambda: len([t for t in pings() if t > reloaded_at]) >= 3, 10, "watchdog pings after the reload")
    assert d.stop() == 0, d.output()[-2000:]
    assert notify_socket.lines("STOPPING")

    gaps = np.diff(pings())
    assert len(pings()) >= 10 and gaps.max() < 0.9, f"{len(pings())} pings, largest gap {gaps.max():.2f} s"
    statuses = [line for _, line in notify_socket.lines("STATUS")]
    last = [s for s in statuses if "fps" in s][-1]
    for part in ("cameras up", "batch 4", "blazeface-back@1 on onnxruntime", "broker up", "thermal", "spool"):
        assert part in last, last
    assert not [line for _, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=trigger"]


def test_ready_is_not_gated_by_a_dead_camera_or_broker(
    start_daemon, notify_socket: NotifySocket, demo: DemoAssets, tmp_path: Path
) -> None:
    class Nowhere:
        host, port = "127.0.0.1", free_port()

    cams = [{"name": "gate", "uri": "rtsp://127.0.0.1:1/none", "reconnect_min_s": 5}]
    cfg = write_config(tmp_path / "c.yaml", base_config(Nowhere(), demo, tmp_path, cams))
    d = start_daemon(cfg, "--duration", "20", env={"NOTIFY_SOCKET": str(notify_socket.path)})
    wait_until(lambda: bool(notify_socket.lines("READY")), 60, "READY=1 with no camera and no broker")
    wait_until(lambda: any("broker down" in s for _, s in notify_socket.lines("STATUS")), 10, "STATUS")
    status = next(s for _, s in notify_socket.lines("STATUS") if "broker down" in s)
    assert "0/1 cameras up" in status
    d.stop()


class StallingBackend:
    """ONNX Runtime that can be told to hang inside infer() (a stuck GPU call), a seam we own."""

    def __init__(self, inner: OnnxRuntimeBackend) -> None:
        self.inner = inner
        self.name = "stalling"
        self.cpu_bound = inner.cpu_bound
        self.stall = threading.Event()
        self.release = threading.Event()

    @property
    def inputs(self) -> list[TensorInfo]:
        return self.inner.inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.inner.outputs

    @property
    def memory_bytes(self) -> int:
        return self.inner.memory_bytes

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.stall.is_set():
            self.release.wait(30)
        return self.inner.infer(feeds)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> StallingBackend:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def test_no_watchdog_while_the_inference_loop_is_stalled(
    broker, notify_socket: NotifySocket, demo: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # ping every 1 s; stalled after 1 s without progress
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True}]
    cfg = load_config(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams)))
    pkg = demo.packages["blazeface-back"]
    backend = StallingBackend(OnnxRuntimeBackend(pkg.model_path, threads=1))
    daemon = Daemon(cfg, backend=backend)
    t = threading.Thread(target=daemon.run, kwargs={"duration_s": 14, "install_signals": False})
    t.start()
    try:
        wait_until(lambda: len(notify_socket.lines("WATCHDOG")) >= 3, 20, "watchdog pings")
        backend.stall.set()
        stalled_at = time.monotonic()
        wait_until(
            lambda: any(line == "WATCHDOG=trigger" for _, line in notify_socket.lines("WATCHDOG")),
            10,
            "WATCHDOG=trigger",
        )
        triggered_at = notify_socket.lines("WATCHDOG")[-1][0]
        pings = [ts for ts, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=1"]
        during = [ts for ts in pings if stalled_at + 1.5 < ts <= triggered_at]
        assert during == [], "WATCHDOG=1 sent while the inference loop was stuck"
        assert 2.0 <= triggered_at - stalled_at <= 6.0
        backend.stall.clear()
        backend.release.set()
        resumed = time.monotonic()
        wait_until(
            lambda: any(ts > resumed for ts, line in notify_socket.lines("WATCHDOG") if line == "WATCHDOG=1"),
            5,
            "pings again once the loop moves",
        )
    finally:
        backend.release.set()
        daemon.request_stop()
        t.join(30)
