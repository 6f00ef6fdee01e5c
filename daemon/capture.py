"""Camera threads: open a source, read frames, preprocess them into latest-frame-wins slots.

One thread per camera. Each camera owns three preallocated input rows: the one it is writing,
at most one ready for the inference thread, and at most one the inference thread is copying.
A newer frame replaces a ready one that was not taken yet (counted as a drop), so a slow
consumer never makes frames queue up. A source that fails to open or stops giving frames is
reopened with exponential backoff (full jitter, `Backoff`); no frame for ``stall_timeout_s`` counts as a stall and a
disconnect. A camera that is down never stops the others.

URIs: ``file:///path.mp4`` (``loop`` to repeat; ``realtime`` paces it at its own frame rate,
otherwise the camera waits for each frame to be taken, so no frame of the file is dropped),
``v4l2:///dev/video0``, ``rtsp://…``, ``http://…`` (MJPEG read and decoded in ``netcam``, so no
camera's open waits on another's; HLS and video files over HTTP through FFmpeg),
``csi://N`` (Jetson CSI through GStreamer ``nvarguscamerasrc``), ``gst://<pipeline ending in appsink>``,
``synthetic://?width=640&height=360&fps=15`` (a moving test pattern, no OpenCV capture).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import cv2
import numpy as np

from edged.errors import CaptureError
from edged.protocol.backoff import Backoff

from . import gst
from .config import CameraConfig
from .gst import GST_SCHEMES, use_gstreamer
from .gstpipe import csi_options, file_path, v4l2_options
from .netcam import open_http, probe_rtsp
from .preprocess import Preprocessor, Transform
from .redact import redact, scrub

logger = logging.getLogger(__name__)

NO_FRAME = None


class Source(Protocol):
    fps: float  # the source's own rate, 0 when unknown
    # set when the last frame read was scaled (in a GStreamer pipeline) from a source of this (w, h)
    scaled_from: tuple[int, int] | None

    def read(self) -> np.ndarray | None:
        """Next frame (BGR), or None at the end of a file or when the source failed."""

    def close(self) -> None: ...


class OpenCvSource:
    scaled_from: tuple[int, int] | None = None

    def __init__(self, target: str | int, api: int, params: list[int]) -> None:
        self._cap = cv2.VideoCapture(target, api, params)
        if not self._cap.isOpened():
            self._cap.release()
            raise CaptureError(f"cannot open {redact(target) if isinstance(target, str) else target!r}")
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
) -> Source:
    """Open the camera's URI; raise CaptureError with the reason when it cannot be opened. Messages
    name the camera by its display form (`cam.display`: no credentials). `spec_size`: the size a
    source of (w, h) is scaled to for the model, for the GStreamer path to scale in the pipeline."""
    shown = cam.display
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
        )
    if scheme == "file":
        return OpenCvSource(str(file_path(cam.uri)), cv2.CAP_FFMPEG, [])
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
        return OpenCvSource(o.device, cv2.CAP_V4L2, params)
    # Network sources: the server must answer here, within the open timeout, before FFmpeg's open
    # (which holds a lock every other camera's open waits on) is tried; MJPEG needs no FFmpeg at all.
    uri = _with_password(cam)
    if scheme in {"http", "https"}:
        mjpeg = open_http(uri, cam.stall_timeout_s)
        return mjpeg if mjpeg is not None else OpenCvSource(uri, cv2.CAP_FFMPEG, net)
    if scheme in {"rtsp", "rtsps"}:
        probe_rtsp(uri, cam.stall_timeout_s)
        return OpenCvSource(uri, cv2.CAP_FFMPEG, net)
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
        return OpenCvSource(pipeline, cv2.CAP_GSTREAMER, [])
    raise CaptureError(f"{shown}: unsupported scheme {scheme}://")


class Throttle:
    """What the governor asks of the cameras: a frame-rate scale, or a pause (cameras keep reading,
    so their health still shows, but offer no frames to inference)."""

    def __init__(self) -> None:
        self.fps_scale = 1.0
        self.governor_paused = False
        self.user_paused = False  # the `pause` / `resume` commands

    @property
    def paused(self) -> bool:
        return self.governor_paused or self.user_paused

    def set(self, fps_scale: float, paused: bool) -> None:
        self.fps_scale, self.governor_paused = fps_scale, paused


@dataclass
class FrameMeta:
    frame: int  # index in the file for file://, else frames read since the camera started
    captured_at: float  # wall clock, seconds since the epoch
    captured_mono: float  # time.monotonic() when the frame was read
    transform: Transform


@dataclass
class CameraStats:
    frames: int = 0  # frames preprocessed and offered to inference
    drops: int = 0  # offered frames replaced by a newer one before inference took them
    reconnects: int = 0
    stalls: int = 0
    errors: int = 0
    state: str = "starting"  # starting | up | down | ended | stopped
    last_error: str = ""
    fps_window: list[float] = field(default_factory=list)


class Camera:
    """A camera thread and its three-row latest-frame-wins slot. Slot state lives under `lock`,
    a lock shared with the inference thread, which `cond` notifies when a frame is ready."""

    def __init__(
        self,
        cfg: CameraConfig,
        pre: Preprocessor,
        cond: threading.Condition,
        stop: threading.Event,
        opener: Callable[[CameraConfig], Source] | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.pre = pre
        self.cond = cond
        self._stop = stop
        self._opener = opener or (lambda c: open_source(c, pre.inner_size, stop))
        self.throttle = throttle or Throttle()
        self.rows = [pre.new_row() for _ in range(3)]
        self._meta: list[FrameMeta | None] = [None, None, None]
        self._free = [0, 1, 2]
        self._ready: int | None = None
        self.stats = CameraStats()
        self._got_frames = False
        self._last: tuple[np.ndarray, tuple[int, int] | None] | None = None  # newest frame offered, its source size
        self._thread = threading.Thread(target=self._run, name=f"camera-{cfg.name}", daemon=True)

    # --- called by the inference thread, with `cond` held -------------------------------------
    def take_locked(self) -> tuple[int, FrameMeta] | None:
        idx = self._ready
        if idx is None:
            return None
        self._ready = None
        meta = self._meta[idx]
        if meta is None:
            raise RuntimeError("ready slot without metadata")
        return idx, meta

    def has_ready_locked(self) -> bool:
        return self._ready is not None

    def release_locked(self, idx: int) -> None:
        self._free.append(idx)
        self.cond.notify_all()

    @property
    def last_frame(self) -> np.ndarray | None:
        """The newest frame offered, for snapshots, at the source's size (a frame the pipeline scaled is
        scaled back up here, only when asked, so boxes in source pixels land on it)."""
        last = self._last
        if last is None:
            return None
        frame, src = last
        return frame if src is None else cv2.resize(frame, src, interpolation=cv2.INTER_LINEAR)

    @property
    def live(self) -> bool:
        return self.stats.state == "up"

    # --- the camera thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        # full jitter: cameras behind one switch that came back do not all reopen at the same instant
        backoff = Backoff(self.cfg.reconnect_min_s, max(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s))
        failed_before = False
        scheme = self.cfg.uri.split("://", 1)[0]
        if scheme in GST_SCHEMES:
            try:
                path = "GStreamer" if use_gstreamer(self.cfg) else "OpenCV"
            except CaptureError as exc:
                path = str(exc)
            logger.info("camera %s: capture path %s (backend %s)", self.name, path, self.cfg.backend)
        while not self._stop.is_set():
            try:
                source = self._opener(self.cfg)
            except CaptureError as exc:
                self._down(str(exc))
                failed_before = True
                if self._stop.wait(backoff.next_s()):
                    break
                continue
            if failed_before:
                self.stats.reconnects += 1
            failed_before = False
            if self.stats.state != "up":
                logger.info("camera %s: up (%s)", self.name, self.cfg.display)
            self.stats.state = "up"
            self.stats.last_error = ""
            reason = ""
            try:
                outcome, got_frames = self._stream(source)
            except CaptureError as exc:  # the source said why it failed (a bus error, the server closed)
                outcome, got_frames, reason = "failed", self._got_frames, str(exc)
            except Exception:  # a loop boundary: log once with the traceback, count, reconnect
                logger.exception("camera %s: unexpected error", self.name)
                self.stats.errors += 1
                outcome, got_frames = "failed", False
            finally:
                source.close()
            if got_frames:
                backoff.reset()
            if outcome == "looped":
                continue
            if outcome == "ended":
                self.stats.state = "ended"
                logger.info("camera %s: end of file", self.name)
                with self.cond:
                    self.cond.notify_all()
                return
            if outcome == "stopped":
                break
            self._down(reason or f"source {outcome}")
            failed_before = True
            if self._stop.wait(backoff.next_s()):
                break
        self.stats.state = "stopped"

    def _down(self, reason: str) -> None:
        # what a library put in an exception's text (a URL it was given) must not reach the log or telemetry
        reason = scrub(reason)
        if self.stats.state != "down":
            logger.warning("camera %s: down: %s; retrying with backoff", self.name, reason)
        self.stats.state = "down"
        self.stats.last_error = reason
        with self.cond:
            self.cond.notify_all()

    def _stream(self, source: Source) -> tuple[str, bool]:
        """Read until the source ends or fails. Returns (why, whether any frame came), why being
        looped | ended | stopped | stalled | failed."""
        is_file = self.cfg.uri.startswith("file://")
        native = source.fps if source.fps > 0 else self.cfg.fps_max
        paced = (is_file and self.cfg.realtime) or self.cfg.uri.startswith("synthetic://")
        pace = 1.0 / native if paced else 0.0
        # A file read as fast as inference takes it (realtime: false) is not capped: every frame counts.
        min_gap = 0.0 if is_file and not self.cfg.realtime else 1.0 / self.cfg.fps_max
        index = 0
        self._got_frames = False
        next_due = last_frame = time.monotonic()
        next_keep = 0.0
        while not self._stop.is_set():
            if pace:
                delay = next_due - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    break
                next_due = max(next_due + pace, time.monotonic() - pace)
            frame = source.read()
            now = time.monotonic()
            if frame is None:
                if is_file and index > 0:
                    return ("looped" if self.cfg.loop else "ended"), True
                if now - last_frame >= self.cfg.stall_timeout_s:
                    self.stats.stalls += 1
                    return "stalled", index > 0
                return "failed", index > 0
            last_frame = now
            self._got_frames = True
            frame_no = index
            index += 1
            if self.throttle.paused:
                continue  # paused by the governor: keep reading (health), offer nothing
            gap = min_gap / self.throttle.fps_scale if min_gap else 0.0
            if now < next_keep - 0.25 * gap:
                continue  # over the camera's (governed) fps cap; a quarter frame of jitter is tolerated
            next_keep = max(next_keep, now - 0.25 * gap) + gap
            if not self._offer(frame, frame_no, now, source.scaled_from):
                break
        return "stopped", index > 0

    def _offer(
        self, frame: np.ndarray, frame_no: int, now_mono: float, src_size: tuple[int, int] | None = None
    ) -> bool:
        wall = time.time()
        with self.cond:
            if not self.cfg.realtime and self.cfg.uri.startswith("file://"):
                # A file read faster than real time waits for its previous frame to be taken.
                while self._ready is not None and not self._stop.is_set():
                    self.cond.wait(0.1)
                if self._stop.is_set():
                    return False
            idx = self._free.pop()
        try:
            transform = self.pre.run(frame, self.rows[idx], src_size)
        except Exception:
            with self.cond:
                self._free.append(idx)
            raise
        with self.cond:
            if self._ready is not None:
                self._free.append(self._ready)
                self.stats.drops += 1
            self._meta[idx] = FrameMeta(frame_no, wall, now_mono, transform)
            self._last = (frame, src_size)
            self._ready = idx
            self.stats.frames += 1
            self.cond.notify_all()
        return True


def _scale_in_pipeline(cam: CameraConfig) -> bool:
    """As configured; by default only where the pipeline scales in hardware (nvvidconv on a Jetson):
    in software (videoscale) it measured no cheaper than cv2.resize here, scales in YUV (slightly
    different boxes) and leaves snapshots at the model's size."""
    return cam.scale_in_pipeline if cam.scale_in_pipeline is not None else gst.has_element("nvvidconv")


def join_all(cameras: list[Camera], timeout_s: float) -> list[str]:
    """Wait for every camera thread (their stop event set already) within one shared `timeout_s`: the
    threads stop in parallel, so several hung sources cost one bound, not one each. Returns the names
    of those still running."""
    deadline = time.monotonic() + timeout_s
    for c in cameras:
        c.join(max(0.0, deadline - time.monotonic()))
    return [c.name for c in cameras if c._thread.is_alive()]
