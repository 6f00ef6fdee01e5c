"""Camera threads: open a source, read frames, preprocess them into latest-frame-wins slots.

One thread per camera. Each camera owns three preallocated input rows: the one it is writing,
at most one ready for the inference thread, and at most one the inference thread is copying.
A newer frame replaces a ready one that was not taken yet (counted as a drop), so a slow
consumer never makes frames queue up. A source that fails to open or stops giving frames is
reopened with exponential backoff (full jitter, `Backoff`); no frame for ``stall_timeout_s`` counts as a stall and a
disconnect. A camera that is down never stops the others.

Every call into a source (open, read, close) is bounded by the camera's own timeouts; a thread that stays
inside one far longer (``stuck_after_s``) is wedged in a library (GStreamer, FFmpeg) and nothing in Python
can free it: ``stuck`` says so, and health (``liveness``) names the camera, logs the thread's stack, and
has systemd restart the daemon after ``inference.serving_timeout_s``.

A ``file://`` camera repeats with ``loop``; ``realtime`` paces it at its own frame rate, otherwise
the camera waits for each frame to be taken, so no frame of the file is dropped. Which URIs open as
what: ``sources``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np

from edged.errors import CaptureError
from edged.protocol.backoff import Backoff

from ..config import CameraConfig
from .encoded import EncodedRing
from .framebound import FrameBound
from .gstreamer.encode import RingFeed
from .gstreamer.pipeline import use_gstreamer
from .motion import CutDetector
from .preprocess import Preprocessor, Transform
from .redact import scrub
from .registry import GST_SCHEMES
from .sources import Source, open_source, tls_warnings

__all__ = ["Camera", "CameraStats", "FrameMeta", "Source", "Throttle", "join_all", "open_source"]

logger = logging.getLogger(__name__)


class Throttle:
    """What the governor asks of the cameras: a frame-rate scale, or a pause (cameras keep reading,
    so their health still shows, but offer no frames to inference)."""

    def __init__(self) -> None:
        self.fps_scale = 1.0
        self.governor_paused = False
        self.user_paused = False  # the `pause` / `resume` commands
        self.paused_cameras: frozenset[str] = frozenset()  # `pause {"camera": …}`: these offer nothing (replaced whole)
        self.camera_names: set[str] = set()  # every camera's (each adds its own): all paused is a pause

    @property
    def paused(self) -> bool:
        every = bool(self.camera_names) and self.camera_names <= self.paused_cameras
        return self.governor_paused or self.user_paused or every

    def set(self, fps_scale: float, paused: bool) -> None:
        self.fps_scale, self.governor_paused = fps_scale, paused


@dataclass
class FrameMeta:
    frame: int  # frames read since this open (for file://, the index in the file): 0 again at a reopen or wrap
    captured_at: float  # wall clock, seconds since the epoch
    captured_mono: float  # time.monotonic() when the frame was read
    transform: Transform
    # the camera's own clock in seconds: a file's playing time (frames read / its fps, across loops and
    # reopens), whether it is read in real time or faster; for a live source, `captured_mono`
    clock_s: float
    # frames read by this camera over its whole life, across reopens and loop wraps: never goes back
    # (`frame` does, at each reopen and wrap); tracks age by it
    seq: int = 0
    # a count of the camera's discontinuities: +1 at each reopen after frames came (a reconnect, a loop
    # wrap), a stall, or a scene cut. Frames of different segments do not follow one another: tracks end.
    segment: int = 0
    segment_reason: str = "start"  # what began this segment: one of SEGMENT_REASONS


SEGMENT_REASONS = ("start", "reconnect", "loop", "stall", "scene_cut")


# How many of the frames inference took a camera keeps, by seq, where its events carry crops (`frame_for`):
# a result is decoded after the camera has read on, and its events' crops must come from the frame its
# boxes were found in. Taken frames, not read ones: a batch or two are in flight, whatever the frame rate.
TAKEN_KEPT = 4


def stuck_after_s(stall_timeout_s: float) -> float:
    """How long one source call may take before the thread counts as stuck in it: an open waits up to two
    stall bounds (the first frame, then the probe that says why none came) and an RTSP open a third (the
    DESCRIBE probe), a read one; four and 10 s of slack for a busy machine."""
    return 4 * stall_timeout_s + 10.0


@dataclass
class CameraStats:
    frames: int = 0  # frames preprocessed and offered to inference
    drops: int = 0  # offered frames replaced by a newer one before inference took them
    reconnects: int = 0
    stalls: int = 0
    errors: int = 0
    frames_refused: int = 0  # frames over max_frame_pixels, refused before decoding (framebound)
    state: str = "starting"  # starting | up | down | ended | stopped (and `stuck`, shown: Camera.shown_state)
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
        self.bound = FrameBound(cfg.name, cfg.max_frame_pixels)  # its sources refuse (and count) larger frames
        # a folded package's letterbox copy drops a BGRx frame's fourth byte itself (a Jetson's nvvidconv tail)
        self._opener = opener or (lambda c: open_source(c, pre.inner_size, stop, self.bound, pre.pixels))
        self.throttle = throttle or Throttle()
        self.throttle.camera_names.add(cfg.name)
        self.rows = pre.own_rows(3)
        self._meta: list[FrameMeta | None] = [None, None, None]
        self._free = [0, 1, 2]
        self._ready: int | None = None
        # set when inference takes the ready frame: what a file read faster than real time waits on (`_offer`)
        self._taken_evt = threading.Event()
        self.stats = CameraStats()
        self._got_frames = False
        self._played_s = 0.0  # a file source's playing time, across loops and reopens (each frame at its open's fps)
        # FrameMeta.seq / segment / segment_reason: frames read in the camera's life, its discontinuities
        self._seq = 0
        self._segment = 0
        self._segment_reason = "start"
        self._break = ""  # why the last open ended (a SEGMENT_REASONS member): the next open's segment reason
        tracking = cfg.detection is None or cfg.detection.tracking.enabled
        self._cuts = CutDetector() if tracking else None  # scene cuts matter to tracks only
        self._last: tuple[np.ndarray, tuple[int, int] | None] | None = None  # newest frame offered, its source size
        # where events carry crops (`keep_taken`, set by the daemon): each row's frame as read, and the last
        # TAKEN_KEPT frames inference took, by seq (FrameMeta.seq), with their source sizes
        self.keep_taken = False
        self._raw: list[tuple[np.ndarray, tuple[int, int] | None] | None] = [None, None, None]
        self._taken: OrderedDict[int, tuple[np.ndarray, tuple[int, int] | None]] = OrderedDict()
        # the source call this thread is inside (open, read, close) and since when (monotonic); None between
        self._call: tuple[str, float] | None = None
        self.stuck_after_s = stuck_after_s(cfg.stall_timeout_s)
        self._next_cfg: CameraConfig | None = None  # `reconfigure`: the config the next open takes
        # `record:`: the encoded ring clips are cut from, and what fills it (gstreamer/encode.py)
        self._feed = RingFeed(cfg.record, cfg.name, _may_tap(cfg)) if cfg.record is not None else None
        self._thread = threading.Thread(target=self._run, name=f"camera-{cfg.name}", daemon=True)

    def in_call(self, now: float | None = None) -> tuple[str, float]:
        """The source call the camera's thread is inside ("open", "read", "close") and for how many seconds;
        ("", 0.0) between calls."""
        call = self._call
        if call is None:
            return "", 0.0
        return call[0], (time.monotonic() if now is None else now) - call[1]

    def stuck(self, now: float | None = None) -> str:
        """'' unless the thread has been inside one source call longer than any such call may take
        (`stuck_after_s`): then a sentence saying which call and for how long."""
        call, spent = self.in_call(now)
        if not call or spent <= self.stuck_after_s:
            return ""
        return f"stuck in its source's {call}() for {spent:.0f} s (a call bounded by {self.stuck_after_s:g} s)"

    def stack(self) -> str:
        """The camera thread's Python stack now (for the log of a stuck camera)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"

    # --- called by the inference thread, with `cond` held -------------------------------------
    def take_locked(self) -> tuple[int, FrameMeta] | None:
        idx = self._ready
        if idx is None:
            return None
        self._ready = None
        self._taken_evt.set()
        meta = self._meta[idx]
        if meta is None:
            raise RuntimeError("ready slot without metadata")
        raw, self._raw[idx] = self._raw[idx], None
        if raw is not None:  # kept until its result's events are cut (a few batches at most)
            self._taken[meta.seq] = raw
            while len(self._taken) > TAKEN_KEPT:
                self._taken.popitem(last=False)
        return idx, meta

    def has_ready_locked(self) -> bool:
        return self._ready is not None

    def release_locked(self, idx: int) -> None:
        self._free.append(idx)  # nobody waits for a row: the camera always has one free (`_offer`)

    @property
    def last_frame(self) -> np.ndarray | None:
        """The newest frame offered, for snapshots, at the source's size (a frame the pipeline scaled is
        scaled back up here, only when asked, so boxes in source pixels land on it)."""
        last = self._last
        return None if last is None else _at_source_size(*last)

    def frame_for(self, seq: int) -> np.ndarray | None:
        """The frame inference took with this seq (FrameMeta.seq), at the source's size, while it is one of
        the TAKEN_KEPT last taken (and `keep_taken` is on); else None: never another frame in its place."""
        with self.cond:
            kept = self._taken.get(seq)
        return None if kept is None else _at_source_size(*kept)

    @property
    def ring(self) -> EncodedRing | None:
        """The encoded ring (capture/encoded.py) where `record:` is on and something can fill it, else None."""
        return self._feed.ring if self._feed is not None else None

    @property
    def record_why(self) -> str:
        """Why the ring is None (no encoder) or not filling although `record:` is on; '' otherwise."""
        return self._feed.why if self._feed is not None else ""

    @property
    def record_path(self) -> str:
        """What fills the ring now: "camera's own h264" (no re-encode), an encoder's name, or ''."""
        return self._feed.path if self._feed is not None else ""

    @property
    def live(self) -> bool:
        return self.stats.state == "up" and not self.stuck()

    def shown_state(self) -> tuple[str, str]:
        """(state, reason) as telemetry, /readyz and /metrics show them: `stuck` with `stuck`'s sentence while
        the thread is stuck in a source call (its own `stats.state` is what it was when it went in)."""
        why = self.stuck()
        return ("stuck", why) if why else (self.stats.state, self.stats.last_error)

    @property
    def segment(self) -> int:
        """The segment of the latest frame offered (while the camera is down: the one it went down in)."""
        return self._segment

    @property
    def down_reason(self) -> str:
        """While the camera is down: why its picture broke (`stall` or `reconnect`, as the next frame's
        segment will say), for its tracks to end now; else ""."""
        return (self._break or "reconnect") if self.stats.state == "down" else ""

    # --- the camera thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def reconfigure(self, cfg: CameraConfig) -> None:
        """Reopen with `cfg` (a reload or a remote document changed the camera's uri, fps_max or another
        capture key): the source open now is closed after its current read, a retry back-off is cut short."""
        self._next_cfg = cfg

    def _take_cfg(self) -> bool:
        cfg, self._next_cfg = self._next_cfg, None
        if cfg is None:
            return False
        logger.info("camera %s: reopening with its new settings (%s)", self.name, cfg.display)
        self.cfg = cfg
        self.stuck_after_s = stuck_after_s(cfg.stall_timeout_s)
        return True

    def _backoff_wait(self, seconds: float) -> bool:
        """Wait out a retry's back-off, cut short by `reconfigure`; True when the camera is to stop."""
        deadline = time.monotonic() + seconds
        while self._next_cfg is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._stop.wait(min(left, 0.2)):
                return True
        return self._stop.is_set()

    def _run(self) -> None:
        # full jitter: cameras behind one switch that came back do not all reopen at the same instant
        backoff = Backoff(self.cfg.reconnect_min_s, max(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s))
        failed_before = traced = False
        scheme = self.cfg.uri.split("://", 1)[0]
        if scheme in GST_SCHEMES:
            try:
                path = "GStreamer" if use_gstreamer(self.cfg) else "OpenCV"
            except CaptureError as exc:
                path = str(exc)
            logger.info("camera %s: capture path %s (backend %s)", self.name, path, self.cfg.backend)
        for warning in tls_warnings(self.cfg):
            logger.warning("camera %s: %s", self.name, warning)
        while not self._stop.is_set():
            if self._take_cfg():
                backoff = Backoff(self.cfg.reconnect_min_s, max(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s))
            self._call = ("open", time.monotonic())
            try:
                source = self._opener(self.cfg)
            except Exception as exc:  # a loop boundary: a camera thread never dies, it retries with backoff
                reason = str(exc)
                if not isinstance(exc, CaptureError):  # a bug (ours or a library's), not the camera's doing
                    self.stats.errors += 1
                    reason = f"unexpected {type(exc).__name__} opening it: {exc} (a bug; the log has the traceback)"
                    if not traced:  # the traceback once until the camera is up again, not at every retry
                        trace = scrub("".join(traceback.format_exception(exc)))  # a URL's password stays out
                        logger.error("camera %s: %s\n%s", self.name, scrub(reason), trace)
                        traced = True
                self._call = None
                self._down(reason)
                failed_before = True
                if self._backoff_wait(backoff.next_s()):
                    break
                continue
            self._call = None
            if self._feed is not None:  # the ring's new segment: the source's own packets, or an encoder
                self._feed.opened(source, min(source.fps or self.cfg.fps_max, self.cfg.fps_max))
            if failed_before:
                self.stats.reconnects += 1
            failed_before = traced = False
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
                self._call = ("close", time.monotonic())
                try:
                    source.close()
                finally:
                    self._call = None
                    if self._feed is not None:
                        self._feed.closed()
            if got_frames:
                backoff.reset()
            self._break = {"looped": "loop", "stalled": "stall"}.get(outcome, self._break or "reconnect")
            if outcome in ("looped", "reconfigured"):
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
            if self._backoff_wait(backoff.next_s()):
                break
        self.stats.state = "stopped"

    def _down(self, reason: str) -> None:
        # what a library put in an exception's text (a URL it was given) must not reach the log or telemetry
        reason = scrub(reason)
        self.stats.frames_refused = self.bound.refused  # an open refused for its frame size counts too
        if self.stats.state != "down":
            logger.warning("camera %s: down: %s; retrying with backoff", self.name, reason)
        self.stats.state = "down"
        self.stats.last_error = reason
        with self.cond:
            self.cond.notify_all()

    def _new_segment(self, reason: str) -> None:
        self._segment += 1
        self._segment_reason = reason

    def _stream(self, source: Source) -> tuple[str, bool]:
        """Read until the source ends or fails. Returns (why, whether any frame came), why being
        looped | ended | stopped | stalled | failed | reconfigured."""
        is_file = self.cfg.uri.startswith("file://")
        native = source.fps if source.fps > 0 else self.cfg.fps_max
        paced = (is_file and self.cfg.realtime) or self.cfg.uri.startswith("synthetic://")
        pace = 1.0 / native if paced else 0.0
        # A file read as fast as inference takes it (realtime: false) is not capped: every frame counts.
        min_gap = 0.0 if is_file and not self.cfg.realtime else 1.0 / self.cfg.fps_max
        index = 0
        self._got_frames = False
        if self._seq > 0:  # a reopen after frames came: what follows does not continue what came before
            self._new_segment(self._break or "reconnect")
        self._break = ""
        if self._cuts is not None:
            self._cuts.reset()
        next_due = last_frame = time.monotonic()
        next_keep = 0.0
        while not self._stop.is_set():
            if self._next_cfg is not None:
                return "reconfigured", index > 0
            if pace:
                delay = next_due - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    break
                next_due = max(next_due + pace, time.monotonic() - pace)
            asked = time.monotonic()
            self._call = ("read", asked)
            frame = source.read()
            self._call = None
            now = time.monotonic()
            self.stats.frames_refused = self.bound.refused  # what that read refused before decoding
            if frame is None:
                if is_file and index > 0:
                    return ("looped" if self.cfg.loop else "ended"), True
                if now - last_frame >= self.cfg.stall_timeout_s:
                    self.stats.stalls += 1
                    return "stalled", index > 0
                return "failed", index > 0
            if index > 0 and now - asked >= self.cfg.stall_timeout_s:
                self.stats.stalls += 1  # the frame came, but after a stall: what it shows does not continue
                self._new_segment("stall")
                if self._cuts is not None:
                    self._cuts.reset()
            last_frame = now
            self._got_frames = True
            frame_no = index
            index += 1
            self._seq += 1
            clock = now
            if is_file:  # a file's seconds are its own, however fast it is read
                clock = self._played_s
                self._played_s += 1.0 / native  # a reopen at another fps moves only what comes after
            if self.throttle.paused or self.cfg.name in self.throttle.paused_cameras:
                continue  # paused by the governor or the pause command: keep reading (health), offer nothing
            gap = min_gap / self.throttle.fps_scale if min_gap else 0.0
            if now < next_keep - 0.25 * gap:
                continue  # over the camera's (governed) fps cap; a quarter frame of jitter is tolerated
            next_keep = max(next_keep, now - 0.25 * gap) + gap
            wall = None
            if self._feed is not None:  # an encoder's frames are the ones offered (at most fps_max), same wall
                wall = time.time()
                self._feed.frame(_bgr(frame), wall)
            if not self._offer(frame, frame_no, now, source.scaled_from, clock, wall):
                break
        return "stopped", index > 0

    def _wait_taken(self) -> bool:
        """A file read faster than real time waits for its previous frame to be taken; False when stopped first.
        It waits on its own event (`take_locked` sets it), not the shared condition: that one is notified at
        every frame offered and every batch gathered, and would wake each such camera for nothing."""
        while not self._stop.is_set():
            with self.cond:
                if self._ready is None:
                    return True
                self._taken_evt.clear()  # under the lock: a take after this sets it again, none is missed
            self._taken_evt.wait(0.1)
        return False

    def _offer(
        self,
        frame: np.ndarray,
        frame_no: int,
        now_mono: float,
        src_size: tuple[int, int] | None = None,
        clock_s: float | None = None,
        wall: float | None = None,
    ) -> bool:
        wall = time.time() if wall is None else wall
        if not self.cfg.realtime and self.cfg.uri.startswith("file://") and not self._wait_taken():
            return False  # stopped
        with self.cond:
            # three rows: at most one ready and one being copied, so one is free (the camera holds none now)
            idx = self._free.pop()
        try:
            transform = self.pre.run(frame, self.rows[idx], src_size)
            if self._cuts is not None and self._cuts.cut(frame):
                self._new_segment("scene_cut")
        except Exception:
            with self.cond:
                self._free.append(idx)
            raise
        with self.cond:
            if self._ready is not None:
                self._free.append(self._ready)
                self.stats.drops += 1
            self._meta[idx] = FrameMeta(
                frame_no,
                wall,
                now_mono,
                transform,
                now_mono if clock_s is None else clock_s,
                self._seq,
                self._segment,
                self._segment_reason,
            )
            self._last = (frame, src_size)
            self._raw[idx] = (_owned(frame), src_size) if self.keep_taken else None
            self._ready = idx
            self.stats.frames += 1
            self.cond.notify_all()
        return True


