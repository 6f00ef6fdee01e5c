"""Frames encoded once for a camera's ring (capture/encoded.py), where the source is not H.264/H.265 already.

For files of other codecs, v4l2, MJPEG and synthetic sources, frames are encoded by the best encoder present
(``ENCODERS``, in order: the Jetson's hardware encoder, x264, OpenH264) in a pipeline of their own
(``appsrc → encoder → h264parse → appsink``): where the camera's GStreamer pipeline has a decoder, its decoded
frames (``RawTap``: full size, every frame, by reference; on a Jetson in NVMM memory, straight into
nvv4l2h264enc); otherwise the BGR frames the camera thread offers to inference. Nothing waits on the encoder:
its appsrc is leaky (one that falls behind loses the oldest queued frame). Sources that are H.264/H.265
already give the ring their own packets instead (``tap.py``). Each (re)start of the encoder starts a new
segment of the ring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from edged.errors import CaptureError

from ..encoded import EncodedRing, Packet, ring_for
from .pipeline import available, has_element, modules, why_unavailable
from .tap import ParsedTap, RawTap

if TYPE_CHECKING:
    from ...config.cameras import RecordConfig

logger = logging.getLogger(__name__)

KEY_INTERVAL_S = 1.0  # the encoders' keyframe interval: a clip starts at most this long before its pre-roll
QUEUED_FRAMES = 4  # frames the encoder's appsrc queues before it drops the oldest
WALLS_KEPT = 64


@dataclass(frozen=True)
class EncoderRow:
    """An H.264 encoder: the element, what goes before it (by the memory its input is in: ``nvmm`` or system
    memory, any raw format), its settings from (kbit/s, keyframe interval in frames), and where to get it."""

    name: str
    before: Callable[[bool], str]
    settings: Callable[[int, int], str]
    install: str


def _to_nvmm(nvmm: bool) -> str:  # nvvidconv takes BGRx, not BGR, from system memory
    to_bgrx = "" if nvmm else "videoconvert ! video/x-raw,format=BGRx ! "
    return to_bgrx + "nvvidconv ! video/x-raw(memory:NVMM),format=NV12"


def _to_i420(nvmm: bool) -> str:
    return ("nvvidconv ! video/x-raw ! " if nvmm else "") + "videoconvert ! video/x-raw,format=I420"


ENCODERS = (
    EncoderRow(
        "nvv4l2h264enc",
        _to_nvmm,
        lambda kbps, gop: f"bitrate={kbps * 1000} iframeinterval={gop} idrinterval={gop} insert-sps-pps=true",
        "JetPack's nvidia-l4t-gstreamer (Jetson only)",
    ),
    EncoderRow(
        "x264enc",
        _to_i420,
        lambda kbps, gop: f"tune=zerolatency speed-preset=ultrafast bitrate={kbps} key-int-max={gop}",
        "apt install gstreamer1.0-plugins-ugly",
    ),
    EncoderRow(
        "openh264enc",
        _to_i420,
        lambda kbps, gop: f"bitrate={kbps * 1000} gop-size={gop} complexity=low rate-control=bitrate",
        "apt install gstreamer1.0-plugins-bad",
    ),
)
_ROWS = {r.name: r for r in ENCODERS}


def pick_encoder(choice: str = "auto") -> tuple[EncoderRow | None, str]:
    """(the encoder `choice` names, or auto's best present; '') or (None, why none, with the fix)."""
    if not available():
        return None, f"no encoder: {why_unavailable()}"
    rows = ENCODERS if choice == "auto" else (_ROWS[choice],)
    for row in rows:
        if has_element(row.name):
            return row, ""
    if choice != "auto":
        return None, f"encoder {choice} is not installed ({_ROWS[choice].install})"
    return None, "no H.264 encoder is installed (x264enc: apt install gstreamer1.0-plugins-ugly)"


def encoder_check(encoding_cameras: int) -> tuple[Literal["ok", "warn", "n/a"], str, str]:
    """edged doctor's line as (status, detail, fix): the encoder the clips of sources that are not H.264/H.265
    already get, or how to get one. `encoding_cameras`: configured cameras with `record:` that may need one
    (not RTSP): with none, a missing encoder is only "n/a"."""
    row, why = pick_encoder()
    if row is not None:
        return "ok", f"clip encoder: {row.name} (recording cameras that do not send H.264/H.265)", ""
    fix = "apt-get install gstreamer1.0-plugins-ugly (x264enc); on a Jetson: nvidia-l4t-gstreamer (nvv4l2h264enc)"
    detail = f"clip encoder: none ({why}); RTSP H.264/H.265 cameras record their own packets without one"
    return ("warn" if encoding_cameras else "n/a"), detail, fix


# --- frames encoded once ----------------------------------------------------------------------------------


class FrameEncoder:
    """Raw frames encoded to H.264 into `ring`, in a pipeline of their own, restarted (a new segment of the ring)
    when their caps change. Two ways in, neither of which waits: ``push`` (a BGR frame the camera thread read)
    and ``push_buffer`` (a decoded frame from a RawTap, on GStreamer's thread, by reference). The appsrc is
    leaky; the encoded packets come back on the encoder's thread (``new-sample``) with their frame's wall time."""

    def __init__(self, row: EncoderRow, ring: EncodedRing, bitrate_kbps: int, fps: float, shown: str) -> None:
        self.row, self.ring, self._shown = row, ring, shown
        self._kbps = bitrate_kbps
        self._fps = max(1.0, min(fps, 60.0))
        self._gst, self._glib = modules()
        self._run = threading.RLock()  # the pipeline: started, pushed to, closed (camera or streaming thread)
        self._pipeline: Any = None
        self._src: Any = None
        self._hook: tuple[Any, int] | None = None
        self._caps: str | None = None
        self._t0 = time.monotonic()
        self._walls: OrderedDict[int, float] = OrderedDict()  # pts -> the wall time of its frame
        self._lock = threading.Lock()
        self._caps_known = False
        self.frames = 0  # frames pushed
        self.packets = 0  # packets out of the encoder
        self.failed = ""  # why the encoder stopped (an error on its bus); pushes then do nothing

    def push(self, frame: np.ndarray, wall: float) -> None:
        h, w = frame.shape[:2]
        caps = f"video/x-raw,format=BGR,width={w},height={h},framerate={round(self._fps * 1000)}/1000"
        buf = self._gst.Buffer.new_wrapped(np.ascontiguousarray(frame).tobytes())
        buf.pts = int((time.monotonic() - self._t0) * 1e9)
        buf.duration = int(1e9 / self._fps)
        self._push(buf, caps, wall)

    def push_buffer(self, buf: Any, caps: str) -> None:
        """A decoded frame (its own timestamps kept) from a RawTap; errors are kept in `failed`, never raised
        on GStreamer's thread."""
        try:
            self._push(buf, caps, time.time())
        except CaptureError as exc:
            self.failed = str(exc)

    def _push(self, buf: Any, caps: str, wall: float) -> None:
        with self._run:
            if self.failed:
                return
            if caps != self._caps:
                self.close()
                self._start(caps)
            self._check_bus()
            if self.failed:
                return
            with self._lock:
                self._walls[int(buf.pts)] = wall
                while len(self._walls) > WALLS_KEPT:
                    self._walls.popitem(last=False)
            self.frames += 1
            self._src.emit("push-buffer", buf)

    def _start(self, caps: str) -> None:
        gst, row = self._gst, self.row
        parsed = gst.Caps.from_string(caps)
        if parsed is None or not parsed.get_size():
            raise CaptureError(f"{self._shown}: encoder {row.name}: unreadable caps {caps}")
        ok, num, den = parsed.get_structure(0).get_fraction("framerate")
        fps = num / den if ok and num and den else self._fps
        gop = max(1, round(min(max(fps, 1.0), 60.0) * KEY_INTERVAL_S))
        nvmm = "memory:NVMM" in caps
        # a decoder's NVMM buffers come from a small fixed pool: holding several here could starve it
        queued = 1 if nvmm else QUEUED_FRAMES
        text = (
            f"appsrc name=src format=time is-live=true do-timestamp=false block=false leaky-type=downstream "
            f"max-buffers={queued} ! {row.before(nvmm)} ! {row.name} "
            f"{row.settings(self._kbps, gop)} ! h264parse ! video/x-h264,stream-format=avc,alignment=au ! "
            "appsink name=sink emit-signals=true sync=false"
        )
        try:
            pipeline = gst.parse_launch(text)
        except self._glib.Error as exc:
            raise CaptureError(f"{self._shown}: encoder {row.name}: bad pipeline: {exc.message}") from exc
        src = pipeline.get_by_name("src")
        src.set_property("caps", parsed)
        sink = pipeline.get_by_name("sink")
        self._hook = (sink, sink.connect("new-sample", self._on_sample))
        self._caps_known = False
        if pipeline.set_state(gst.State.PLAYING) == gst.StateChangeReturn.FAILURE:
            pipeline.set_state(gst.State.NULL)
            sink.disconnect(self._hook[1])
            self._hook = None
            raise CaptureError(f"{self._shown}: encoder {row.name} would not start for {caps.split(',')[0]}")
        self._pipeline, self._src, self._caps = pipeline, src, caps
        s = parsed.get_structure(0)
        size = f"{s.get_value('width')}x{s.get_value('height')}"
        logger.info("camera %s: recording through %s at %s, %d kbit/s", self._shown, row.name, size, self._kbps)

    def _on_sample(self, sink: Any) -> Any:
        sample = sink.emit("pull-sample")
        if sample is None:
            return self._gst.FlowReturn.OK
        buf = sample.get_buffer()
        if not self._caps_known:
            self.ring.new_segment(sample.get_caps().to_string())
            self._caps_known = True
        # the running time is the pts the frame was pushed with: x264enc moves its output's timestamps and
        # segment 1000 hours on (room for B-frames' decoding times), which the running time takes back off
        pts = int(sample.get_segment().to_running_time(self._gst.Format.TIME, buf.pts))
        with self._lock:
            wall = self._walls.get(pts)
            if wall is None:  # an encoder that changed the timestamp: the newest frame's time, close enough
                wall = next(reversed(self._walls.values()), time.time())
        duration = int(buf.duration) if buf.duration != self._gst.CLOCK_TIME_NONE else 0
        key = not buf.has_flags(self._gst.BufferFlags.DELTA_UNIT)
        self.ring.add(Packet(wall, pts, duration, key, buf.extract_dup(0, buf.get_size())))
        self.packets += 1
        return self._gst.FlowReturn.OK

    def _check_bus(self) -> None:
        if self._pipeline is None:
            return
        msg = self._pipeline.get_bus().pop_filtered(self._gst.MessageType.ERROR)
        if msg is not None:
            err, _ = msg.parse_error()
            self.failed = f"encoder {self.row.name} failed: {err.message}"
            logger.warning("camera %s: %s; recording stops until the camera reopens", self._shown, self.failed)
            self.close()

    def close(self) -> None:
        with self._run:
            pipeline, self._pipeline = self._pipeline, None
            if pipeline is None:
                return
            self._src.emit("end-of-stream")
            pipeline.set_state(self._gst.State.NULL)
            if self._hook is not None:
                sink, handler = self._hook
                sink.disconnect(handler)
                self._hook = None
            self._src = None
            self._caps = None
            with self._lock:
                self._walls.clear()


class RingFeed:
    """What fills a recording camera's ring across its opens: the source's own packets where its pipeline has
    a tap (``tap.py``), else its frames through an encoder. The camera thread calls ``opened`` after each
    open, ``frame`` for each frame it offers and ``closed`` at each close; none of them raises: recording
    that fails says why (``why``) and leaves the camera running."""

    def __init__(self, rec: RecordConfig, shown: str, may_tap: bool) -> None:
        """`may_tap`: the camera opens through decodebin (GStreamer file, RTSP, v4l2), so its stream may turn
        out H.264/H.265 and need no encoder; otherwise a missing encoder is known now: no ring at all."""
        self.rec, self._shown = rec, shown
        self.ring: EncodedRing | None = ring_for(rec)
        self.why = ""
        self.path = ""  # camera | <encoder name>: where the ring's packets come from now
        self._encoder: FrameEncoder | None = None
        self._from_camera = True  # the encoder takes the camera thread's frames (else a RawTap's)
        if not may_tap and (why := pick_encoder(rec.encoder)[1]):
            self.ring, self.why = None, why
            logger.warning("camera %s: record: %s", shown, why)

    def opened(self, source: object, fps: float) -> None:
        if self.ring is None:
            return
        tap = getattr(source, "tap", None)
        if isinstance(tap, ParsedTap):
            if tap.attach(self.ring):
                self.path, self.why = f"camera's own {tap.codec}", ""
                return
            self.why = "the stream's packets passed before the ring was attached; recording waits for a reopen"
            logger.warning("camera %s: %s", self._shown, self.why)
            return
        row, why = pick_encoder(self.rec.encoder)
        if row is None:
            self.ring, self.why = None, why
            logger.warning("camera %s: record: %s", self._shown, why)
            return
        try:
            encoder = FrameEncoder(row, self.ring, self.rec.bitrate_kbps, fps, self._shown)
        except CaptureError as exc:
            self.why = str(exc)
            logger.warning("camera %s: record: %s", self._shown, exc)
            return
        raw = getattr(source, "raw_tap", None)
        if isinstance(raw, RawTap) and raw.attach(encoder.push_buffer):
            # the decoder's frames, full size and every one, straight into the encoder (no Python copy)
            self._encoder, self._from_camera = encoder, False
            self.path, self.why = f"{row.name} (decoded frames)", ""
            return
        self._encoder, self._from_camera = encoder, True  # the frames the camera thread offers
        self.path, self.why = row.name, ""

    def frame(self, frame: np.ndarray, wall: float) -> None:
        encoder = self._encoder
        if encoder is None:
            return
        if not self._from_camera:  # fed by the pipeline's RawTap; only its failure is looked at here
            if encoder.failed:
                self.why = encoder.failed
            return
        try:
            encoder.push(frame, wall)
        except CaptureError as exc:  # the encoder's pipeline would not build or start: recording stops here
            self.why = str(exc)
            logger.warning("camera %s: record: %s", self._shown, exc)
            encoder.close()
            self._encoder = None
            return
        if encoder.failed:
            self.why = encoder.failed

    def closed(self) -> None:
        encoder, self._encoder = self._encoder, None
        if encoder is not None:
            encoder.close()
