"""What `edged run` does before the model loads: signals from the first moment, one daemon per state directory.

    parse args -> Signals.install() -> load config -> StateLock(<state_dir>/edged.lock) -> Daemon: staging,
        store recovery, spool -> probation marker -> model load -> warm-up -> READY=1 -> Signals.ready()

SIGTERM and SIGINT stop the daemon at the next safe point in every phase (a model load finishes first; a
warm-up stops between two batches): exit 0, and a model on probation is not blamed. A SIGHUP that comes
before the daemon is ready is remembered, and the config is reloaded once it is (the default action of
SIGHUP would kill the process).

The lock is an flock(2) on ``<state_dir>/edged.lock``, which holds the holder's pid. The kernel drops it
when the process dies, however it dies, so a stale file never blocks a start. A second daemon on the same
state directory exits at once, before it touches the store, the spool or the broker (it would share the
spool and steal the first one's MQTT client id).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from edged.errors import Code, StateDirError

logger = logging.getLogger(__name__)

LOCK_FILE = "edged.lock"


class StateLock:
    """The exclusive lock on a state directory, held from before anything in it is touched until exit.

    `wait_s`: how long to wait for a lock someone else holds (an `edged model` verb holds it for the moment it
    takes to recover the store) before refusing."""

    def __init__(self, state_dir: Path, wait_s: float = 0.0) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None
        self._ident = (0, 0)
        self._lost_said = False
        self._take(wait_s)

    def _take(self, wait_s: float) -> None:
        state_dir = self.state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateDirError(
                f"state_dir {state_dir}: cannot write the lock file {self.path}: {exc.strerror} "
                "(edged needs a writable state directory)"
            ) from exc
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = _read_pid(fd)
                os.close(fd)
                if busy:
                    raise StateDirError(
                        f"state_dir {state_dir}: another edged (pid {holder or 'unknown'}) holds the lock "
                        f"{self.path}; one daemon per state directory (stop that one, or give this one its own "
                        "state_dir)",
                        code=Code.LOCKED,
                    ) from exc
                raise StateDirError(f"state_dir {state_dir}: cannot lock {self.path}: {exc.strerror}") from exc
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise StateDirError(
                f"state_dir {state_dir}: cannot write the lock file {self.path}: {exc.strerror}"
            ) from exc
        self._fd = fd
        self._ident = (st.st_dev, st.st_ino)

    def check(self) -> None:
        """The lock must still be the file at `path`: a state directory deleted while running (rm -rf) takes
        the lock file with it, and a second daemon could then start on the same directory. Take the lock
        again on a new file (the spool re-creates its own file the same way)."""
        if self._fd is None:
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._ident:
                return
        except OSError:
            pass
        old = self._fd
        try:
            self._take(0.0)
        except StateDirError as exc:
            if not self._lost_said:
                logger.error("the state directory's lock file was removed and cannot be taken again: %s", exc)
                self._lost_said = True
            return
        os.close(old)
        self._lost_said = False
        logger.warning("the state directory's lock file %s was removed while running; taken again", self.path)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a daemon that has just opened it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class Signals:
    """SIGTERM / SIGINT: stop at the next safe point, in any phase. SIGHUP: reload once ready; before that
    it is remembered (and logged) and applied when the daemon becomes ready. `install()` from the main thread.

    No work happens in signal context: Python runs a handler in the main thread between two bytecodes,
    wherever that thread is, e.g. holding the lock inside `Event.wait()` or a logging handler's, and a
    handler that sets the same event or logs would deadlock or raise there. So the handlers do nothing; the
    C-level handler writes the signal's number to a pipe (`signal.set_wakeup_fd`), and a thread of ours reads
    it and acts: sets the stop event, calls `on_stop`, reloads."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()
        self.received: str | None = None  # the stop signal's name, once one came
        self._lock = threading.Lock()
        self._on_stop: Callable[[], None] | None = None
        self._reload: Callable[[], None] | None = None
        self._reload_pending = False
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        r, w = os.pipe()
        os.set_blocking(w, False)  # a burst of signals must never block the C handler's write
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _noop)
        self._installed = True
        threading.Thread(target=self._watch, args=(r,), name="signals", daemon=True).start()

    def _watch(self, fd: int) -> None:
        while True:
            for signum in os.read(fd, 64):
                self.handle(signum)

    def handle(self, signum: int) -> None:
        """What a signal means (on the signal thread; tests call it too)."""
        if signum == signal.SIGHUP:
            self._hup()
        elif signum in (signal.SIGTERM, signal.SIGINT):
            self._stop(signal.Signals(signum).name)

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Called (on the signal thread) when a stop signal arrives, after the stop event is set; at once
        when one already came."""
        with self._lock:
            self._on_stop = fn
            stopped = self.stop.is_set()
        if stopped:
            fn()

    def ready(self, reload: Callable[[], None]) -> None:
        """From now on SIGHUP calls `reload`; one that came during start-up is applied now."""
        with self._lock:
            self._reload = reload
            pending, self._reload_pending = self._reload_pending, False
        if pending:
            logger.info("applying the SIGHUP received during start-up: reloading the config")
            reload()

    def _stop(self, name: str) -> None:
        self.received = name
        logger.info("received %s: stopping", name)
        with self._lock:
            self.stop.set()
            fn = self._on_stop
        if fn is not None:
            fn()

    def _hup(self) -> None:
        with self._lock:
            reload = self._reload
            first = not self._reload_pending
            if reload is None:
                self._reload_pending = True
        if reload is not None:
            reload()
        elif first:
            logger.info("received SIGHUP while starting: the config is reloaded once the daemon is ready")


def _noop(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: nothing (the signal thread acts on the wakeup fd's byte)."""
