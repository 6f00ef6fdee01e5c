"""Camera source types: one row per URI scheme family, and everything else reads the table.

A row says how a camera of its schemes is checked at config load (a network source needs a host and
may take ``password_file``), how it opens off GStreamer (``open``: OpenCV or edged's own reader),
which GStreamer pipeline it becomes (``plan``; None: the GStreamer path does not open it), and what
``edged doctor`` and ``check-config --probe-cameras`` say about it. The scheme sets the rest of the
daemon asks about (``SCHEMES``, ``GST_SCHEMES``, ``NETWORK_SCHEMES``) are derived from the rows.

| type      | schemes                          | off GStreamer                         | GStreamer |
|-----------|----------------------------------|---------------------------------------|-----------|
| file      | file                             | OpenCV/FFmpeg                         | filesrc   |
| v4l2      | v4l2                             | OpenCV (V4L2)                         | v4l2src   |
| rtsp      | rtsp, rtsps                      | OpenCV/FFmpeg after edged's DESCRIBE  | rtspsrc   |
| http      | http, https                      | edged's MJPEG reader, else FFmpeg     | --        |
| csi       | csi                              | OpenCV's GStreamer                    | nvargus   |
| gst       | gst                              | OpenCV's GStreamer                    | your own  |
| synthetic | synthetic                        | a test pattern                        | --        |
| snapshot  | snapshot+http, snapshot+https    | edged polls a JPEG (``snapshot``)| --        |

This module is light (no OpenCV, no GStreamer): the config loader imports it. A new type is one module,
light at import the same way (OpenCV imported inside its functions), and one row here naming its
opener. The first types open through ``sources``, which imports OpenCV at its top: their rows name their
openers there (``"open_file"``), and ``sources.open_source`` resolves the name; nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from edged.errors import CaptureError

from . import uri as gstpipe
from .redact import redact, scrub
from .snapshot import open_snapshot
from .source import Opening, Source
from .uri import Plan

if TYPE_CHECKING:
    from ..config.cameras import CameraConfig


Opener = Callable[["CameraConfig", Opening], Source]
# an opener, or the name of one in ``sources`` (the first types: OpenCV is imported there, not at config load)
OpenerRef = Opener | str
Planner = Callable[[str, set[str], int, str, float], Plan]
Check = Callable[["CameraConfig"], None]


@dataclass(frozen=True)
class SourceType:
    name: str
    schemes: tuple[str, ...]
    form: str  # how `cameras[].uri`'s description (and so the config reference) spells it
    open: OpenerRef  # off GStreamer: OpenCV or edged's own reader; raises CaptureError with the reason
    plan: Planner | None = None  # the GStreamer pipeline; None: never on the GStreamer path
    network: bool = False  # a host is required (checked at load); password_file may give the password
    local: Check | None = None  # what check-config can check without opening (the file, the device)
    before_open: Check | None = None  # checked before either path opens it (CaptureError)
    needs_gst: bool = False  # only GStreamer opens it (PyGObject's, or OpenCV's when built with it)
    gst_elements: tuple[str, ...] = ()  # GStreamer elements it cannot do without (doctor says which is missing)
    own_pipeline: bool = False  # the URI is the pipeline (gst://): parsed by check-config
    path: str = "OpenCV/FFmpeg (software decode)"  # what doctor says of its capture path off GStreamer


def _file_there(cam: CameraConfig) -> None:
    path = gstpipe.file_path(cam.uri)
    if not path.is_file():
        raise CaptureError(f"{cam.display}: no such file {path}")


def _file_at_open(cam: CameraConfig) -> None:
    if not gstpipe.file_path(cam.uri).is_file():
        raise CaptureError(f"{cam.display}: no such file")


def _device_there(cam: CameraConfig) -> None:
    dev = gstpipe.v4l2_options(cam.uri).device
    if not Path(dev).exists():
        raise CaptureError(f"{cam.display}: no such device {dev}")


SOURCE_TYPES: tuple[SourceType, ...] = (
    SourceType(
        "file",
        ("file",),
        "file:///path (or file://localhost/path, percent-encoded)",
        "open_file",
        gstpipe.plan_file,
        local=_file_there,
        before_open=_file_at_open,
    ),
    SourceType(
        "v4l2",
        ("v4l2",),
        "v4l2:///dev/videoN or v4l2://N (?width=&height=&fps=&format=MJPG|YUYV|NV12|UYVY)",
        "open_v4l2",
        gstpipe.plan_v4l2,
        local=_device_there,
    ),
    SourceType("rtsp", ("rtsp", "rtsps"), "rtsp(s)://", "open_rtsp", gstpipe.plan_rtsp, network=True),
    SourceType(
        "http",
        ("http", "https"),
        "http(s)://",
        "open_http",
        network=True,
        path="edged's MJPEG reader, else OpenCV/FFmpeg",
    ),
    SourceType(
        "csi",
        ("csi",),
        "csi://N (?width=&height=&fps=&sensor_mode=)",
        "open_csi",
        gstpipe.plan_csi,
        needs_gst=True,
        gst_elements=("nvarguscamerasrc",),
    ),
    SourceType(
        "gst",
        ("gst",),
        "gst://<pipeline ending in appsink>",
        "open_gst_pipeline",
        gstpipe.plan_gst,
        needs_gst=True,
        own_pipeline=True,
    ),
    SourceType("synthetic", ("synthetic",), "synthetic://", "open_synthetic", path="synthetic frames"),
    SourceType(
        "snapshot",
        ("snapshot+http", "snapshot+https"),
        "snapshot+http(s):// (a JPEG polled at fps_max)",
        open_snapshot,
        network=True,
        path="edged polls snapshots",
    ),
)

BY_SCHEME: dict[str, SourceType] = {s: t for t in SOURCE_TYPES for s in t.schemes}
SCHEMES = frozenset(BY_SCHEME)
GST_SCHEMES = frozenset(s for t in SOURCE_TYPES if t.plan is not None for s in t.schemes)  # the GStreamer path's
NETWORK_SCHEMES = frozenset(s for t in SOURCE_TYPES if t.network for s in t.schemes)
URI_FORMS = ", ".join(t.form for t in SOURCE_TYPES)


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""


def source_type(uri: str) -> SourceType:
    """The row for `uri`'s scheme; CaptureError for one no row has (the config refuses those at load)."""
    found = BY_SCHEME.get(scheme_of(uri))
    if found is None:
        raise CaptureError(f"{redact(uri)}: unsupported scheme {scheme_of(uri)}://")
    return found


