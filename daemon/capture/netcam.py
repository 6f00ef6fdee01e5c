"""Network cameras that cannot hold each other up.

OpenCV's FFmpeg backend opens every capture of the process under one mutex (``CvCapture_FFMPEG::open``
holds it across ``avformat_open_input`` and ``avformat_find_stream_info``), so a camera whose server
accepts the connection and never answers held every other camera's open -- ``file://`` ones too --
for its whole open timeout, and again at every retry. Measured here (OpenCV 4.14): a file's open took
4.5 s behind a hung ``http://`` open with a 5 s timeout; reads are not serialised, only opens.

So:

- MJPEG over HTTP (``multipart/x-mixed-replace``, what most IP cameras serve) is read here: one HTTP
  request on a socket with timeouts, each part's JPEG decoded by ``cv2.imdecode`` at its own size.
  No FFmpeg, no shared lock, and a camera that changes resolution mid-stream gives frames of the new
  size (FFmpeg's backend rescales every frame to the first one's size, so sizes and boxes were wrong).
  A part is decoded only when its JPEG frame header says a size within the camera's ``max_frame_pixels``
  (``framebound``): a 16,000 x 16,000 JPEG of a few MB is refused, counted, without being decoded.
- Any other network source (``rtsp://``; HLS or a video file over ``http://``) still goes through
  FFmpeg, but only after the server has answered here, within the open timeout: an RTSP ``DESCRIBE``,
  or the HTTP response itself. A server that accepts and never answers is caught without taking
  OpenCV's lock, and so is one that answers ``OPTIONS`` and never ``DESCRIBE``. One that describes its
  stream and then hangs inside FFmpeg's own open (at ``SETUP``/``PLAY``, or sends no media) still holds
  that lock for up to the open timeout.
"""

from __future__ import annotations

import base64
import http.client
import re
import socket
import ssl
import time
from email.message import Message
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import cv2
import numpy as np

from edged.errors import CaptureError

from .framebound import FrameBound, jpeg_size
from .redact import redact

__all__ = ["MjpegSource", "open_http", "probe_rtsp", "redact"]

MAX_PART_BYTES = 32 << 20  # a multipart part larger than this is not a camera's JPEG
MAX_HEADER_BYTES = 16 << 10
_HEADERS_END = re.compile(rb"\r?\n\r?\n")


def _address(uri: str, default_port: int) -> tuple[str, int]:
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise CaptureError(f"{redact(uri)}: bad address: {exc}") from exc
    if not host:
        raise CaptureError(f"{redact(uri)}: no host")
    return host, port or default_port


def _no_answer(uri: str, what: str, timeout_s: float, exc: BaseException) -> CaptureError:
    if isinstance(exc, TimeoutError):
        return CaptureError(f"{redact(uri)}: no answer to {what} within {timeout_s:g} s")
    return CaptureError(f"{redact(uri)}: {what}: {exc}")


class MjpegSource:
    """MJPEG over HTTP, parsed and decoded here. A read gives None after `timeout_s` without a frame."""

    fps = 0.0  # MJPEG carries no rate
    scaled_from: tuple[int, int] | None = None  # frames come at their own size

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        boundary: bytes,
        timeout_s: float,
        bound: FrameBound,
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._timeout_s = timeout_s
        self._delim = b"--" + boundary
        self._buf = bytearray()
        self.bound = bound  # frames over its pixels are refused (counted there) before decoding
        self.bad_parts = 0  # parts that were not a decodable JPEG (skipped)

    def read(self) -> np.ndarray | None:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:  # parts that are no image for this long: as good as a stall
            try:
                data = self._next_part(deadline)
            except (OSError, http.client.HTTPException, ValueError):  # timed out, reset, or malformed
                return None
            if data is None:
                return None
            size = jpeg_size(data)
            if size is None:  # no JPEG frame header: not decoded (cv2 would decode a PNG of any size)
                self.bad_parts += 1
                continue
            if not self.bound.allows(*size):
                continue  # counted and logged there; the next part may be a camera's usual frame
            frame = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            if frame is not None:
                out: np.ndarray = frame
                return out
            self.bad_parts += 1  # a torn part: the next one may be fine
        return None

    def close(self) -> None:
        self._resp.close()
        self._conn.close()

    def _fill(self, deadline: float) -> bool:
        """More bytes; TimeoutError once `deadline` passes, so a server that streams bytes that never make
        a part (no delimiter, endless headers) is a stall like one that sends nothing."""
        if time.monotonic() > deadline:
            raise TimeoutError("no complete part in time")
        chunk = self._resp.read1(1 << 16)
        self._buf += chunk
        return bool(chunk)

    def _next_part(self, deadline: float) -> bytes | None:
        """The body of the next part, or None at the end of the stream."""
        while (i := self._buf.find(self._delim)) < 0:
            del self._buf[: max(0, len(self._buf) - len(self._delim))]  # keep what may start a delimiter
            if not self._fill(deadline):
                return None
        del self._buf[: i + len(self._delim)]
        while (m := _HEADERS_END.search(self._buf)) is None:
            if len(self._buf) > MAX_HEADER_BYTES:
                raise ValueError("part headers too long")
            if not self._fill(deadline):
                return None
        length = None
        for line in bytes(self._buf[: m.start()]).decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        del self._buf[: m.end()]
        if length is not None:
            if not 0 < length <= MAX_PART_BYTES:
                raise ValueError(f"part of {length} bytes")
            while len(self._buf) < length:
                if not self._fill(deadline):
                    return None
            data = bytes(self._buf[:length])
            del self._buf[:length]
            return data
        while (k := self._buf.find(self._delim)) < 0:  # no length given: the part ends at the next delimiter
            if len(self._buf) > MAX_PART_BYTES:
                raise ValueError("part without an end")
            if not self._fill(deadline):
                return None
        data = bytes(self._buf[:k]).rstrip(b"\r\n")
        del self._buf[:k]
        return data


