"""Why a camera source failed, in one line: GStreamer's bus errors, a TCP connection's refusal and
a camera certificate that did not verify (rtsps://), with credentials scrubbed. No GStreamer import
here: `gst` hands in what the bus and rtspsrc's accept-certificate said."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..redact import scrub

_ELEMENT_PATH = re.compile(r"/?(?:Gst\w+:[\w.-]+/?)+:\s*")


def connect_reason(uri: str, timeout_s: float) -> str | None:
    """Why a TCP connection to `uri`'s host and port fails (GStreamer only says "Failed to connect")."""
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname or "", parts.port or (322 if parts.scheme == "rtsps" else 554)
    except ValueError:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return f"connection refused: nothing listens on {host} port {port}"
    except socket.gaierror as exc:
        return f"host {host!r} not found ({exc.strerror})"
    except TimeoutError:
        return f"no answer from {host} port {port} within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot connect to {host} port {port}: {exc.strerror or exc}"


def explain(err: Any, debug: str | None) -> str:
    """A bus error as one line that says why: GStreamer's message plus the detail that names the cause
    (the RTSP status, the socket error, the caps that did not match), credentials scrubbed."""
    msg = str(err.message).rstrip(".")
    detail = " ".join((debug or "").split())
    low = (msg + " " + detail).lower()
    hint = ""
    if "401" in low or "unauthorized" in low:
        hint = "401 Unauthorized: wrong user or password"
    elif "404" in low or ("not found" in low and "rtsp" in low):
        hint = "404 Not Found: no such stream path on the server"
    elif "connection refused" in low:
        hint = "connection refused: nothing listens at that address and port"
    elif "not-negotiated" in low or "not negotiated" in low:
        hint = "caps negotiation failed: the source offers no format/size/rate the pipeline accepts"
    elif "no such file" in low or "cannot identify device" in low or "does not exist" in low:
        hint = "no such device or file"
    elif "tls" in low or "certificate" in low:
        hint = "TLS failure"
    # the debug string's last part is usually the reason (…/gstrtspsrc.c(…): …/GstRTSPSrc:src: Unauthorized (401))
    tailtxt = _ELEMENT_PATH.sub("", detail.rsplit("):", 1)[-1]).strip() if detail else ""
    text = f"{hint} ({msg}: {tailtxt})" if hint else f"{msg}: {tailtxt}" if tailtxt else msg
    return scrub(text[:400])


@dataclass(frozen=True)
class Tls:
    """rtsps:// certificate checking: against `ca_file` (else the system's CAs), or none (`verify` false)."""

    ca_file: Path | None = None
    verify: bool = True


# GTlsCertificateFlags, in words
_CERT_ERRORS = {
    1: "it is not signed by a trusted CA (unknown CA)",
    2: "it does not name the host connected to",
    4: "it is not valid yet",
    8: "it has expired",
    16: "it has been revoked",
    32: "it uses an insecure algorithm",
    64: "it is not valid",
}


def describe_certificate_errors(flags: int) -> str:
    words = [text for bit, text in _CERT_ERRORS.items() if flags & bit]
    return "; ".join(words) or f"certificate rejected (flags {flags:#x})"
