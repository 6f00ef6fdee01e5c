"""Files off the device by HTTP PUT: event clips and the frames worth labelling, to any server that takes
PUT (nginx with WebDAV, an S3 presigned-style gateway, a small web app), through one durable queue.

    clips / labelling ──enqueue()──> queue.json (<state_dir>/uploads/, atomic) ──uploader thread──> PUT <url>/<name>
                                          2xx: done, the entry leaves the queue <──┘

- **Durable**: the queue is a small JSON file rewritten atomically (fsynced, renamed) at every change of
  its entries, so a daemon restart resumes it where it stopped. The file itself stays where its caller's
  store keeps it until its upload ends (`on_done`), or until that store evicts it (`forget`): a file gone
  from its place when its turn comes is dropped, counted.
- **Bounded**: by entries (``upload.max_queue``) and bytes (``upload.max_mb``); a full queue refuses a
  new file (`enqueue` returns False, counted as dropped) and the caller keeps or drops it.
- **Retries**: a refused or lost connection, a timeout, a 5xx, 408 or 429 is tried again after a
  full-jitter back-off (``retry_min_s`` doubling up to ``retry_max_s``), for as long as the daemon runs:
  an upload never gives up on a server that is down. The queue keeps its order; the one endpoint is
  either up or not.
- **Permanent failures**: any other 4xx (and a 3xx but 307/308) says the server will never take this
  file as asked: logged, counted, moved to the queue's failed list (``upload.max_failed``, oldest
  forgotten first) until the caller's store evicts the file.
- **Redirects**: a 307 or 308 is followed (up to `MAX_REDIRECTS`), the body sent again to its
  ``Location`` without our ``Authorization``: how a small signer in front of S3 hands out a presigned
  URL per object (docs/operator.md, "Uploads"); never from https to http. A URL's query never reaches
  the log.
- **Verified by the status**: only a 2xx answer (nginx: 201 Created or 204 No Content) counts.
- **Auth and TLS**: ``Authorization: Bearer`` from ``token_file``, or basic auth with ``username`` and
  ``password_file`` (each read per try, so a rotated secret is taken up); an https URL's certificate and
  host name are always checked, against ``ca_file`` or the system's CAs.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, quote, urljoin, urlsplit

from edged import __version__
from edged.errors import StateDirError
from edged.protocol.backoff import Backoff

from ...models.store.files import write_atomic
from ..config import Config, UploadConfig

logger = logging.getLogger(__name__)

QUEUE_FILE = "queue.json"
SCHEMA = "edged.uploads/1"
BLOCK = 64 * 1024  # bytes sent at a time
MAX_ANSWER = 64 * 1024  # bytes of an answer's body read (and dropped) so that the connection ends cleanly
MISSING = "missing"  # the file left its place before its turn: dropped, counted
MAX_REDIRECTS = 3  # 307/308 answers followed for one PUT
RETRY_STATUS = frozenset({408, 429})  # 4xx answers that mean "later", not "never"
REMOTE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){0,7}$")

OnDone = Callable[[str, bool], None]


@dataclass
class Entry:
    """One file waiting for its PUT (or refused for good, in the failed list)."""

    id: int
    local: str
    remote: str
    content_type: str
    bytes: int
    added: float  # time.time() it was queued
    attempts: int = 0
    error: str = ""  # the last try's failure, in one line


class Uploader:
    """One thread, ``uploader``; a durable, bounded queue under ``<state_dir>/uploads/``."""

    def __init__(self, cfg: UploadConfig, state_dir: Path, stop: threading.Event) -> None:
        self.cfg = cfg
        self.dir = state_dir / "uploads"
        self.path = self.dir / QUEUE_FILE
        self._stop = stop
        self._halt = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._queue: list[Entry] = []
        self._failed: list[Entry] = []
        self._callbacks: dict[int, OnDone] = {}
        self._inflight: int | None = None
        self._next_id = 1
        self._max_bytes = int(cfg.max_mb * 1024 * 1024)
        self._backoff = Backoff(cfg.retry_min_s, cfg.retry_max_s)
        self._thread: threading.Thread | None = None
        self.counts = {"uploaded": 0, "failed_attempts": 0, "failed": 0, "dropped": 0, "bytes_uploaded": 0}
        self._conn: http.client.HTTPConnection | None = None  # the PUT in flight, for `stop` to cut
        self._load()

    # -- the callers' side ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a PUT in flight is cut (its file stays queued and goes again at the next start)."""
        self._halt.set()
        self._wake.set()
        with self._lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def enqueue(self, local: Path, remote_name: str, content_type: str, on_done: OnDone | None = None) -> bool:
        """Queue `local` for PUT to ``<url>/<remote_name>``; False (counted as dropped) when the queue is full
        or the file is not there. The file must stay in place until `on_done(remote_name, ok)` (or `forget`).
        The same file to the same name already waiting is not queued twice (its newest content goes)."""
        if not REMOTE_NAME.match(remote_name) or ".." in remote_name:
            raise ValueError(f"remote name {remote_name!r}: letters, digits, '_', '.', '-' in up to 8 '/' levels")
        try:
            size = local.stat().st_size
        except OSError as exc:
            logger.warning("upload of %s refused: %s", local, exc.strerror or exc)
            with self._lock:
                self.counts["dropped"] += 1
            return False
        with self._lock:
            for e in self._queue:
                if e.local == str(local) and e.remote == remote_name and e.id != self._inflight:
                    if on_done is not None:
                        self._callbacks[e.id] = on_done
                    return True
            queued_bytes = sum(e.bytes for e in self._queue)
            if len(self._queue) >= self.cfg.max_queue or queued_bytes + size > self._max_bytes:
                self.counts["dropped"] += 1
                logger.warning(
                    "upload queue full (%d files, %d bytes): %s refused", len(self._queue), queued_bytes, remote_name
                )
                return False
            entry = Entry(self._next_id, str(local), remote_name, content_type, size, time.time())
            self._next_id += 1
            self._queue.append(entry)
            if on_done is not None:
                self._callbacks[entry.id] = on_done
            self._save()
        self._wake.set()
        return True

    def forget(self, local: Path) -> int:
        """Drop every waiting or failed entry of `local` (its store evicts it); the one in flight ends on its
        own. Returns how many were dropped."""
        with self._lock:
            keep = [e for e in self._queue if e.local != str(local) or e.id == self._inflight]
            gone = len(self._queue) - len(keep)
            failed = [e for e in self._failed if e.local != str(local)]
            gone_failed = len(self._failed) - len(failed)
            if gone or gone_failed:
                for e in self._queue:
                    if e.local == str(local) and e.id != self._inflight:
                        self._callbacks.pop(e.id, None)
                self._queue, self._failed = keep, failed
                self.counts["dropped"] += gone
                self._save()
        return gone + gone_failed

    def state_of(self, local: Path) -> str | None:
        """``queued``, ``uploading`` or ``failed`` while the queue holds `local`; None otherwise."""
        with self._lock:
            for e in self._queue:
                if e.local == str(local):
                    return "uploading" if e.id == self._inflight else "queued"
            if any(e.local == str(local) for e in self._failed):
                return "failed"
        return None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "queued": len(self._queue),
                "queued_bytes": sum(e.bytes for e in self._queue),
                **self.counts,
                "failed_kept": len(self._failed),
            }

    def failed(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(e) for e in self._failed]

    # -- the queue's file --------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot create {self.dir}: {exc.strerror or exc}") from exc
        try:
            doc = json.loads(self.path.read_bytes())
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema')!r}, not {SCHEMA}")
            self._queue = [Entry(**e) for e in doc["queue"]]
            self._failed = [Entry(**e) for e in doc["failed"]]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            bad = self.path.with_name(QUEUE_FILE + ".corrupt")
            logger.error("upload queue %s unreadable (%s): moved to %s, starting empty", self.path, exc, bad)
            with contextlib.suppress(OSError):
                os.replace(self.path, bad)
            self._queue, self._failed = [], []
            return
        self._next_id = max((e.id for e in self._queue + self._failed), default=0) + 1
        if self._queue:
            logger.info("upload queue resumed: %d files waiting", len(self._queue))

    def _save(self) -> None:
        """Under the lock. A failed write is logged, not raised: the entries stay in memory and go out."""
        doc = {"schema": SCHEMA, "queue": [asdict(e) for e in self._queue], "failed": [asdict(e) for e in self._failed]}
        try:
            write_atomic(self.path, json.dumps(doc, separators=(",", ":")).encode())
        except StateDirError as exc:
            logger.error("upload queue not saved: %s", exc)

    # -- the uploader thread -----------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._halt.is_set() or self._stop.is_set()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stopping() and (left := end - time.monotonic()) > 0:
            self._halt.wait(min(left, 0.5))

    def _run(self) -> None:
        while not self._stopping():
            with self._lock:
                entry = self._queue[0] if self._queue else None
                self._inflight = entry.id if entry is not None else None
            if entry is None:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                ok, permanent, why = self._put(entry)
            except Exception:  # the loop's boundary: one bad entry must not end uploads for good
                logger.exception("upload of %s failed unexpectedly", entry.remote)
                ok, permanent, why = False, False, "unexpected error (logged)"
            self._finish(entry, ok, permanent, why)
            if not ok and not permanent and why != MISSING:  # a file gone is dropped: no reason to wait
                self._sleep(self._backoff.next_s())
            else:
                self._backoff.reset()

    def _finish(self, entry: Entry, ok: bool, permanent: bool, why: str) -> None:
        done: OnDone | None = None
        with self._lock:
            self._inflight = None
            if ok or permanent or why == MISSING:
                self._queue = [e for e in self._queue if e.id != entry.id]
                done = self._callbacks.pop(entry.id, None)
                if ok:
                    self.counts["uploaded"] += 1
                    self.counts["bytes_uploaded"] += entry.bytes
                elif permanent:
                    entry.error = why
                    self.counts["failed"] += 1
                    self._failed.append(entry)
                    del self._failed[: max(0, len(self._failed) - self.cfg.max_failed)]
                else:
                    self.counts["dropped"] += 1
                self._save()
            else:
                entry.attempts += 1
                entry.error = why
                self.counts["failed_attempts"] += 1
        if ok:
            logger.info("uploaded %s (%d bytes)", entry.remote, entry.bytes)
        elif permanent:
            logger.error("upload of %s refused for good: %s", entry.remote, why)
        elif why == MISSING:
            logger.warning("upload of %s dropped: %s is gone", entry.remote, entry.local)
        elif entry.attempts == 1 or entry.attempts % 10 == 0:  # throttled: a long outage logs a line per ten
            logger.warning("upload of %s failed (try %d), will retry: %s", entry.remote, entry.attempts, why)
        if done is not None:
            try:
                done(entry.remote, ok)
            except Exception:  # a caller's callback: logged, the queue goes on
                logger.exception("upload callback for %s failed", entry.remote)

    def _headers(self, entry: Entry, size: int, auth: bool = True) -> dict[str, str]:
        headers = {
            "Content-Type": entry.content_type,
            "Content-Length": str(size),
            "User-Agent": f"edged/{__version__}",
        }
        if not auth:
            return headers
        if self.cfg.token_file is not None:
            headers["Authorization"] = "Bearer " + self.cfg.token_file.read_text().strip()
        elif self.cfg.username is not None and self.cfg.password_file is not None:
            secret = f"{self.cfg.username}:{self.cfg.password_file.read_text().strip()}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
        return headers

    def _connection(self, url: SplitResult) -> http.client.HTTPConnection:
        timeout = self.cfg.timeout_s
        if url.scheme == "https":
            ctx = ssl.create_default_context(cafile=str(self.cfg.ca_file) if self.cfg.ca_file else None)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                url.hostname or "", url.port, timeout=timeout, context=ctx, blocksize=BLOCK
            )
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout, blocksize=BLOCK)
        conn.connect()
        with self._lock:
            if self._halt.is_set():
                conn.close()
                raise OSError("the uploader is stopping")
            self._conn = conn  # `stop` cuts it: a PUT blocked on a slow network does not hold the shutdown
        return conn

    def _put(self, entry: Entry) -> tuple[bool, bool, str]:
        """(ok, permanent, why): one PUT of `entry`'s file, following up to `MAX_REDIRECTS` 307/308 answers (a
        signer in front of S3 answers with a presigned URL: the body goes there, without our Authorization)."""
        url = urlsplit(f"{self.cfg.url}/{quote(entry.remote)}")
        first = True
        for _ in range(MAX_REDIRECTS + 1):
            try:
                status, reason, location = self._put_once(entry, url, auth=first)
            except FileNotFoundError:
                return False, False, MISSING
            except _Unreadable as exc:
                return False, exc.permanent, str(exc)
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout, TLS, a broken answer
                return False, False, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return True, False, ""
            target = urlsplit(urljoin(url.geturl(), location)) if location else None
            if status in (307, 308) and target is not None and target.scheme in ("http", "https"):
                if url.scheme == "https" and target.scheme == "http":  # the file would travel in clear
                    return False, True, f"refused a redirect from https to {_shown(target)}"
                url, first = target, False
                continue
            why = f"HTTP {status} {reason} for PUT {_shown(url)}"
            return False, not (status >= 500 or status in RETRY_STATUS), why
        return False, True, f"more than {MAX_REDIRECTS} redirects for PUT {self.cfg.url}/{entry.remote}"

    def _put_once(self, entry: Entry, url: SplitResult, auth: bool) -> tuple[int, str, str]:
        """(status, reason, Location) of one PUT of the file to `url`; OSError / HTTPException as they come."""
        try:
            f = open(entry.local, "rb")  # noqa: SIM115 (closed below, after the request has read it)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _Unreadable(f"cannot read {entry.local}: {exc.strerror or exc}", permanent=True) from exc
        with f:
            size = os.fstat(f.fileno()).st_size
            try:
                headers = self._headers(entry, size, auth)
            except OSError as exc:
                raise _Unreadable(f"credentials unreadable: {exc.strerror or exc}", permanent=False) from exc
            conn = self._connection(url)  # connected
            try:
                target = url.path + (f"?{url.query}" if url.query else "")
                conn.request("PUT", target, body=f, headers=headers)
                answer = conn.getresponse()
                answer.read(MAX_ANSWER)
            finally:
                with self._lock:
                    self._conn = None
                conn.close()
        entry.bytes = size
        return answer.status, answer.reason, answer.getheader("Location") or ""


def build_uploader(cfg: Config, stop: threading.Event) -> Uploader | None:
    """The daemon's uploader with an ``upload:`` section, else None; its thread starts with `start()`."""
    return Uploader(cfg.upload, cfg.state_dir, stop) if cfg.upload is not None else None


class _Unreadable(Exception):
    """The file or a credential file cannot be read (inside `_put` only)."""

    def __init__(self, why: str, permanent: bool) -> None:
        super().__init__(why)
        self.permanent = permanent


def _shown(url: SplitResult) -> str:
    """A URL for a log line: without its query (a presigned URL's signature stays out of the journal)."""
    return url._replace(query="", fragment="").geturl()
