"""Camera sources: a camera's URI opened as something that gives frames (`Source`).

URIs: ``file:///path.mp4``, ``v4l2:///dev/video0``, ``rtsp(s)://…``, ``http(s)://…`` (MJPEG read and
decoded in ``netcam``, so no camera's open waits on another's; HLS and video files over HTTP through
FFmpeg), ``csi://N`` (Jetson CSI through GStreamer ``nvarguscamerasrc``), ``gst://<pipeline ending in
appsink>``, ``synthetic://?width=640&height=360&fps=15`` (a moving test pattern, no OpenCV capture).
File, RTSP, v4l2, CSI and gst:// sources go through GStreamer (``gst``) where it loads and the camera's
``backend`` allows, else through OpenCV. The camera thread that reads them is ``capture``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import cv2
import numpy as np

from edged.errors import CaptureError

from . import gst
from .config import CameraConfig
from .framebound import FrameBound
from .gst import use_gstreamer
from .gstpipe import csi_options, file_path, v4l2_options
from .gstwhy import Tls
from .netcam import open_http, probe_rtsp
from .redact import redact

NO_FRAME = None


class Source(Protocol):
    fps: float  # the source's own rate, 0 when unknown
    # set when the last frame read was scaled (in a GStreamer pipeline) from a source of this (w, h)
    scaled_from: tuple[int, int] | None

    def read(self) -> np.ndarray | None:
        """Next frame (BGR), or None at the end of a file or when the source failed."""

    def close(self) -> None: ...


class OpenCvSource:
    """A cv2.VideoCapture. FFmpeg decodes inside the open, so `bound` is checked on the size the open reports:
    a source over it is refused (CaptureError); FFmpeg's backend scales every later frame to that size."""

    scaled_from: tuple[int, int] | None = None

    def __init__(self, target: str | int, api: int, params: list[int], bound: FrameBound | None = None) -> None:
        shown = redact(target) if isinstance(target, str) else repr(target)
        self._cap = cv2.VideoCapture(target, api, params)
        if not self._cap.isOpened():
            self._cap.release()
            raise CaptureError(f"cannot open {shown}")
        w, h = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if bound is not None and not bound.allows(w, h):
            self._cap.release()
            raise CaptureError(f"{shown}: frames of {w}x{h} are over max_frame_pixels {bound.max_pixels}")
        fps = float(self._cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.fps = fps if 0 < fps < 1000 else 0.0

    def read(self) -> np.ndarray | None:
        ok, frame = self._cap.read()
        if not ok or frame is None:
            return NO_FRAME
        out: np.ndarray = frame
        return out

    def close(self) -> None:
        self._cap.release()


class SyntheticSource:
    """A moving test pattern: gradient, a bouncing disc and the frame number. No faces."""

    scaled_from: tuple[int, int] | None = None

    def __init__(self, width: int, height: int, fps: float) -> None:
        if not (16 <= width <= 7680 and 16 <= height <= 4320 and 0 < fps <= 240):
            raise CaptureError(f"synthetic source: bad size {width}x{height} or fps {fps}")
        self.fps = fps
        self._n = 0
        x = np.linspace(0, 255, width, dtype=np.float32)
        y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
        self._base = np.dstack(
            [
                np.broadcast_to(x, (height, width)),
                np.broadcast_to(y, (height, width)),
                np.full((height, width), 96, np.float32),
            ]
        ).astype(np.uint8)

    def read(self) -> np.ndarray | None:
        frame: np.ndarray = self._base.copy()
        h, w = frame.shape[:2]
        t = self._n / max(self.fps, 1.0)
        cx = int((0.5 + 0.4 * np.sin(t * 1.3)) * w)
        cy = int((0.5 + 0.4 * np.cos(t * 0.9)) * h)
        cv2.circle(frame, (cx, cy), max(4, min(w, h) // 10), (30, 220, 240), -1)
        cv2.putText(frame, f"edged {self._n}", (8, h - 10), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 1)
        self._n += 1
        return frame

    def close(self) -> None:
        pass


def _has_gstreamer() -> bool:
    for line in cv2.getBuildInformation().splitlines():
        if line.strip().startswith("GStreamer:"):
            return "YES" in line
    return False


def _with_password(cam: CameraConfig) -> str:
    """The URI to open: with `password_file`, the file's first line goes in as the password, here and
    only here (so the YAML holds no secret, and a rotated credential is read at the next reopen)."""
    if cam.password_file is None:
        return cam.uri
    try:
        lines = cam.password_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CaptureError(f"{cam.display}: password_file: cannot read {cam.password_file}: {exc.strerror}") from exc
    if not lines or not lines[0]:
        raise CaptureError(f"{cam.display}: password_file {cam.password_file} is empty")
    parts = urlsplit(cam.uri)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}:{quote(lines[0], safe='')}@{hostport}"))


NO_GST = (
    "this OpenCV was built without GStreamer and PyGObject's GStreamer is not importable, which {scheme}:// "
    "needs; install python3-gi and gir1.2-gstreamer-1.0 (on a Jetson: a venv made with --system-site-packages)"
)


def open_source(
    cam: CameraConfig,
    spec_size: Callable[[int, int], tuple[int, int]] | None = None,
    stop: threading.Event | None = None,
    bound: FrameBound | None = None,
) -> Source:
    """Open the camera's URI; raise CaptureError with the reason when it cannot be opened. Messages
    name the camera by its display form (`cam.display`: no credentials). `spec_size`: the size a
    source of (w, h) is scaled to for the model, for the GStreamer path to scale in the pipeline.
    `bound`: the camera's max_frame_pixels, which counts what it refuses (by default, one of its own)."""
    shown = cam.display
    bound = bound if bound is not None else FrameBound(cam.name, cam.max_frame_pixels)
    scheme, rest = cam.uri.split("://", 1)
    timeout_ms = int(cam.stall_timeout_s * 1000)
    net = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms]
    if scheme == "synthetic":
        q = parse_qs(urlsplit(cam.uri).query)
        try:
            return SyntheticSource(
                int(q.get("width", ["640"])[0]),
                int(q.get("height", ["360"])[0]),
                float(q.get("fps", [str(cam.fps_max)])[0]),
            )
        except ValueError as exc:
            raise CaptureError(f"{shown}: bad synthetic parameters: {exc}") from exc
    if scheme == "file":
        path = file_path(cam.uri)
        if not path.is_file():
            raise CaptureError(f"{shown}: no such file")
    if use_gstreamer(cam):
        uri = _with_password(cam) if scheme in {"rtsp", "rtsps"} else cam.uri
        return gst.open_gst(
            uri,
            shown,
            cam.rtsp_latency_ms,
            cam.rtsp_transport,
            cam.stall_timeout_s,
            spec_size if _scale_in_pipeline(cam) else None,
            stop,
            Tls(cam.tls_ca_file, cam.tls_verify),
            bound,
        )
    if scheme == "file":
        return OpenCvSource(str(file_path(cam.uri)), cv2.CAP_FFMPEG, [], bound)
    if scheme == "v4l2":
        o = v4l2_options(cam.uri)
        params: list[int] = []
        if o.format:
            params += [cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*o.format.replace("YUY2", "YUYV"))]
        for prop, value in ((cv2.CAP_PROP_FRAME_WIDTH, o.width), (cv2.CAP_PROP_FRAME_HEIGHT, o.height)):
            if value:
                params += [prop, value]
        if o.fps:
            params += [cv2.CAP_PROP_FPS, o.fps]
        return OpenCvSource(o.device, cv2.CAP_V4L2, params, bound)
    # Network sources: the server must answer here, within the open timeout, before FFmpeg's open
    # (which holds a lock every other camera's open waits on) is tried; MJPEG needs no FFmpeg at all.
    uri = _with_password(cam)
    if scheme in {"http", "https"}:
        mjpeg = open_http(uri, cam.stall_timeout_s, bound)
        return mjpeg if mjpeg is not None else OpenCvSource(uri, cv2.CAP_FFMPEG, net, bound)
    if scheme in {"rtsp", "rtsps"}:
        probe_rtsp(uri, cam.stall_timeout_s, cam.tls_ca_file, cam.tls_verify)
        return OpenCvSource(uri, cv2.CAP_FFMPEG, net, bound)
    if scheme in {"csi", "gst"}:
        if not _has_gstreamer():
            raise CaptureError(f"{shown}: {NO_GST.format(scheme=scheme)}")
        if scheme == "csi":
            c = csi_options(cam.uri)
            caps = "video/x-raw(memory:NVMM)" + (f",width={c.width},height={c.height}" if c.width and c.height else "")
            pipeline = (
                f"nvarguscamerasrc sensor-id={c.sensor_id} ! {caps},framerate={c.fps or round(cam.fps_max)}/1 ! "
                "nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! "
                "appsink drop=true max-buffers=1 sync=false"
            )
        else:
            pipeline = rest
        return OpenCvSource(pipeline, cv2.CAP_GSTREAMER, [], bound)
    raise CaptureError(f"{shown}: unsupported scheme {scheme}://")


def tls_warnings(cam: CameraConfig) -> list[str]:
    """What an rtsps:// camera's TLS settings leave unprotected: said at every start and by check-config."""
    if not cam.uri.startswith("rtsps://"):
        return []
    if not cam.tls_verify:
        return [
            "tls_verify is false: the camera's certificate is not checked, so anyone who can intercept the "
            "connection can pose as the camera (pin its certificate with tls_ca_file instead)"
        ]
    try:
        gstreamer = use_gstreamer(cam)
    except CaptureError:
        gstreamer = False
    if gstreamer:
        return []
    return [
        "on the OpenCV/FFmpeg path the certificate is checked on edged's own probe connection only; FFmpeg's "
        "RTSP connection is not verified (FFmpeg passes no TLS options to it): use the GStreamer path"
    ]


def _scale_in_pipeline(cam: CameraConfig) -> bool:
    """As configured; by default only where the pipeline scales in hardware (nvvidconv on a Jetson):
    in software (videoscale) it measured no cheaper than cv2.resize here, scales in YUV (slightly
    different boxes) and leaves snapshots at the model's size."""
    return cam.scale_in_pipeline if cam.scale_in_pipeline is not None else gst.has_element("nvvidconv")
