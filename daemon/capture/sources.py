"""Camera sources: a camera's URI opened as something that gives frames (`Source`).

Which URI is which type is the registry's (``registry``: one row per scheme family); here are the
openers of the first types and ``open_source``, which picks the path: GStreamer (``gst``) for a type with a
pipeline where it loads and the camera's ``backend`` allows, else the row's opener. ``file:///path.mp4``,
``v4l2:///dev/video0``, ``rtsp(s)://…`` through OpenCV/FFmpeg off GStreamer; ``http(s)://…`` (MJPEG read
and decoded in ``netcam``, so no camera's open waits on another's; HLS and video files over HTTP through
FFmpeg); ``csi://N`` (Jetson CSI through ``nvarguscamerasrc``) and ``gst://<pipeline ending in appsink>``
through OpenCV's GStreamer off PyGObject's; ``synthetic://?width=640&height=360&fps=15`` (a moving test
pattern, no OpenCV capture). The camera thread that reads them is ``capture``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import cv2
import numpy as np

from edged.errors import CaptureError

from ..config import CameraConfig
from .framebound import FrameBound
from .gstreamer import pipeline as gst
from .gstreamer.pipeline import use_gstreamer
from .gstreamer.why import Tls
from .netcam import open_http as open_mjpeg
from .netcam import probe_rtsp
from .redact import redact
from .registry import source_type
from .source import Opening, Source, with_password
from .uri import csi_options, file_path, v4l2_options

__all__ = ["NO_GST", "OpenCvSource", "Source", "SyntheticSource", "open_source", "tls_warnings"]

NO_FRAME = None


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


NO_GST = (
    "this OpenCV was built without GStreamer and PyGObject's GStreamer is not importable, which {scheme}:// "
    "needs; install python3-gi and gir1.2-gstreamer-1.0 (on a Jetson: a venv made with --system-site-packages)"
)


def open_source(
    cam: CameraConfig,
    spec_size: Callable[[int, int], tuple[int, int]] | None = None,
    stop: threading.Event | None = None,
    bound: FrameBound | None = None,
    bgrx: bool = False,
) -> Source:
    """Open the camera's URI by its source type's row (``registry``): the GStreamer path where the row
    has a pipeline and ``gst.use_gstreamer`` says so, else the row's opener. Raises CaptureError with the
    reason when it cannot be opened; messages name the camera by its display form (`cam.display`: no
    credentials). `spec_size`: the size a source of (w, h) is scaled to for the model, for the GStreamer
    path to scale in the pipeline. `bound`: the camera's max_frame_pixels, which counts what it refuses (by
    default, one of its own). `bgrx`: the reader takes 4-byte BGRx frames, so a Jetson pipeline may end at
    nvvidconv's BGRx (a folded package's camera: ``Preprocessor.pixels``)."""
    row = source_type(cam.uri)
    bound = bound if bound is not None else FrameBound(cam.name, cam.max_frame_pixels)
    if row.before_open is not None:  # said the same whichever path opens it (a missing file)
        row.before_open(cam)
    if row.plan is not None and use_gstreamer(cam):
        uri = with_password(cam) if row.network else cam.uri
        return gst.open_gst(
            uri,
            cam.display,
            cam.rtsp_latency_ms,
            cam.rtsp_transport,
            cam.stall_timeout_s,
            spec_size if _scale_in_pipeline(cam) else None,
            stop,
            Tls(cam.tls_ca_file, cam.tls_verify),
            bound,
            bgrx,
        )
    # network sources get the URI with password_file's password, read here at each open
    opener = row.open if callable(row.open) else globals()[row.open]  # the first types' openers are here
    return opener(cam, Opening(bound, stop, spec_size, with_password(cam) if row.network else None))


# --- the openers of the first source types (the registry's rows name them) --------------------------------


def _net_params(cam: CameraConfig) -> list[int]:
    timeout_ms = int(cam.stall_timeout_s * 1000)
    return [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms]


def open_file(cam: CameraConfig, opening: Opening) -> Source:
    return OpenCvSource(str(file_path(cam.uri)), cv2.CAP_FFMPEG, [], opening.bound)


def open_v4l2(cam: CameraConfig, opening: Opening) -> Source:
    o = v4l2_options(cam.uri)
    params: list[int] = []
    if o.format:
        params += [cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*o.format.replace("YUY2", "YUYV"))]
    for prop, value in ((cv2.CAP_PROP_FRAME_WIDTH, o.width), (cv2.CAP_PROP_FRAME_HEIGHT, o.height)):
        if value:
            params += [prop, value]
    if o.fps:
        params += [cv2.CAP_PROP_FPS, o.fps]
    return OpenCvSource(o.device, cv2.CAP_V4L2, params, opening.bound)


# Network sources: the server must answer here, within the open timeout, before FFmpeg's open (which holds
# a lock every other camera's open waits on) is tried; MJPEG needs no FFmpeg at all.
def open_http(cam: CameraConfig, opening: Opening) -> Source:
    uri = opening.uri or cam.uri
    mjpeg = open_mjpeg(uri, cam.stall_timeout_s, opening.bound)
    return mjpeg if mjpeg is not None else OpenCvSource(uri, cv2.CAP_FFMPEG, _net_params(cam), opening.bound)


def open_rtsp(cam: CameraConfig, opening: Opening) -> Source:
    uri = opening.uri or cam.uri
    probe_rtsp(uri, cam.stall_timeout_s, cam.tls_ca_file, cam.tls_verify)
    return OpenCvSource(uri, cv2.CAP_FFMPEG, _net_params(cam), opening.bound)


def _need_opencv_gstreamer(cam: CameraConfig) -> None:
    if not _has_gstreamer():
        raise CaptureError(f"{cam.display}: {NO_GST.format(scheme=cam.uri.split('://', 1)[0])}")


def open_csi(cam: CameraConfig, opening: Opening) -> Source:
    _need_opencv_gstreamer(cam)
    c = csi_options(cam.uri)
    caps = "video/x-raw(memory:NVMM)" + (f",width={c.width},height={c.height}" if c.width and c.height else "")
    pipeline = (
        f"nvarguscamerasrc sensor-id={c.sensor_id} ! {caps},framerate={c.fps or round(cam.fps_max)}/1 ! "
        "nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! "
        "appsink drop=true max-buffers=1 sync=false"
    )
    return OpenCvSource(pipeline, cv2.CAP_GSTREAMER, [], opening.bound)


def open_gst_pipeline(cam: CameraConfig, opening: Opening) -> Source:
    _need_opencv_gstreamer(cam)
    return OpenCvSource(cam.uri.split("://", 1)[1], cv2.CAP_GSTREAMER, [], opening.bound)


def open_synthetic(cam: CameraConfig, opening: Opening) -> Source:
    q = parse_qs(urlsplit(cam.uri).query)
    try:
        return SyntheticSource(
            int(q.get("width", ["640"])[0]),
            int(q.get("height", ["360"])[0]),
            float(q.get("fps", [str(cam.fps_max)])[0]),
        )
    except ValueError as exc:
        raise CaptureError(f"{cam.display}: bad synthetic parameters: {exc}") from exc


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
    """As configured; by default only where the pipeline scales in hardware (nvvidconv on a Jetson). In
    software (videoscale, before videoconvert) it costs less CPU in all (videoconvert then converts the small
    frame: bench/pipeline_copies.py), but it scales in YUV (slightly different pixels, so boxes, than
    cv2.resize's) and leaves snapshots at the model's size: a choice the camera's config makes."""
    return cam.scale_in_pipeline if cam.scale_in_pipeline is not None else gst.has_element("nvvidconv")
