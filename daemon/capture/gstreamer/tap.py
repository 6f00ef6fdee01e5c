"""A camera's own H.264/H.265 packets into its ring (capture/encoded.py), never re-encoded.

Where the source is H.264/H.265 already (an RTSP camera, an MP4 of H.264), ``decodebin`` puts a parser before
the decoder; the packets leaving it are copied into the ring as they pass, by a pad probe on the parser's
source pad: the decode branch never waits on a queue of ours, and what the probe costs is one copy of each
packet (a few kB) on the streaming thread. The pipeline (``pipeline.py``) installs a tap when decodebin adds
the parser; the camera attaches its ring after the open. No GStreamer import: the pipeline hands it over.

Where the stream is not H.264/H.265, ``RawTap`` on the decoder's output hands the decoded frames, by reference,
to the encoder the camera attaches (``encode.py``): full size (before any scaling for the model), every frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..encoded import EncodedRing, Packet

PARSERS = ("h264parse", "h265parse")
EARLY_MAX = 60  # packets a tap holds until the camera attaches its ring (an open passes a few); past it, it lets go


class ParsedTap:
    """The packets leaving an H.264/H.265 parser inside a camera's pipeline, into a ring once attached.

    Installed by the pipeline when decodebin adds the parser, before the first frame is decoded: packets that
    pass before the camera attaches its ring (``attach``) are held (at most EARLY_MAX), so the first keyframe of
    an open is kept. A camera that records nothing never attaches: at EARLY_MAX the probe removes itself."""

    def __init__(self, gst: Any, pad: Any, parser: str) -> None:
        self.parser = parser
        self.codec = "h265" if parser == "h265parse" else "h264"
        self._gst = gst
        self._pad = pad
        self._lock = threading.Lock()
        self._ring: EncodedRing | None = None
        self._caps: str | None = None
        self._early: list[Packet] = []
        self._gone = False
        self.packets = 0
        self._ok, self._remove = gst.PadProbeReturn.OK, gst.PadProbeReturn.REMOVE
        self._caps_event, self._delta = gst.EventType.CAPS, gst.BufferFlags.DELTA_UNIT
        self._buffer_type, self._none = gst.PadProbeType.BUFFER, gst.CLOCK_TIME_NONE
        self._probe = pad.add_probe(gst.PadProbeType.BUFFER | gst.PadProbeType.EVENT_DOWNSTREAM, self._on_pad)

    def attach(self, ring: EncodedRing) -> bool:
        """From now on packets go into `ring`, which starts a new segment with those held so far. False when
        the tap let go of its pad already (more than EARLY_MAX packets passed before the ring came)."""
        with self._lock:
            if self._gone:
                return False
            self._ring = ring
            ring.new_segment(self._caps)  # caps None: packets are refused until the caps event comes
            for p in self._early:
                ring.add(p)
            self._early.clear()
            return True

    def close(self) -> None:
        with self._lock:
            if not self._gone:
                self._gone = True
                self._pad.remove_probe(self._probe)
            self._ring = None
            self._early.clear()

    def _on_pad(self, _pad: Any, info: Any) -> Any:
        if not info.type & self._buffer_type:
            event = info.get_event()
            if event is not None and event.type == self._caps_event:
                caps = event.parse_caps().to_string()
                with self._lock:
                    self._caps = caps
                    if self._ring is not None:
                        self._ring.set_caps(caps)
            return self._ok
        buf = info.get_buffer()
        none = self._none
        pts = buf.pts if buf.pts != none else time.monotonic_ns()  # monotonic within the open either way
        p = Packet(
            time.time(),
            int(pts),
            int(buf.duration) if buf.duration != none else 0,
            not buf.has_flags(self._delta),
            buf.extract_dup(0, buf.get_size()),
        )
        with self._lock:
            self.packets += 1
            if self._ring is not None:
                self._ring.add(p)
                return self._ok
            if self._gone:
                return self._remove
            self._early.append(p)
            if len(self._early) >= EARLY_MAX:  # nobody records this camera: stop costing anything
                self._early.clear()
                self._gone = True
                return self._remove
        return self._ok


class RawTap:
    """The decoded frames leaving the decoder of a camera's pipeline, handed by reference (no copy) to an encoder
    once the camera attaches one (a stream that is not H.264/H.265: ``encode.py``). A camera that records
    nothing never attaches: after EARLY_MAX frames the probe removes itself."""

    def __init__(self, gst: Any, pad: Any) -> None:
        self._gst = gst
        self._pad = pad
        self._lock = threading.Lock()
        self._push: Callable[[Any, str], None] | None = None
        self.caps: str | None = None
        self._gone = False
        self.frames = 0
        self._ok, self._remove = gst.PadProbeReturn.OK, gst.PadProbeReturn.REMOVE
        self._caps_event, self._buffer_type = gst.EventType.CAPS, gst.PadProbeType.BUFFER
        self._probe = pad.add_probe(gst.PadProbeType.BUFFER | gst.PadProbeType.EVENT_DOWNSTREAM, self._on_pad)

    def attach(self, push: Callable[[Any, str], None]) -> bool:
        """From now on each decoded frame goes to `push(buffer, caps)` on GStreamer's thread; False when the tap
        let go of its pad already."""
        with self._lock:
            if self._gone:
                return False
            self._push = push
            return True

    def close(self) -> None:
        with self._lock:
            if not self._gone:
                self._gone = True
                self._pad.remove_probe(self._probe)
            self._push = None

    def _on_pad(self, _pad: Any, info: Any) -> Any:
        if not info.type & self._buffer_type:
            event = info.get_event()
            if event is not None and event.type == self._caps_event:
                self.caps = event.parse_caps().to_string()
            return self._ok
        with self._lock:
            self.frames += 1
            push, caps = self._push, self.caps
            if push is None:
                if self._gone or self.frames >= EARLY_MAX:
                    self._gone = True
                    return self._remove
                return self._ok
        if caps is not None:
            push(info.get_buffer(), caps)
        return self._ok
