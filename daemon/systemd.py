"""systemd glue: the sd_notify protocol (one datagram to $NOTIFY_SOCKET, no libsystemd needed), the
watchdog, and journald logging with structured fields.

Outside systemd (no $NOTIFY_SOCKET) every notify is a no-op that returns False; without
$WATCHDOG_USEC the watchdog is off; without $JOURNAL_STREAM (or python3-systemd) logs go to stderr.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

from edged.errors import EdgedError


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    addr = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode())
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
    stderr to the journal ($JOURNAL_STREAM); plain stderr otherwise."""
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