def plan(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    """The GStreamer pipeline for `uri`, by its source type's row. `have`: which of the optional elements
    (nvvidconv, nvarguscamerasrc) this machine has. `uri` may carry a password: it only goes into `props`."""
    scheme = scheme_of(uri)
    row = BY_SCHEME.get(scheme)
    if row is None or row.plan is None:
        raise CaptureError(f"{redact(uri)}: no GStreamer pipeline for {scheme}://")
    return row.plan(uri, have, latency_ms, transport, timeout_s)


def check_uri(uri: str) -> None:
    """The config's check of `cameras[].uri` (ValueError, no credentials in it): a known scheme, and a
    host for a network source."""
    scheme = scheme_of(uri)
    if scheme not in BY_SCHEME:
        known = ", ".join(f"{s}://" for t in SOURCE_TYPES for s in t.schemes)
        raise ValueError(f"scheme must be one of {known}, not {redact(uri)}")
    if scheme in NETWORK_SCHEMES:
        try:
            host = urlsplit(uri).hostname
        except ValueError as exc:  # a bad port or bracket: said without the URI's credentials
            raise ValueError(f"{redact(uri)}: not a URI with a host: {scrub(str(exc))}") from exc
        if not host:
            raise ValueError(f"{redact(uri)}: no host ({scheme}://[USER@]HOST[:PORT]/PATH)")
