"""HTTP snapshot cameras: ``snapshot+http://[USER@]HOST[:PORT]/PATH`` (and ``snapshot+https://``), one JPEG
fetched at a time from a camera that serves only a still (``/snapshot.jpg``, ``/cgi-bin/snapshot.cgi``).

- Polled at the camera's ``fps_max`` (every ``1 / fps_max`` s), on one kept-alive HTTP/1.1 connection where
  the camera allows it; the URL is the URI without ``snapshot+``, query and all (credentials go as HTTP
  Basic; ``password_file`` gives the password).
- Every request is bounded by ``stall_timeout_s``: connecting, the answer and the body. A read gives a
  frame, or None once ``stall_timeout_s`` has passed without one (the camera thread counts a stall and
  reopens), or raises CaptureError for an answer that polling again will not change (401, 403, 404, a
  certificate that does not verify): the camera is down with that reason and reopens with back-off.
- ``max_frame_pixels``: a snapshot's JPEG frame header (SOF) is read as the body arrives; one over the bound
  is refused (counted, logged by ``framebound``) before the rest is read or anything is decoded. A body
  over 32 MiB, or one with no JPEG frame header, is not decoded either.
- ``snapshot+https://`` verifies the camera's certificate against the system's CAs.

Light at import (``registry`` imports it for the config loader): OpenCV is imported where a JPEG is
decoded.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from edged.errors import CaptureError

from .framebound import jpeg_size
from .redact import scrub

if TYPE_CHECKING:
    import numpy as np

    from ..config.cameras import CameraConfig
    from .framebound import FrameBound
    from .source import Opening

MAX_SNAPSHOT_BYTES = 32 << 20  # as an MJPEG part: larger is not a camera's JPEG
_CHUNK = 1 << 16
_AGAIN = (408, 425, 429)  # 4xx that a later poll may not get; 5xx are all "again"


class _Again(Exception):
    """This poll gave no frame; a later one may (refused, timed out, 503, a torn or oversized JPEG)."""


class SnapshotSource:
    """Polls `url` (http:// or https://, credentials in it) every `interval_s`; see the module's notes."""

    fps = 0.0  # a snapshot carries no rate (the probe measures it)
    scaled_from: tuple[int, int] | None = None  # frames come at their own size

    def __init__(
        self,
        url: str,
        shown: str,
        interval_s: float,
        timeout_s: float,
        bound: FrameBound,
        stop: threading.Event | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CaptureError(f"{shown}: not an http(s) URL with a host")
        self.shown = shown
        self.bound = bound
        self.bad = 0  # polls whose answer was no decodable JPEG
        self.last_error = ""  # why the last poll gave no frame ("" after a frame)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stop = stop if stop is not None else threading.Event()
        self._due = 0.0
        self._pending: np.ndarray | None = None
        self._target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._headers = {"User-Agent": "edged", "Accept": "image/jpeg, image/*"}
        self._user = parts.username is not None
        if self._user:
            cred = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if parts.scheme == "https":
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, port, timeout=timeout_s, context=ssl.create_default_context()
            )
        else:
            self._conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout_s)

    def first(self) -> None:
        """The open's poll: a frame now, or CaptureError saying why not."""
        try:
            self._pending = self._poll(time.monotonic() + self._timeout_s)
        except _Again as exc:
            raise CaptureError(f"{self.shown}: {exc}") from exc

    def read(self) -> np.ndarray | None:
        if self._pending is not None:
            frame, self._pending = self._pending, None
            return frame
        deadline = time.monotonic() + self._timeout_s
        while True:
            wait = self._due - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return None
            if self._stop.is_set() or time.monotonic() >= deadline:
                return None
            try:
                return self._poll(deadline)
            except _Again as exc:
                self.last_error = str(exc)

    def close(self) -> None:
        self._conn.close()

    def _poll(self, deadline: float) -> np.ndarray:
        now = time.monotonic()
        self._due = max(self._due + self._interval_s, now)
        try:
            try:
                data = self._fetch(deadline)
            except (http.client.RemoteDisconnected, BrokenPipeError):  # a kept-alive connection the camera closed
                self._conn.close()
                data = self._fetch(deadline)
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()  # the next poll connects again
            if isinstance(exc, ssl.SSLCertVerificationError):
                why = exc.verify_message or str(exc)
                raise CaptureError(
                    f"{self.shown}: TLS: the camera's certificate does not verify against the system's CAs: {why}"
                ) from exc
            if isinstance(exc, TimeoutError):
                raise _Again(f"no snapshot within {self._timeout_s:g} s") from exc
            if isinstance(exc, ConnectionRefusedError):
                raise _Again("connection refused (nothing listens at that address and port)") from exc
            raise _Again(scrub(f"{type(exc).__name__}: {exc}")) from exc
        size = jpeg_size(data)
        if size is None:
            self.bad += 1
            raise _Again(f"the answer ({len(data)} bytes) is not a JPEG")
        import cv2
        import numpy as np

        frame = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if frame is None:
            self.bad += 1
            raise _Again(f"a JPEG of {size[0]}x{size[1]} that does not decode (cut short?)")
        self.last_error = ""
        out: np.ndarray = frame
        return out

    def _fetch(self, deadline: float) -> bytes:
        """One GET: the body of a 200; CaptureError for an answer polling again will not change."""
        self._bounded(deadline)
        self._conn.request("GET", self._target, headers=self._headers)
        self._bounded(deadline)
        resp = self._conn.getresponse()
        if resp.status != 200:
            resp.close()
            self._conn.close()
            if resp.status in _AGAIN or resp.status >= 500:
                raise _Again(f"HTTP {resp.status} {resp.reason}")
            raise CaptureError(f"{self.shown}: HTTP {resp.status} {resp.reason}{self._meaning(resp)}")
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > MAX_SNAPSHOT_BYTES:
            self._conn.close()
            raise _Again(f"a snapshot of {length} bytes (at most {MAX_SNAPSHOT_BYTES} taken)")
        body = bytearray()
        checked = False
        while chunk := self._chunk(resp, deadline):
            body += chunk
            if len(body) > MAX_SNAPSHOT_BYTES:
                self._conn.close()
                raise _Again(f"a snapshot of over {MAX_SNAPSHOT_BYTES} bytes")
            if not checked and (size := jpeg_size(bytes(body[:_CHUNK]))) is not None:
                checked = True
                if not self.bound.allows(*size):  # counted and logged there: the rest is not even read
                    self._conn.close()
                    raise _Again(f"a {size[0]}x{size[1]} snapshot, over max_frame_pixels {self.bound.max_pixels}")
        return bytes(body)

    def _chunk(self, resp: http.client.HTTPResponse, deadline: float) -> bytes:
        self._bounded(deadline)
        return resp.read1(_CHUNK)

    def _bounded(self, deadline: float) -> None:
        """Every socket wait from here ends by `deadline` (connect included)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the poll's time is up")
        self._conn.timeout = left
        if self._conn.sock is not None:
            self._conn.sock.settimeout(left)

    def _meaning(self, resp: http.client.HTTPResponse) -> str:
        if resp.status == 404:
            return ": no snapshot at that path (the camera's manual names it, e.g. /snapshot.jpg)"
        if resp.status == 401 and "digest" in (resp.getheader("WWW-Authenticate") or "").lower():
            return ": the camera asks for Digest authentication; snapshot polling sends Basic only"
        if resp.status == 401:
            if self._user:
                return ": the camera refused the user and password given"
            return ": the camera wants a user and password (USER@ in the URI, the password in password_file)"
        if resp.status == 403:
            return ": the camera refuses this user the snapshot"
        return ""


def open_snapshot(cam: CameraConfig, opening: Opening) -> SnapshotSource:
    """Open `cam`'s snapshot URL: its first snapshot is fetched here, so a camera that does not answer, says
    401/404, or sends no JPEG is down with that reason at once."""
    interval_s = 1.0 / cam.fps_max
    if interval_s >= cam.stall_timeout_s:
        raise CaptureError(
            f"{cam.display}: a snapshot every {interval_s:g} s (fps_max {cam.fps_max:g}) is no faster than "
            f"stall_timeout_s {cam.stall_timeout_s:g}, so every frame would count as a stall: raise one of them"
        )
    uri = opening.uri if opening.uri is not None else cam.uri
    source = SnapshotSource(
        uri.removeprefix("snapshot+"), cam.display, interval_s, cam.stall_timeout_s, opening.bound, opening.stop
    )
    try:
        source.first()
    except BaseException:
        source.close()
        raise
    return source
