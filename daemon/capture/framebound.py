"""How big a camera's frame may be before it is decoded: a JPEG's width and height read from its frame
header, and a camera's bound on pixels (``cameras[].max_frame_pixels``) that refuses, counts and logs
(throttled) every frame over it.

Why before decoding: a frame's bytes say little about what it decodes to. A 16,000 x 16,000 JPEG of one
colour is a few MB (well under the 32 MiB a multipart part may have) and decodes to 768 MB of BGR; one
such frame took the daemon's RSS from 0.2 to 2.44 GB. Its header says its size in the first few hundred
bytes, so a frame over the bound never reaches the decoder.

Where each capture path checks:

- MJPEG over HTTP (``netcam``): every part's JPEG frame header (SOF), before ``cv2.imdecode``. A part with
  no readable frame header (not a JPEG, cut short, or a height left to a DNL marker, which libjpeg cannot
  decode) is a bad part and is not decoded either.
- GStreamer (``gst``): the caps a decoder's input announces (from the parser: h264parse, jpegparse, a
  demuxer) before its first buffer: while they are over the bound, buffers are dropped before the decoder;
  and a sample's caps before it is mapped into Python (a ``gst://`` pipeline with no decoder).
- OpenCV/FFmpeg (``sources.OpenCvSource``): FFmpeg decodes inside its open, so the bound is checked on the
  size the open reports and a source over it is refused (the camera is down with the reason); FFmpeg's
  backend then scales every later frame to that size, so what reaches Python stays within it.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

# 8K UHD (7680 x 4320, 33.2 MP; 100 MB as BGR): the largest sensor edge cameras ship (8K bullet and
# multi-sensor panoramic cameras; most send 2-12 MP), and the largest size a v4l2:// or csi:// URI may ask for
MAX_FRAME_PIXELS = 7680 * 4320
LOG_EVERY_S = 60.0  # after the first refusal is logged, at most one line a minute per camera

# SOF0-SOF15 (baseline, extended, progressive, lossless; Huffman or arithmetic), less C4 (DHT), C8 (JPG), CC (DAC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-RST7: markers without a segment


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header, walking its segments from SOI; None when `data` is no JPEG,
    it ends (or its scan starts) before a frame header, or the header leaves the height to a DNL marker."""
    n = len(data)
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i < n:
        if data[i] != 0xFF:  # between segments only markers: the entropy-coded data comes after SOS
            return None
        while i < n and data[i] == 0xFF:  # a marker may be preceded by fill bytes
            i += 1
        if i >= n:
            return None
        marker = data[i]
        i += 1
        if marker in _NO_LENGTH:
            continue
        if marker in (0xD9, 0xDA) or i + 2 > n:  # EOI or SOS before any frame header, or cut short
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if i + 7 > n:
                return None
            # length (2), sample precision (1), number of lines (2), samples per line (2)
            height = int.from_bytes(data[i + 3 : i + 5], "big")
            width = int.from_bytes(data[i + 5 : i + 7], "big")
            return (width, height) if width and height else None
        i += length
    return None


class FrameBound:
    """One camera's bound on a frame's pixels. `allows(width, height)` is False for a frame over it: the
    refusal is counted in `refused` (telemetry's ``frames_refused``) and logged, the first at once, then at
    most once every `log_every_s` with the count since."""

    def __init__(self, camera: str, max_pixels: int = MAX_FRAME_PIXELS, log_every_s: float = LOG_EVERY_S) -> None:
        if max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, not {max_pixels}")
        self.camera = camera
        self.max_pixels = max_pixels
        self.refused = 0
        self._log_every_s = log_every_s
        self._logged_at: float | None = None
        self._logged_count = 0

    def allows(self, width: int, height: int) -> bool:
        if width * height <= self.max_pixels:
            return True
        self.refused += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= self._log_every_s:
            logger.warning(
                "camera %s: refused a %dx%d frame (%d pixels) before decoding: over max_frame_pixels %d "
                "(%d refused so far, %d since the last line)",
                self.camera,
                width,
                height,
                width * height,
                self.max_pixels,
                self.refused,
                self.refused - self._logged_count,
            )
            self._logged_at, self._logged_count = now, self.refused
        return False
