"""A package file over HTTP(S) from any web server, CDN or S3-compatible store (DESIGN §6, issue 20).

An offer whose ``urls`` name where each file is has the device fetch it here instead of asking for
chunks over MQTT. Both paths write through one `PartFile`: ``<name>.part`` grows only at its end, is
hashed in order as it grows, and is renamed to ``<name>`` only when its sha256 is the signed
manifest's. Nothing is written past the manifest's size: a GET asks for ``Range: bytes=<have>-<size-1>``
and reads no more than that, whatever the server sends.

- **Resume**: every GET starts at the bytes the file already holds (kept across a server restart, a
  lost connection and a daemon restart: the receiver persists the offset it fsynced). A server that
  ignores ``Range`` (200) has the bytes already held read and dropped, not trusted again.
- **Bandwidth cap**: ``ota.http_rate_kib_s`` (0: none), measured per response.
- **TLS**: certificates and host names are always checked, against ``ota.http_ca_file`` or the
  system's CAs; there is no switch to turn that off.
- **Retries**: a refused or lost connection, a timeout or a short body is tried again after a
  full-jitter back-off (``ota.retry_s`` doubling up to `MAX_RETRY_S`), mirrors in turn, until
  ``ota.give_up_s`` passes without a byte (stalled: what arrived is kept). A 5xx is tried
  `MAX_5XX` times in a row, then fails; 401/403/404/410 and any answer that contradicts the
  manifest's size fail at once (after the other mirrors), with the status and URL in the error.
- **Deadline**: a file must arrive within ``ota.http_timeout_s`` (a grace for connecting) plus its
  bytes still to fetch at ``ota.http_min_rate_kib_s``, retries included (`Deadline`), checked between
  tries and after every read, so a server that drips a byte a second, which ``give_up_s`` never sees
  as silence, fails too (stalled: what arrived is kept); the device then takes other offers again.
- **Cancel**: `Downloader.cancel` stops a download at once from another thread (the ``cancel``
  command): the wait between tries ends and a read blocked on the server is cut.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged import __version__
from edged.errors import Code, EdgedError, PackageError
from edged.protocol.backoff import Backoff

from ...config import OtaConfig

logger = logging.getLogger(__name__)

BLOCK = 64 * 1024  # bytes read (and written) at a time
MAX_RETRY_S = 60.0  # the most one jittered wait before trying again can grow to
MAX_5XX = 3  # server errors in a row (no byte gained) before the download fails
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class PartFile:
    """``<name>.part`` in a transfer's stage folder: written only at its end (`done`), hashed as it grows,
    renamed to ``<name>`` by `finish` only when its sha256 is the manifest's."""

    def __init__(self, stage: Path, name: str, size: int, persisted: int) -> None:
        self.name, self.size = name, size
        self.path, self.final = stage / f"{name}.part", stage / name
        if self.final.exists():  # hashed and renamed by a run that stopped before installing
            os.replace(self.final, self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self.done = min(persisted, size, os.fstat(self.fd).st_size)
            os.ftruncate(self.fd, self.done)  # bytes past the last persisted offset may be torn: fetch them again
            self.digest = hashlib.sha256()
            kept = 0
            while kept < self.done:  # a resume: the bytes kept count too (the only time a file is read back)
                block = os.pread(self.fd, min(1 << 20, self.done - kept), kept)
                if not block:
                    raise EdgedError(f"{self.path}: shorter than the {self.done} bytes recorded", code=Code.FAILED)
                self.digest.update(block)
                kept += len(block)
        except BaseException:
            os.close(self.fd)
            raise
        self.synced = self.done  # what a restart may resume from once the caller has recorded it

    def write(self, data: bytes) -> None:
        if self.done + len(data) > self.size:
            raise ValueError(f"{self.name}: {self.done} + {len(data)} bytes is past its size {self.size}")
        os.pwrite(self.fd, data, self.done)
        self.digest.update(data)  # in order: bytes are written only at `done`
        self.done += len(data)

    def sync(self) -> int:
        """fsync; the offset a restart may resume from (record it after this returns)."""
        os.fsync(self.fd)
        self.synced = self.done
        return self.done

    def finish(self, sha256: str, what: str) -> None:
        """Rename to the file's name when whole and its sha256 is `sha256`; else PackageError(hash_mismatch),
        the part file discarded."""
        if self.digest.hexdigest() != sha256:
            self.path.unlink()
            raise PackageError(
                f"{what}: {self.name}: sha256 does not match the manifest (corrupt or tampered in transit); the "
                "file is discarded",
                code=Code.HASH_MISMATCH,
            )
        os.fsync(self.fd)
        os.replace(self.path, self.final)

    def close(self) -> None:
        os.close(self.fd)


class Deadline:
    """When one file's download must be done: ``ota.http_timeout_s`` (a grace for connecting) plus its
    bytes still to fetch at ``ota.http_min_rate_kib_s`` (0: never)."""

    def __init__(self, cfg: OtaConfig, part: PartFile, now: float) -> None:
        self.cfg, self.part = cfg, part
        self.start, self.start_bytes = now, part.done
        rate = cfg.http_min_rate_kib_s * 1024
        self.budget_s = cfg.http_timeout_s + (part.size - part.done) / rate if rate > 0 else float("inf")
        self.at = now + self.budget_s

    def left_s(self, now: float) -> float:
        return self.at - now

    def check(self, now: float) -> None:
        """EdgedError(stalled) once the deadline has passed, naming the rate and its key."""
        if now <= self.at:
            return
        part, cfg = self.part, self.cfg
        raise EdgedError(
            f"{part.name}: {part.done - self.start_bytes} of {part.size - self.start_bytes} bytes in "
            f"{now - self.start:.0f} s, slower than ota.http_min_rate_kib_s ({cfg.http_min_rate_kib_s:g} KiB/s) "
            f"allows: its deadline of {self.budget_s:.0f} s (ota.http_timeout_s {cfg.http_timeout_s:g} s + "
            f"{(part.size - self.start_bytes) / 1024:.0f} KiB at that rate) passed; {part.done} of {part.size} "
            "bytes kept for a resume",
            code=Code.STALLED,
        )


class _Retry(Exception):
    """A failed attempt worth trying again (the message says what happened)."""

    def __init__(self, message: str, server_error: bool = False) -> None:
        super().__init__(message)
        self.server_error = server_error


class _Refused(Exception):
    """A failed attempt that trying the same URL again would not mend (the message says why)."""


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Certificate and host name checks, always: against `ca_file`, or the system's CAs."""
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise EdgedError(f"ota.http_ca_file {ca_file}: {exc}", code=Code.DOWNLOAD_FAILED) from exc


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Redirects are followed, but never from https to anything else: the bytes would travel in clear."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if req.full_url.lower().startswith("https:") and not newurl.lower().startswith("https:"):
            raise urllib.error.HTTPError(
                req.full_url, code, f"refused a redirect from https to {newurl.split('?', 1)[0]}", headers, fp
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Watched(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """The opener's http and https handlers, which hand each connection's socket, as soon as it exists, to
    `on_socket`: a socket `Downloader` can cut from another thread (a deadline, a cancel) whatever it blocks
    in (connecting, a TLS handshake, headers or a body dripped a byte at a time)."""

    def __init__(self, context: ssl.SSLContext, on_socket: Callable[[socket.socket], None]) -> None:
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self, context=context)
        self._on_socket = on_socket

    def do_open(self, http_class: Any, req: Any, **http_conn_args: Any) -> http.client.HTTPResponse:
        on_socket = self._on_socket

        class Conn(http_class):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = self._tcp

            @staticmethod
            def _tcp(*args: Any, **kwargs: Any) -> socket.socket:
                sock = socket.create_connection(*args, **kwargs)
                on_socket(sock)  # the TCP socket, before any TLS handshake
                return sock

            def connect(self) -> None:
                super().connect()
                on_socket(self.sock)  # the TLS socket that replaced it (the same one in plain http)

        return super().do_open(Conn, req, **http_conn_args)


class Downloader:
    """Fills a `PartFile` from its URLs (see the module's docstring for the rules)."""

    def __init__(self, cfg: OtaConfig, stop: threading.Event) -> None:
        self.cfg = cfg
        self._stop = stop
        self._cancel = threading.Event()  # the download under way stops when set (`fetch`'s, `cancel`)
        self._sock: socket.socket | None = None  # the connection of the GET under way: what `_cut` shuts
        self._sock_lock = threading.Lock()
        self._ca = str(cfg.http_ca_file) if cfg.http_ca_file is not None else "the system's CAs"
        self._opener = urllib.request.OpenerDirector()  # http and https only: no file:, ftp: or data: handler
        for handler in (
            urllib.request.ProxyHandler(),  # http(s)_proxy and no_proxy from the environment, as curl does
            _Watched(tls_context(cfg.http_ca_file), self._connected),
            _NoDowngrade(),
            urllib.request.HTTPDefaultErrorHandler(),
            urllib.request.HTTPErrorProcessor(),
        ):
            self._opener.add_handler(handler)

    def fetch(
        self,
        urls: Callable[[], list[str]],
        part: PartFile,
        on_bytes: Callable[[], None],
        on_retry: Callable[[str, float], None],
        cancel: threading.Event | None = None,
    ) -> None:
        """Fill `part` up to its size from `urls()` (asked again before each try: the list may change), in
        turn; returns early only when stopping. `on_bytes` after each block written,
        `on_retry(error, wait_s)` before each wait. EdgedError: download_failed (refused by every URL, or
        too many server errors), stalled (no byte for ``give_up_s``, or past its `Deadline`). Returns early,
        the file short, when stopping or when `cancel` is set (by `Downloader.cancel`, or before)."""
        if cancel is not None:
            self._cancel = cancel
        elif self._cancel.is_set():  # a `cancel()` of an earlier fetch: this one starts afresh
            self._cancel = threading.Event()
        backoff = Backoff(self.cfg.retry_s, max(self.cfg.retry_s, MAX_RETRY_S))
        refused: dict[str, str] = {}
        server_errors = 0
        last_byte = time.monotonic()
        deadline = Deadline(self.cfg, part, last_byte)
        i = 0
        while part.done < part.size and not self._halted():
            live = [u for u in urls() if u not in refused]
            if not live:
                raise EdgedError("; ".join(refused.values()), code=Code.DOWNLOAD_FAILED)
            url = live[i % len(live)]
            before = part.done
            try:
                self._get(url, part, on_bytes, deadline)
                continue  # whole, or stopping
            except _Refused as exc:
                refused[url] = str(exc)
                logger.warning("ota: %s", exc)
                continue
            except _Retry as exc:
                error, server_error = str(exc), exc.server_error
            now = time.monotonic()
            if part.done > before:
                last_byte, server_errors = now, 0
                backoff.reset()
            server_errors = server_errors + 1 if server_error else 0
            if server_errors >= MAX_5XX:
                raise EdgedError(f"{error} ({server_errors} times in a row)", code=Code.DOWNLOAD_FAILED)
            if self._halted():
                return
            if now - last_byte > self.cfg.give_up_s:
                raise EdgedError(
                    f"no byte of {part.name} for {self.cfg.give_up_s:.0f} s ({part.done} of {part.size} kept for a "
                    f"resume); the last try: {error}",
                    code=Code.STALLED,
                )
            deadline.check(now)
            wait_s = min(backoff.next_s(), max(0.0, deadline.left_s(now)))  # past the deadline: no next try
            logger.warning("ota: %s; trying again in %.1f s at byte %d", error, wait_s, part.done)
            on_retry(error, wait_s)
            i += 1  # the next mirror, if there are several
            self._wait(wait_s)
            deadline.check(time.monotonic())

    def cancel(self) -> None:
        """Stop the download under way (another thread: the ``cancel`` command): `fetch` returns, the file
        short, at once: a wait between tries ends, a read blocked on the server is cut."""
        self._cancel.set()
        self._cut()

    def _connected(self, sock: socket.socket) -> None:
        with self._sock_lock:
            self._sock = sock
        if self._cancel.is_set():
            self._cut()

    def _cut(self) -> None:
        """Shut the connection of the GET under way (any thread): whatever the transfer thread blocks in on it
        returns at once (EOF or an error), so its loop sees a cancel or its deadline."""
        with self._sock_lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):  # already closed by its end
                    socket.socket.shutdown(self._sock, socket.SHUT_RDWR)  # plain shutdown(2), TLS or not

    def _halted(self) -> bool:
        return self._stop.is_set() or self._cancel.is_set()

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds`, ending early when cancelled (at once) or stopping (within a quarter second)."""
        end = time.monotonic() + seconds
        while not self._halted() and (left := end - time.monotonic()) > 0:
            self._cancel.wait(min(left, 0.25))

    def _get(self, url: str, part: PartFile, on_bytes: Callable[[], None], deadline: Deadline) -> None:
        start, size = part.done, part.size
        where = f"GET {url} (bytes {start}-{size - 1})"
        if not url.startswith(("http://", "https://")):  # the offer's schema allows nothing else
            raise _Refused(f"{where}: not an http(s) URL")
        # a server that drips its headers or body a byte at a time never trips the socket's timeout: the
        # connection is cut at the deadline, from a timer
        left_s = deadline.left_s(time.monotonic())
        timer = threading.Timer(max(0.0, left_s), self._cut) if left_s != float("inf") else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            self._get_cut_at_deadline(url, part, on_bytes, deadline, where)
        finally:
            if timer is not None:
                timer.cancel()
            with self._sock_lock:
                self._sock = None

    def _get_cut_at_deadline(
        self, url: str, part: PartFile, on_bytes: Callable[[], None], deadline: Deadline, where: str
    ) -> None:
        start, size = part.done, part.size
        headers = {
            "Range": f"bytes={start}-{size - 1}",
            "Accept-Encoding": "identity",
            "User-Agent": f"edged/{__version__}",
        }
        try:
            request = urllib.request.Request(url, headers=headers)  # noqa: S310  (http or https, checked in _get)
            resp = self._opener.open(request, timeout=self.cfg.http_timeout_s)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416:
                raise _Refused(
                    f"{where}: HTTP 416: the server's file is shorter than the manifest's {size} bytes"
                ) from None
            if exc.code in (408, 429) or exc.code >= 500:
                raise _Retry(f"{where}: HTTP {exc.code} {exc.reason}", server_error=exc.code >= 500) from None
            raise _Refused(f"{where}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise _Refused(
                    f"{where}: TLS: certificate verify failed: {exc.reason.verify_message} (trusting {self._ca})"
                ) from None
            raise _Retry(f"{where}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Retry(f"{where}: {type(exc).__name__}: {exc}") from None
        with resp:
            self._read(resp, where, part, on_bytes, deadline)

    def _read(
        self,
        resp: http.client.HTTPResponse,
        where: str,
        part: PartFile,
        on_bytes: Callable[[], None],
        deadline: Deadline,
    ) -> None:
        start, size = part.done, part.size
        skip = self._check(resp, where, start, size)
        rate = self.cfg.http_rate_kib_s * 1024
        t0, got = time.monotonic(), 0
        while part.done < size and not self._halted():
            want = min(BLOCK, skip if skip else size - part.done)
            try:
                block = resp.read1(want)  # what has arrived, up to `want`: progress and stops stay live
            except (OSError, ValueError, http.client.HTTPException) as exc:
                if self._halted():
                    return  # cut by `cancel` (a TLS socket cut under its reader says ValueError)
                # cut by the deadline's timer, or lost: tried again, unless the deadline passed (`fetch` checks)
                raise _Retry(f"{where}: cut at byte {part.done}: {type(exc).__name__}: {exc}") from None
            if not block:
                if self._halted():
                    return
                raise _Retry(f"{where}: the server closed the connection at byte {part.done}")
            got += len(block)
            if skip:
                skip -= len(block)  # a 200 from the first byte: the bytes already held are dropped
            else:
                part.write(block)
                on_bytes()
            deadline.check(time.monotonic())  # a drip never goes silent: the deadline is checked as it reads
            if rate > 0:  # the cap: sleep off whatever this response is ahead of it
                ahead = got / rate - (time.monotonic() - t0)
                if ahead > 0:
                    self._wait(ahead)

    @staticmethod
    def _check(resp: http.client.HTTPResponse, where: str, start: int, size: int) -> int:
        """Whether the answer is the bytes asked for: how many leading bytes to drop (a 200 to a resume)."""
        length = resp.headers.get("Content-Length")
        if resp.status == 206:
            m = CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if m is None:
                raise _Refused(f"{where}: 206 without a byte Content-Range")
            first, total = int(m.group(1)), m.group(3)
            if first != start:
                raise _Refused(f"{where}: the server answered from byte {first}")
            if total != "*" and int(total) != size:
                raise _Refused(f"{where}: the server's file is {total} bytes, the manifest says {size}")
            return 0
        if resp.status == 200:
            if length is not None and length.isdigit() and int(length) != size:
                raise _Refused(f"{where}: the server's file is {length} bytes, the manifest says {size}")
            return start
        raise _Refused(f"{where}: unexpected HTTP {resp.status}")
