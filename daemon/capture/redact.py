"""Camera credentials never leave the device: the display form of a camera URI, and free text
(a GStreamer pipeline, a YAML parser's quote of a line) with every URI's user and password replaced.

Light on purpose (no OpenCV): the config loader uses it for its error messages."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# scheme://userinfo@ anywhere in a text; userinfo stops at the first '/', whitespace or '@' after it
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']*@")
# GStreamer's rtspsrc/souphttpsrc properties that carry credentials: user-id=..., user-pw=..., proxy-pw=...
_GST_CRED = re.compile(r"\b((?:user|proxy)-(?:id|pw)\s*=\s*)(\"[^\"]*\"|'[^']*'|\S+)")


def scrub(text: str) -> str:
    """`text` with the user and password of every URI in it, and GStreamer credential properties, as ***."""
    return _GST_CRED.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def redact(uri: str) -> str:
    """The URI without its user and password (camera passwords never reach logs or messages); a
    ``gst://`` pipeline or anything that is not one URI is scrubbed as text."""
    try:
        parts = urlsplit(uri)
        if parts.password is None and parts.username is None:
            return scrub(uri)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return uri.split("://", 1)[0] + "://…"
    return scrub(urlunsplit(parts._replace(netloc=f"***@{host}{port}")))