def open_http(uri: str, timeout_s: float, bound: FrameBound | None = None) -> MjpegSource | None:
    """Ask an http(s):// camera for its stream, every step bounded by `timeout_s`. An MJPEG stream is
    returned ready to read, refusing frames over `bound` (by default, `framebound.MAX_FRAME_PIXELS`); None
    means the server answered with something else (HLS, a video file, a Digest challenge) for FFmpeg to
    open. Raises CaptureError when it does not answer or refuses."""
    host, port = _address(uri, 443 if uri.startswith("https") else 80)
    parts = urlsplit(uri)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=timeout_s)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"User-Agent": "edged", "Accept": "multipart/x-mixed-replace, */*"}
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    deadline = time.monotonic() + timeout_s
    try:
        conn.request("GET", target, headers=headers)
        if conn.sock is not None:  # connect and send took part of the bound; the answer gets the rest
            conn.sock.settimeout(max(0.05, deadline - time.monotonic()))
        resp = conn.getresponse()
    except ssl.SSLCertVerificationError:
        conn.close()
        return None  # a camera's self-signed certificate: FFmpeg opens it as before (it does not verify)
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise _no_answer(uri, "an HTTP request", timeout_s, exc) from exc
    ctype = resp.getheader("Content-Type") or ""
    if resp.status == 401 and "digest" in (resp.getheader("WWW-Authenticate") or "").lower():
        conn.close()
        return None  # FFmpeg speaks Digest
    if resp.status != 200:
        conn.close()
        raise CaptureError(f"{redact(uri)}: HTTP {resp.status} {resp.reason}")
    if not ctype.lower().startswith("multipart/"):
        conn.close()
        return None
    msg = Message()
    msg["Content-Type"] = ctype
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        conn.close()
        raise CaptureError(f"{redact(uri)}: {ctype!r} without a boundary")
    if conn.sock is not None:
        conn.sock.settimeout(timeout_s)  # from here, a read that waits this long is a stall
    # Some cameras write the boundary parameter with the leading "--" of the delimiter in it.
    bound = bound if bound is not None else FrameBound(redact(uri))
    return MjpegSource(conn, resp, boundary.removeprefix("--").encode("latin-1"), timeout_s, bound)


def probe_rtsp(uri: str, timeout_s: float, ca_file: Path | None = None, verify: bool = True) -> None:
    """Raise CaptureError unless the RTSP server answers a DESCRIBE within `timeout_s`. DESCRIBE, not
    just OPTIONS: a camera whose RTSP front end still answers OPTIONS (FFmpeg's first request) but
    whose stream is wedged may never answer DESCRIBE, and FFmpeg would wait for that holding its lock.
    No credentials are sent (a 401 is an answer too), so none go out in the clear to a server that
    would have asked for Digest.

    rtsps://: the server's certificate is verified here against `ca_file` (else the system's CAs) and
    the host, unless `verify` is false. That is as far as the OpenCV path goes: FFmpeg's RTSP client
    opens its own TLS connection with no options (libavformat/rtsp.c passes none to its tls:// layer,
    whose certificate check is off by default), so that second connection is not verified."""
    tls = uri.startswith("rtsps")
    host, port = _address(uri, 322 if tls else 554)
    parts = urlsplit(uri)
    bare = urlunsplit(parts._replace(netloc=f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
    request = f"DESCRIBE {bare} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\nUser-Agent: edged\r\n\r\n"
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            sock: socket.socket = raw
            if tls:
                sock = _tls_wrap(raw, host, uri, ca_file, verify)
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.sendall(request.encode())
            answer = sock.recv(64)
    except ssl.SSLCertVerificationError as exc:
        raise CaptureError(f"{redact(uri)}: {tls_refusal(exc.verify_message or str(exc), ca_file)}") from exc
    except OSError as exc:
        raise _no_answer(uri, "RTSP DESCRIBE", timeout_s, exc) from exc
    if not answer.startswith(b"RTSP/"):
        raise CaptureError(f"{redact(uri)}: not an RTSP server (it answered {answer[:16]!r})")


def _tls_wrap(raw: socket.socket, host: str, uri: str, ca_file: Path | None, verify: bool) -> ssl.SSLSocket:
    if not verify:  # tls_verify: false (warned at start): carries no credentials, proves the server is alive
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx.wrap_socket(raw, server_hostname=host)
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise CaptureError(f"{redact(uri)}: tls_ca_file {ca_file}: not a readable PEM certificate: {exc}") from exc
    return ctx.wrap_socket(raw, server_hostname=host)


def tls_refusal(why: str, ca_file: Path | None) -> str:
    """The sentence for a camera certificate that did not verify, with the fix."""
    against = f"tls_ca_file {ca_file}" if ca_file is not None else "the system's CAs (no tls_ca_file)"
    return (
        f"TLS: the camera's certificate does not verify against {against}: {why}; give the camera's CA (or its "
        "self-signed certificate) as tls_ca_file"
    )
