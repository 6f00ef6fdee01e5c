"""systemd glue: sd_notify, the watchdog, and journald logging with structured fields.

python-systemd (Debian's and JetPack's python3-systemd, what DESIGN's card names) is used where it is
importable: `systemd.daemon.notify` (libsystemd's sd_notify) for READY/STATUS/RELOADING/STOPPING and the
watchdog's pings, `systemd.journal.JournalHandler` for journald. Where it is not (a pip venv without
system site-packages, a rootfs without the package), the same protocol is spoken here: one datagram to
$NOTIFY_SOCKET, no libsystemd needed, and logs go to stderr, which systemd still puts in the journal.
python-systemd has no sd_watchdog_enabled, so the interval comes from $WATCHDOG_USEC on both paths.

Outside systemd (no $NOTIFY_SOCKET) every notify is a no-op that returns False; without
$WATCHDOG_USEC the watchdog is off; without $JOURNAL_STREAM logs go to stderr.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from functools import cache

from edged.errors import EdgedError


@cache
def _sd_notify() -> Callable[..., bool] | None:
    """python-systemd's notify, or None where python3-systemd is not importable."""
    try:
        from systemd import daemon
    except ImportError:
        return None
    fn: Callable[..., bool] = daemon.notify
    return fn


def notify_backend() -> str:
    """Which sd_notify speaks for the daemon: "python-systemd" or "builtin" (this module's own)."""
    return "python-systemd" if _sd_notify() is not None else "builtin"


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `message` to systemd; False outside systemd, or when it could not be sent now. With
    python-systemd present it is libsystemd's sd_notify, which reads the process's own environment; an
    explicit other `environ` (a caller's own mapping) is served by the builtin protocol. Never blocks: a
    notify socket whose queue is full (systemd busy) drops this message rather than stalling the caller."""
    sd = _sd_notify()
    if sd is not None and (environ is None or environ is os.environ):
        addr = os.environ.get("NOTIFY_SOCKET")
        if not addr:
            return False
        with _SEND_LOCK:
            # libsystemd's send waits while the queue is full, and python-systemd holds the GIL through it:
            # every thread of the daemon would stop (seen in tests/test_governor.py with a socket not read)
            if not _would_send(addr):
                return False
            try:
                return bool(sd(message))
            except OSError:
                return False
    return _notify_builtin(message, environ)


_SEND_LOCK = threading.Lock()


def _unix_address(addr: str) -> str | None:
    if addr.startswith("@"):
        return "\0" + addr[1:]  # an abstract socket
    return addr if addr.startswith("/") else None


def _would_send(addr: str) -> bool:
    """Whether a datagram to the AF_UNIX socket `addr` goes out without waiting (its queue is not full).
    Other address kinds (vsock:…) are libsystemd's business: True."""
    path = _unix_address(addr)
    if path is None:
        return True
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            poller = select.poll()
            poller.register(s, select.POLLOUT)
            return any(ev & select.POLLOUT for _, ev in poller.poll(0))
    except OSError:
        return False


def _notify_builtin(message: str, environ: Mapping[str, str] | None = None) -> bool:
    addr = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    path = _unix_address(addr) if addr else None
    if path is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.send(message.encode(), socket.MSG_DONTWAIT)  # a full queue: dropped, not waited on
    except OSError:
        return False
    return True


class Watchdog:
    """WATCHDOG=1 every half of $WATCHDOG_USEC, and only while the caller says the daemon is healthy;
    WATCHDOG=trigger once when it has been unhealthy for a whole watchdog interval (a deadlock: no
    point waiting for systemd's own timeout)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = environ if environ is not None else os.environ
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        mine = not pid or (pid.isdigit() and int(pid) == os.getpid())
        self.interval_s: float | None = int(usec) / 1e6 if usec and usec.isdigit() and mine else None
        self._env = env
        self._next = 0.0
        self._unhealthy_since: float | None = None
        self.triggered = False

    @property
    def stall_s(self) -> float:
        """How long without progress counts as stalled: half the interval (at least 1 s)."""
        return max(1.0, (self.interval_s or 20.0) / 2)

    def tick(self, now: float, healthy: bool, why: str = "") -> None:
        if self.interval_s is None:
            return
        if healthy:
            self._unhealthy_since = None
            if now >= self._next:
                notify("WATCHDOG=1", self._env)
                self._next = now + self.interval_s / 2
            return
        if self._unhealthy_since is None:
            self._unhealthy_since = now
            logging.getLogger(__name__).warning("watchdog: not petting systemd's watchdog: %s", why)
        if not self.triggered and now - self._unhealthy_since >= self.interval_s:
            self.triggered = True
            logging.getLogger(__name__).error(
                "watchdog: %s for %.0f s; asking systemd to act now", why, self.interval_s
            )
            notify("WATCHDOG=trigger", self._env)


def monotonic_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


class _Fields(logging.Filter):
    """Adds journal fields: CAMERA (from camera-<name> threads), EDGED_MODEL, ERROR_CODE (EdgedError)."""

    model = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.threadName and record.threadName.startswith("camera-"):
            record.CAMERA = record.threadName[len("camera-") :]
        if _Fields.model:
            record.EDGED_MODEL = _Fields.model
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EdgedError):
            record.ERROR_CODE = exc.code
        return True


def set_log_model(ref: str) -> None:
    """The model (name@version) every later journal entry names."""
    _Fields.model = ref


def log_handler(environ: Mapping[str, str] | None = None) -> logging.Handler:
    """journald (python3-systemd's JournalHandler, structured fields) when systemd connected our
    stderr to the journal ($JOURNAL_STREAM) and python3-systemd is importable; plain stderr otherwise."""
    env = environ if environ is not None else os.environ
    if env.get("JOURNAL_STREAM"):
        try:
            from systemd.journal import JournalHandler
        except ImportError:
            pass  # python3-systemd missing: stderr still reaches the journal, without fields
        else:
            handler: logging.Handler = JournalHandler(SYSLOG_IDENTIFIER="edged")
            handler.addFilter(_Fields())
            return handler
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    return handler
