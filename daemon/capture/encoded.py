"""A camera's encoded stream kept in memory: the ring clips are cut from (daemon/record/).

The camera's capture feeds it packets: for RTSP H.264/H.265 the camera's own packets, taken before the
decoder (no re-encode); for other sources the decoded frames encoded once (``capture/gstreamer/encode.py``).
Each packet carries the wall time of the frame it holds, its presentation time and whether a clip may start
on it (a keyframe). The ring is bounded by bytes and by seconds; the oldest packets go first, counted.

A reopen of the source may change the stream's caps and restart its timestamps: it starts a new *segment*
(``new_segment``), and a span never crosses two segments. No GStreamer here: the ring holds bytes and the
caps string the muxer needs.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.cameras import RecordConfig


@dataclass(frozen=True, slots=True)
class Packet:
    """One encoded access unit (a frame's worth of H.264/H.265, byte-stream or avc as the caps say)."""

    wall: float  # time.time() of the frame this packet carries (same clock as FrameMeta.wall)
    pts_ns: int  # presentation time, monotonic within one camera open (a reopen may restart it)
    dur_ns: int
    key: bool  # a keyframe (IDR): a clip may start here
    data: bytes


class EncodedRing:
    """Thread-safe: the capture thread adds, any thread reads spans. Bounded by ``max_bytes`` and ``max_s``
    (the newest packet's wall time minus the oldest's); the oldest packets are evicted first (``evicted``).

    Eviction keeps the ring starting on a keyframe where it can: packets before the oldest kept keyframe
    can never start a clip, so they are the first to go once a bound is hit."""

    def __init__(self, max_bytes: int, max_s: float) -> None:
        if max_bytes <= 0 or max_s <= 0:
            raise ValueError(f"an encoded ring needs positive bounds, got {max_bytes} bytes and {max_s} s")
        self.max_bytes = max_bytes
        self.max_s = max_s
        self.caps: str | None = None
        self.segment = 0
        self.bytes = 0
        self.evicted = 0  # packets evicted by the bounds
        self.evicted_bytes = 0
        self.added = 0
        self.keyframes = 0  # keyframes added
        self.refused = 0  # packets refused: larger than the whole ring, or before any caps
        self._lock = threading.Lock()
        self._packets: deque[Packet] = deque()
        self._keys_kept = 0  # keyframes in _packets

    # ---- the capture side

    def new_segment(self, caps: str | None) -> None:
        """A (re)opened source: what is kept is dropped (its caps and timestamps no longer hold) and the
        segment number goes up. Caps None: not known yet (``set_caps`` gives them); packets wait for them."""
        with self._lock:
            self.segment += 1
            self.caps = caps
            self._drop_all()

    def set_caps(self, caps: str) -> None:
        """The caps of the running segment once known (the first packet's); a change starts a new segment."""
        with self._lock:
            if caps == self.caps:
                return
            if self.caps is not None:  # a change within one open: what is kept no longer decodes with them
                self.segment += 1
                self._drop_all()
            self.caps = caps

    def add(self, p: Packet) -> None:
        with self._lock:
            if self.caps is None or len(p.data) > self.max_bytes:
                self.refused += 1
                return
            self._packets.append(p)
            self.bytes += len(p.data)
            self.added += 1
            self.keyframes += p.key
            self._keys_kept += p.key
            self._evict()

    def _evict(self) -> None:
        packets = self._packets
        newest = packets[-1].wall
        while packets and (self.bytes > self.max_bytes or newest - packets[0].wall > self.max_s):
            self._pop()
        # what precedes the oldest keyframe cannot start a clip: it goes with the packets evicted
        while packets and not packets[0].key and self._keys_kept:
            self._pop()

    def _pop(self) -> None:
        gone = self._packets.popleft()
        self.bytes -= len(gone.data)
        self._keys_kept -= gone.key
        self.evicted += 1
        self.evicted_bytes += len(gone.data)

    def _drop_all(self) -> None:
        self._packets.clear()
        self.bytes = 0
        self._keys_kept = 0

    # ---- the reading side

    def span(self, start_wall: float, end_wall: float) -> tuple[str, list[Packet]]:
        """(caps, packets) from the last keyframe at or before ``start_wall`` (else the oldest keyframe kept)
        through ``end_wall``, within the current segment; an empty list when nothing fits."""
        if end_wall < start_wall:
            raise ValueError(f"a span ends before it starts: {start_wall} > {end_wall}")
        with self._lock:
            caps = self.caps or ""
            packets = list(self._packets)
        first = None
        for i, p in enumerate(packets):
            if p.wall > start_wall and first is not None:
                break
            if p.key:
                first = i
                if p.wall > start_wall:
                    break  # no keyframe at or before the start is kept: the oldest after it
        if first is None or packets[first].wall > end_wall:
            return caps, []
        out = [p for p in packets[first:] if p.wall <= end_wall]
        return caps, out

    def newest_wall(self) -> float | None:
        with self._lock:
            return self._packets[-1].wall if self._packets else None

    def oldest_wall(self) -> float | None:
        with self._lock:
            return self._packets[0].wall if self._packets else None

    def stats(self) -> dict[str, float | int]:
        """What telemetry and the tests read: numbers with their units in their names."""
        with self._lock:
            n = len(self._packets)
            span_s = self._packets[-1].wall - self._packets[0].wall if n else 0.0
            return {
                "segment": self.segment,
                "packets": n,
                "bytes": self.bytes,
                "span_s": round(span_s, 3),
                "added": self.added,
                "keyframes": self.keyframes,
                "evicted": self.evicted,
                "evicted_bytes": self.evicted_bytes,
                "refused": self.refused,
            }


def ring_for(cfg: RecordConfig) -> EncodedRing:
    """The ring a camera's ``record:`` asks for: ``ring_mb`` of bytes, and seconds enough for the longest clip
    (pre-roll, ``max_clip_s``, post-roll) plus a margin for the keyframe before it and the planning; the bytes
    bound is the one that holds memory (at 2 Mbit/s, 16 MB keep about a minute)."""
    max_s = cfg.pre_s + cfg.max_clip_s + cfg.post_s + RING_MARGIN_S
    return EncodedRing(max_bytes=int(cfg.ring_mb * 1024 * 1024), max_s=max_s)


RING_MARGIN_S = 30.0
