"""Camera URIs read once for both capture paths, and the GStreamer pipeline each one becomes.

No GStreamer import here: the URI rules (``file://localhost/…``, percent-encoding, ``v4l2://0``) hold
for the OpenCV path too, and the config checks use them without a pipeline.

Every pipeline ends the same way: ``<decoder> ! <scaler name=scaler> ! capsfilter name=size ! …BGR !
appsink name=sink``. The source element is named ``src``; its location (which may carry a camera's
password) is set as a property after parsing, never written into the pipeline text that GStreamer's
debug log and error messages quote. ``gst://`` is the user's own pipeline, which must end in an appsink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from edged.errors import CaptureError

from .redact import redact

V4L2_FORMATS = {
    "MJPG": "image/jpeg",
    "JPEG": "image/jpeg",
    "YUYV": "YUY2",
    "YUY2": "YUY2",
    "NV12": "NV12",
    "UYVY": "UYVY",
}
TO_BGR = "videoconvert ! video/x-raw,format=BGR ! appsink name=sink"


def _query(uri: str, allowed: set[str]) -> dict[str, str]:
    q = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query).items()}
    unknown = set(q) - allowed
    if unknown:
        raise CaptureError(
            f"{redact(uri)}: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(allowed))}"
        )
    return q


def _int(uri: str, q: dict[str, str], key: str, lo: int, hi: int) -> int | None:
    if key not in q:
        return None
    try:
        v = int(q[key])
    except ValueError:
        v = lo - 1
    if not lo <= v <= hi:
        raise CaptureError(f"{redact(uri)}: {key}={q[key]!r}: want a whole number from {lo} to {hi}")
    return v


def file_path(uri: str) -> Path:
    """``file:///a%20b.mp4`` and ``file://localhost/…`` -> the local path; another host is refused."""
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise CaptureError(f"{redact(uri)}: file:// names host {parts.netloc!r}; only local files (file:///path)")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise CaptureError(f"{redact(uri)}: file:// needs an absolute path (file:///path/to/video.mp4)")
    return Path(path)


@dataclass(frozen=True)
class V4l2:
    device: str
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    format: str | None = None


def v4l2_options(uri: str) -> V4l2:
    """``v4l2:///dev/video0``, ``v4l2://0`` (= /dev/video0), with ``?width=&height=&fps=&format=``."""
    parts = urlsplit(uri)
    q = _query(uri, {"width", "height", "fps", "format"})
    name = unquote(parts.netloc + parts.path)
    if name.isdigit():
        device = f"/dev/video{name}"
    elif name.startswith("/"):
        device = name
    elif name:
        device = f"/dev/{name}"
    else:
        raise CaptureError(f"{redact(uri)}: no device; v4l2:///dev/video0 or v4l2://0")
    fmt = q.get("format", "").upper() or None
    if fmt is not None and fmt not in V4L2_FORMATS:
        raise CaptureError(f"{redact(uri)}: format={fmt}: one of {', '.join(V4L2_FORMATS)}")
    return V4l2(
        device, _int(uri, q, "width", 16, 7680), _int(uri, q, "height", 16, 4320), _int(uri, q, "fps", 1, 240), fmt
    )


@dataclass(frozen=True)
class Csi:
    sensor_id: int
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    sensor_mode: int | None = None


def csi_options(uri: str) -> Csi:
    parts = urlsplit(uri)
    if not parts.netloc.isdigit():
        raise CaptureError(f"{redact(uri)}: csi:// takes a sensor id, e.g. csi://0?width=1920&height=1080&fps=30")
    q = _query(uri, {"width", "height", "fps", "sensor_mode"})
    return Csi(
        int(parts.netloc),
        _int(uri, q, "width", 16, 7680),
        _int(uri, q, "height", 16, 4320),
        _int(uri, q, "fps", 1, 240),
        _int(uri, q, "sensor_mode", 0, 64),
    )


@dataclass
class Plan:
    """A pipeline to build: its text, what is set on the element named ``src``, and how it ends."""

    description: str
    props: dict[str, object] = field(default_factory=dict)
    live: bool = True  # a live source drops old frames; a file's frames are all kept (back-pressure)
    scalable: bool = True  # has the scaler/size pair (not a gst:// pipeline)
    nvmm: bool = False  # the scaler is nvvidconv (Jetson)


def _caps(media: str, w: int | None, h: int | None, fps: int | None, fmt: str | None = None) -> str:
    caps = media + (f",format={fmt}" if fmt else "")
    caps += f",width={w}" if w else ""
    caps += f",height={h}" if h else ""
    caps += f",framerate={fps}/1" if fps else ""
    return caps


def tail(nvmm: bool) -> str:
    """Scale (to the size set on ``size`` once the source's caps are known), convert to BGR, hand over."""
    if nvmm:  # Jetson's VIC: scale and convert out of NVMM memory in hardware; videoconvert drops the x
        return f"nvvidconv name=scaler ! capsfilter name=size caps=video/x-raw,format=BGRx ! {TO_BGR}"
    return f"videoscale name=scaler ! capsfilter name=size caps=video/x-raw ! {TO_BGR}"


def plan_file(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    nvmm = "nvvidconv" in have
    src = {"location": str(file_path(uri))}
    return Plan(f"filesrc name=src ! decodebin name=dec ! {tail(nvmm)}", dict(src), False, True, nvmm)


def plan_rtsp(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    nvmm = "nvvidconv" in have
    props: dict[str, object] = {
        "location": uri,
        "latency": latency_ms,
        "tcp-timeout": int(timeout_s * 1e6),
        "timeout": int(timeout_s * 1e6),
    }
    if transport != "auto":
        props["protocols"] = transport
    return Plan(f"rtspsrc name=src ! decodebin name=dec ! {tail(nvmm)}", props, True, True, nvmm)


def plan_v4l2(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    nvmm = "nvvidconv" in have
    o = v4l2_options(uri)
    media = V4L2_FORMATS.get(o.format or "", "video/x-raw")
    fmt = None if media == "image/jpeg" or o.format is None else media
    caps = _caps("video/x-raw" if fmt else media, o.width, o.height, o.fps, fmt)
    mid = f" ! {caps}" if caps not in ("video/x-raw",) else ""
    return Plan(f"v4l2src name=src{mid} ! decodebin name=dec ! {tail(nvmm)}", {"device": o.device}, True, True, nvmm)


def plan_csi(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    c = csi_options(uri)
    if "nvarguscamerasrc" not in have:
        raise CaptureError(
            f"{uri}: csi:// needs GStreamer's nvarguscamerasrc (JetPack's nvidia-l4t-gstreamer), "
            "which this machine does not have"
        )
    props: dict[str, object] = {"sensor-id": c.sensor_id}
    if c.sensor_mode is not None:
        props["sensor-mode"] = c.sensor_mode
    caps = _caps("video/x-raw(memory:NVMM)", c.width, c.height, c.fps)
    return Plan(f"nvarguscamerasrc name=src ! {caps} ! {tail(True)}", props, True, True, True)


def plan_gst(uri: str, have: set[str], latency_ms: int, transport: str, timeout_s: float) -> Plan:
    text = uri.split("://", 1)[1]
    if "appsink" not in text:
        raise CaptureError(f"{redact(uri)}: a gst:// pipeline must end in an appsink")
    return Plan(text, {}, True, False, False)