def _may_tap(cfg: CameraConfig) -> bool:
    """Whether the camera's stream may reach its ring as it is (H.264/H.265 through decodebin's parser)."""
    if cfg.uri.split("://", 1)[0] not in ("file", "rtsp", "rtsps", "v4l2"):
        return False
    try:
        return use_gstreamer(cfg)
    except CaptureError:  # backend: gstreamer where it does not load: the camera itself says so when it opens
        return False


def _owned(frame: np.ndarray) -> np.ndarray:
    """A frame kept for crops (up to 3 + TAKEN_KEPT per camera): a view of a GStreamer buffer is copied, so
    a pipeline whose pool is small never waits on buffers held here (the newest frame stays a view); a frame
    that owns its memory (OpenCV's, a decoded JPEG's: a new array per read) is kept as it is."""
    return frame if frame.flags.owndata else frame.copy()


def _bgr(frame: np.ndarray) -> np.ndarray:
    """A frame as its readers outside preprocessing take it: BGR (a BGRx frame's fourth byte dropped, in a copy)."""
    return np.ascontiguousarray(frame[:, :, :3]) if frame.ndim == 3 and frame.shape[2] == 4 else frame


def _at_source_size(frame: np.ndarray, src: tuple[int, int] | None) -> np.ndarray:
    frame = _bgr(frame)
    return frame if src is None else cv2.resize(frame, src, interpolation=cv2.INTER_LINEAR)


def join_all(cameras: list[Camera], timeout_s: float) -> list[str]:
    """Wait for every camera thread (their stop event set already) within one shared `timeout_s`: the
    threads stop in parallel, so several hung sources cost one bound, not one each. Returns the names
    of those still running."""
    deadline = time.monotonic() + timeout_s
    for c in cameras:
        c.join(max(0.0, deadline - time.monotonic()))
    return [c.name for c in cameras if c._thread.is_alive()]
