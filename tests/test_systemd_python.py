"""daemon/host/systemd.py's two paths against a real AF_UNIX datagram socket (what systemd's NOTIFY_SOCKET is):
python-systemd (Debian's python3-systemd, linked into the venv by scripts/setup.sh as on a JetPack venv
with system site-packages) where it is importable, and the builtin sd_notify with it hidden (a child
process where `import systemd` fails). The whole daemon's READY/STATUS/WATCHDOG/STOPPING sequence is in
test_systemd.py, which runs on whichever path this venv has."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.daemon.host import systemd as sd


def _has_python_systemd() -> bool:
    try:
        import systemd.daemon  # noqa: F401
    except ImportError:
        return False
    return True


needs_python_systemd = pytest.mark.skipif(
    not _has_python_systemd(), reason="python3-systemd is not importable (scripts/setup.sh links it into .venv)"
)


@pytest.fixture
def notify_sock(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    path = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(5.0)
    yield s, path
    s.close()


@needs_python_systemd
def test_notify_and_watchdog_go_through_python_systemd(
    notify_sock: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_sock
    assert sd.notify_backend() == "python-systemd"
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    assert sd.notify("READY=1\nSTATUS=serving")
    assert sock.recv(4096).decode() == "READY=1\nSTATUS=serving"
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    dog = sd.Watchdog()
    assert dog.interval_s == 2.0
    dog.tick(100.0, healthy=True)
    assert sock.recv(4096).decode() == "WATCHDOG=1"
    dog.tick(101.0, healthy=False, why="inference stalled")
    dog.tick(103.5, healthy=False, why="inference stalled")
    assert sock.recv(4096).decode() == "WATCHDOG=trigger"
    # no socket: a no-op that says so, as the builtin path does
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sd.notify("READY=1") is False


@needs_python_systemd
def test_journald_handler_from_python_systemd_under_systemd() -> None:
    from systemd.journal import JournalHandler

    handler = sd.log_handler({"JOURNAL_STREAM": "8:12345"})
    assert isinstance(handler, JournalHandler)
    assert isinstance(sd.log_handler({}), logging.StreamHandler)  # not under systemd: stderr


def test_builtin_path_with_python_systemd_hidden(notify_sock: tuple[socket.socket, Path]) -> None:
    # a child process in which `import systemd` fails, as on a device without python3-systemd
    sock, path = notify_sock
    code = (
        "import sys, json, logging; sys.modules['systemd'] = None\n"
        "from edged.daemon.host import systemd as sd\n"
        "sent = sd.notify('READY=1\\nSTATUS=builtin')\n"
        "dog = sd.Watchdog(); dog.tick(100.0, healthy=True)\n"
        "h = sd.log_handler({'JOURNAL_STREAM': '8:1'})\n"
        "print(json.dumps([sd.notify_backend(), sent, dog.interval_s, type(h).__name__]))\n"
    )
    env = {**os.environ, "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000"}
    env.pop("WATCHDOG_PID", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == ["builtin", True, 4.0, "StreamHandler"]
    assert sock.recv(4096).decode() == "READY=1\nSTATUS=builtin"
    assert sock.recv(4096).decode() == "WATCHDOG=1"


def test_builtin_path_for_an_explicit_environment(notify_sock: tuple[socket.socket, Path]) -> None:
    # a caller's own mapping (not the process environment libsystemd reads) is served by the builtin path
    sock, path = notify_sock
    assert sd.notify("STATUS=own env", {"NOTIFY_SOCKET": str(path)})
    assert sock.recv(4096).decode() == "STATUS=own env"
    assert sd.notify("STATUS=x", {}) is False


@pytest.mark.parametrize("path", ["python-systemd", "builtin"])
def test_a_full_notify_socket_drops_messages_instead_of_stopping_the_daemon(
    path: str, notify_sock: tuple[socket.socket, Path]
) -> None:
    # systemd reads its socket; one that is not read fills (net.unix.max_dgram_qlen). libsystemd's send then
    # waits, and python-systemd holds the GIL while it does: every thread stopped (test_governor's daemon
    # test hung that way). A notify must return at once, False, and work again once the queue drains.
    if path == "python-systemd" and not _has_python_systemd():
        pytest.skip("python3-systemd is not importable")
    sock, sock_path = notify_sock
    hide = "sys.modules['systemd'] = None\n" if path == "builtin" else ""
    code = (
        f"import sys, json, time\n{hide}"
        "from edged.daemon.host import systemd as sd\n"
        "t = time.monotonic(); sent = [sd.notify(f'STATUS={i}') for i in range(200)]\n"
        "print(json.dumps([sd.notify_backend(), sent.count(True), sent.count(False), time.monotonic() - t]))\n"
    )
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    backend, sent, dropped, seconds = json.loads(run.stdout)
    assert backend == path and sent >= 1 and dropped >= 1 and sent + dropped == 200 and seconds < 5
    received = 0
    sock.settimeout(0.2)
    with contextlib.suppress(TimeoutError):
        while sock.recv(4096):
            received += 1
    assert received == sent
