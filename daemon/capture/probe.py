"""``edged check-config --probe-cameras``: open each camera once, read a few frames, say what it is.

Resolution, frame rate (the source's own where it says, else measured over the frames read), codec,
and the path chosen: GStreamer with the decoder ``decodebin`` picked (``nv*``: hardware, else
software) and the scaler, or OpenCV/FFmpeg (software), or edged's own MJPEG reader.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edged.errors import CaptureError

from ..config import CameraConfig
from .gstreamer import pipeline as gst
from .registry import plan, source_type
from .sources import NO_GST, _has_gstreamer, open_source

PROBE_FRAMES = 10
PROBE_S = 2.0


@dataclass
class Probe:
    width: int
    height: int
    fps: float
    codec: str
    path: str

    def line(self) -> str:
        fps = f"{self.fps:.1f} fps" if self.fps else "fps unknown"
        return f"{self.width}x{self.height}, {fps}, {self.codec or 'codec unknown'}; {self.path}"


def check_camera(cam: CameraConfig) -> str:
    """What `check-config` can tell without opening the camera: the path it would take; raises
    CaptureError for a file or device that does not exist, csi:// without nvarguscamerasrc, a
    gst:// pipeline that does not parse."""
    row = source_type(cam.uri)
    if row.local is not None:
        row.local(cam)
    if row.plan is None or not gst.use_gstreamer(cam):
        if row.needs_gst and not _has_gstreamer():
            raise CaptureError(f"{cam.display}: {NO_GST.format(scheme=cam.uri.split('://', 1)[0])}")
        return "opencv" if row.plan is not None else "edged"
    p = plan(cam.uri, gst.have(), cam.rtsp_latency_ms, cam.rtsp_transport, cam.stall_timeout_s)
    if row.own_pipeline:
        gst.parse_check(p.description, cam.display)
    return "gstreamer" + (" (nvvidconv)" if p.nvmm else "")


def probe_camera(cam: CameraConfig) -> Probe:
    """Open `cam` once (no scaling: the source's own size) and read up to PROBE_FRAMES frames within
    PROBE_S seconds; raise CaptureError with the reason when it does not open or gives nothing."""
    chosen = check_camera(cam)
    source = open_source(cam)
    try:
        t0 = time.monotonic()
        frame = first = source.read()
        n = 1 if first is not None else 0
        while n < PROBE_FRAMES and time.monotonic() - t0 < PROBE_S:
            f = source.read()
            if f is None:
                break
            frame, n = f, n + 1
        elapsed = time.monotonic() - t0
        if frame is None:
            raise CaptureError(f"{cam.display}: opened, but no frame within {cam.stall_timeout_s:g} s")
        fps = source.fps or ((n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0)
        h, w = frame.shape[:2]
        if isinstance(source, gst.GstSource):
            dec = source.decoder
            where = "hardware" if dec.startswith("nv") else "software"
            scaler = "nvvidconv (hardware)" if "nvvidconv" in chosen else "videoscale (software)"
            if source_type(cam.uri).own_pipeline:
                path = f"{gst.version()}: your pipeline"
            elif dec:
                path = f"{gst.version()}: decoder {dec} ({where}), scaler {scaler}"
            else:
                path = f"{gst.version()}: raw video, no decoder, scaler {scaler}"
            return Probe(w, h, fps, source.codec, path)
        opencv = source_type(cam.uri).plan is not None  # off GStreamer, a type GStreamer opens goes to OpenCV
        path = "OpenCV/FFmpeg (software decode and scale)" if opencv else "edged (software)"
        if opencv and cam.backend == "auto":
            path += f"; GStreamer not used: {gst.why_unavailable()}"
        return Probe(w, h, fps, "", path)
    finally:
        source.close()
