"""Packets of a camera's encoded ring (capture/encoded.py) into one MP4 file, without re-encoding.

``appsrc → h264parse | h265parse → mp4mux → filesink``, run to its end on the caller's thread (the clip
planner's, never the decode thread). The clip starts on a keyframe and its timestamps start at 0. The file is
written as ``<path>.part``, fsynced, renamed to ``<path>``, and the directory fsynced: a power cut or a SIGKILL
leaves either no file or a whole one (a ``.part`` is the store's to remove).

No ``faststart``: mp4mux would write the media twice (a temporary file, then the final one), doubling the
bytes a clip costs the flash; players fetch the index at the end with an HTTP range request.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.errors import CaptureError, RecordError

from ..capture.encoded import Packet
from ..capture.gstreamer.pipeline import modules

PARSERS = {"video/x-h264": ("h264parse", "h264"), "video/x-h265": ("h265parse", "h265")}
EOS_BASE_S = 20.0  # how long muxing may take at most: this, plus a second per 50 MB of packets


@dataclass(frozen=True)
class MuxedClip:
    path: Path
    bytes: int
    sha256: str
    start_wall: float  # the wall time of the clip's first frame (its keyframe)
    duration_s: float
    codec: str  # h264 | h265


def write_mp4(caps: str, packets: Sequence[Packet], path: Path) -> MuxedClip:
    """packets -> an MP4 at `path`, written as path + '.part', fsynced, renamed, directory fsynced; raises
    RecordError naming the cause (no packets, no keyframe first, caps of another codec, the muxer's error, the
    disk). The packets are one segment of a ring, in decode order, the first a keyframe."""
    if not packets:
        raise RecordError(f"{path.name}: no packets to write")
    if not packets[0].key:
        raise RecordError(f"{path.name}: a clip must start on a keyframe")
    media = caps.split(",", 1)[0].strip()
    if media not in PARSERS:
        raise RecordError(f"{path.name}: caps {media or '(none)'}: only H.264 and H.265 are written to MP4")
    parser, codec = PARSERS[media]
    try:
        gst, glib = modules()
    except CaptureError as exc:
        raise RecordError(f"{path.name}: GStreamer is not available: {exc}") from exc
    part = path.with_name(path.name + ".part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.unlink(missing_ok=True)
    except OSError as exc:
        raise RecordError(f"{path.name}: cannot write to {path.parent}: {exc.strerror or exc}") from exc
    try:
        pipeline = gst.parse_launch(
            f"appsrc name=src format=time ! {parser} ! mp4mux name=mux ! filesink name=sink sync=false"
        )
    except glib.Error as exc:
        raise RecordError(f"{path.name}: no muxer pipeline: {exc.message}") from exc
    try:
        _run(gst, pipeline, caps, packets, part, path.name)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        pipeline.set_state(gst.State.NULL)
    try:
        digest, size = _sync_and_hash(part)
        os.replace(part, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise RecordError(f"{path.name}: cannot write the clip: {exc.strerror or exc}") from exc
    first, last = packets[0], packets[-1]
    duration_s = max(0, last.pts_ns + last.dur_ns - first.pts_ns) / 1e9
    return MuxedClip(path, size, digest, first.wall, duration_s, codec)


def _run(gst: Any, pipeline: Any, caps: str, packets: Sequence[Packet], part: Path, name: str) -> None:
    src = pipeline.get_by_name("src")
    src.set_property("caps", gst.Caps.from_string(caps))
    src.set_property("max-bytes", 0)  # unbounded: the packets are in memory already, pushed once
    pipeline.get_by_name("sink").set_property("location", str(part))
    if pipeline.set_state(gst.State.PLAYING) == gst.StateChangeReturn.FAILURE:
        _raise_bus_error(gst, pipeline, name, "the muxer would not start")
    base = packets[0].pts_ns
    last_pts = -1
    for p in packets:
        buf = gst.Buffer.new_wrapped(p.data)
        # pts rebased to 0; a packet whose pts went back (a stream with B-frames, a camera's clock jump) gets
        # the next after the one before, so the muxer's timeline only goes forward
        pts = max(p.pts_ns - base, last_pts + 1)
        last_pts = pts
        buf.pts = pts
        buf.dts = pts
        buf.duration = p.dur_ns if p.dur_ns > 0 else gst.CLOCK_TIME_NONE
        if not p.key:
            buf.set_flags(gst.BufferFlags.DELTA_UNIT)
        ret = src.emit("push-buffer", buf)
        if ret != gst.FlowReturn.OK:
            _raise_bus_error(gst, pipeline, name, f"the muxer refused a packet ({ret.value_nick})")
    src.emit("end-of-stream")
    total = sum(len(p.data) for p in packets)
    deadline = time.monotonic() + EOS_BASE_S + total / 50e6
    bus = pipeline.get_bus()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RecordError(f"{name}: the muxer did not finish within {EOS_BASE_S + total / 50e6:.0f} s")
        msg = bus.timed_pop_filtered(int(min(left, 0.5) * 1e9), gst.MessageType.ERROR | gst.MessageType.EOS)
        if msg is None:
            continue
        if msg.type == gst.MessageType.ERROR:
            err, _ = msg.parse_error()
            raise RecordError(f"{name}: the muxer failed: {err.message}")
        return


def _raise_bus_error(gst: Any, pipeline: Any, name: str, fallback: str) -> None:
    msg = pipeline.get_bus().timed_pop_filtered(int(0.5e9), gst.MessageType.ERROR)
    if msg is not None:
        err, _ = msg.parse_error()
        raise RecordError(f"{name}: {fallback}: {err.message}")
    raise RecordError(f"{name}: {fallback}")


def _sync_and_hash(part: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(part, "rb+") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
        os.fsync(f.fileno())
    if size == 0:
        raise OSError(f"{part.name} is empty")
    return h.hexdigest(), size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
