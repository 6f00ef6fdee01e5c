"""Frame -> one row of the model's input, written into a preallocated buffer.

Runs in the camera threads, so the inference thread only copies finished rows into the batch.
Driven by the model's input spec: letterbox (centred or top-left) or stretch resize, colour order, (x*scale - mean)/std,
NCHW or NHWC. Uses OpenCV for the resize, the border and the colour conversion; every
intermediate buffer is allocated once per camera (per source size) and reused.

A model that takes the pixels as they come (uint8, BGR, NHWC: a package whose preprocessing is folded
into its graph, models/fold.py) gets them resized straight into its row and the border painted around
them: one pass over the frame, no canvas, no colour or float pass. A camera's own rows (`own_rows`) have their
border painted once per geometry: at four cameras on two cores even four small NumPy assignments a frame show.
A 4-byte BGRx frame (a Jetson pipeline that ends at nvvidconv's BGRx, without videoconvert) loses its fourth
byte inside that pass: a strided view of its first three bytes is what is copied into the row (resized first,
at the model's size, where the pipeline did not scale it).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from edged.models.package import InputSpec

_DTYPES = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}


@dataclass(frozen=True)
class Transform:
    """Maps model-input pixels back to source-image pixels: src = (x - pad) / scale."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    src_width: int
    src_height: int

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """[N, 4] x1,y1,x2,y2 in model pixels -> source pixels, clipped to the image."""
        out = np.empty_like(boxes, dtype=np.float32)
        out[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.scale_x
        out[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.scale_y
        np.clip(out[:, 0::2], 0, self.src_width, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, self.src_height, out=out[:, 1::2])
        return out


class Preprocessor:
    """Owns the scratch buffers of one camera; `run` fills an output row in place."""

    def __init__(self, spec: InputSpec) -> None:
        self.spec = spec
        self.row_shape: tuple[int, ...] = tuple(spec.shape[1:])
        self.dtype = np.dtype(_DTYPES[spec.dtype])
        c = spec.channels
        self._canvas = np.full((spec.height, spec.width, c), spec.pad_value, np.uint8)
        self._color = np.empty((spec.height, spec.width, c), np.uint8)
        self._float = np.empty((spec.height, spec.width, c), np.float32)
        self._resized = np.empty((0, 0, c), np.uint8)
        self._resized4 = np.empty((0, 0, 4), np.uint8)  # a BGRx frame resized, before its fourth byte is dropped
        std = np.asarray(spec.std, np.float64)
        self._mul = (*(spec.scale / std).tolist(), 0.0)  # cv2 scalars: 4 components, one per channel
        self._add = (*(-np.asarray(spec.mean, np.float64) / std).tolist(), 0.0)
        self._src_size: tuple[int, int] | None = None
        self._transform: Transform | None = None
        self._inner: tuple[slice, slice, tuple[int, int]] | None = None
        # own_rows: id -> (the row, the inner rectangle its border was painted around; None: not yet)
        self._owned: dict[int, tuple[np.ndarray, tuple[slice, slice] | None]] = {}
        # the row is the letterboxed frame itself (uint8 BGR NHWC: a folded model's input)
        self.pixels = (spec.dtype, spec.layout, spec.color) == ("uint8", "NHWC", "BGR")

    def new_row(self) -> np.ndarray:
        return np.empty(self.row_shape, self.dtype)

    def own_rows(self, n: int) -> list[np.ndarray]:
        """`n` rows this preprocessor keeps (a camera's slots): a folded row's border is painted once per
        geometry, not at every frame, since nothing else writes into them. Any other row is painted each time."""
        rows = [self.new_row() for _ in range(n)]
        self._owned.update({id(r): (r, None) for r in rows})
        return rows

    def _geometry(self, w: int, h: int) -> tuple[Transform, tuple[slice, slice, tuple[int, int]]]:
        if self._transform is not None and self._inner is not None and self._src_size == (w, h):
            return self._transform, self._inner
        tw, th = self.spec.width, self.spec.height
        if self.spec.resize == "stretch":
            t = Transform(tw / w, th / h, 0.0, 0.0, w, h)
            inner = (slice(0, th), slice(0, tw), (tw, th))
        else:
            s = min(tw / w, th / h)
            # centred with the size rounded (Ultralytics' LetterBox), or at the top left with the padding
            # bottom/right and the size truncated (YOLOX's preproc: int(w * r)); input spec `letterbox`.
            # The transform carries the actual scale and offset, so boxes map back exactly either way.
            if self.spec.align == "center":
                nw, nh = max(1, round(w * s)), max(1, round(h * s))
                px, py = (tw - nw) // 2, (th - nh) // 2
            else:
                nw, nh = max(1, min(tw, int(w * s))), max(1, min(th, int(h * s)))
                px, py = 0, 0
            t = Transform(nw / w, nh / h, float(px), float(py), w, h)
            inner = (slice(py, py + nh), slice(px, px + nw), (nw, nh))
            self._canvas[:] = self.spec.pad_value
        self._src_size, self._transform, self._inner = (w, h), t, inner
        return t, inner

    def inner_size(self, w: int, h: int) -> tuple[int, int]:
        """The size a `w` x `h` source is resized to inside the model's input (before any padding):
        what a capture pipeline that scales frames itself must deliver."""
        return self._geometry(w, h)[1][2]

    def run(self, frame: np.ndarray, out: np.ndarray, src_size: tuple[int, int] | None = None) -> Transform:
        """Preprocess a BGR (or grey, or BGRx) frame into `out` (shape `row_shape`); return the transform.
        `src_size`: the frame was already scaled (by a capture pipeline) from a source of this
        (width, height) to `inner_size`; the transform maps boxes back to that source."""
        if frame.ndim == 2:
            frame = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
        elif frame.shape[2] == 4 and not self.pixels:  # BGRx into a float row: the fourth byte dropped first
            frame = cv2.cvtColor(frame, cv2.COLOR_BGRA2BGR)
        h, w = frame.shape[:2]
        t, (ys, xs, size) = self._geometry(*(src_size or (w, h)))
        if src_size is not None and (w, h) != size:
            raise ValueError(f"a frame scaled from {src_size} must be {size}, not {(w, h)}")
        if self.pixels:
            self._letterbox(frame, out, ys, xs, size)
            return t
        if (w, h) == size:  # scaled already (or the source is the model's size)
            self._canvas[ys, xs] = frame
        else:
            # Bilinear, as Ultralytics' letterbox and DeepStream scale: INTER_AREA antialiases better but
            # costs ~20x more on a 960x540 -> 256x144 downscale (3 ms against 0.15 ms here).
            if self._resized.shape[:2] != (size[1], size[0]):
                self._resized = np.empty((size[1], size[0], 3), np.uint8)
            cv2.resize(frame, size, dst=self._resized, interpolation=cv2.INTER_LINEAR)
            self._canvas[ys, xs] = self._resized
        if self.spec.color == "RGB":
            cv2.cvtColor(self._canvas, cv2.COLOR_BGR2RGB, dst=self._color)
        else:
            np.copyto(self._color, self._canvas)
        if self.dtype == np.uint8:
            self._write(self._color, out)
            return t
        # (x * scale - mean) / std per channel, with OpenCV's per-channel scalars: one pass each, no
        # NumPy broadcasting over a 3-long inner axis (which costs ~5x more).
        if self.spec.layout == "NHWC" and out.dtype == np.float32:
            cv2.multiply(self._color, self._mul, dst=out, dtype=cv2.CV_32F)  # type: ignore[call-overload]
            cv2.add(out, self._add, dst=out)  # type: ignore[call-overload]
        elif self.spec.layout == "NCHW" and out.dtype == np.float32:
            for c, plane in enumerate(cv2.split(self._color)):  # planar output straight into the row
                cv2.multiply(plane, self._mul[c], dst=out[c], dtype=cv2.CV_32F)
                cv2.add(out[c], self._add[c], dst=out[c])
        else:  # float16 rows: normalise in float32, then convert
            cv2.multiply(self._color, self._mul, dst=self._float, dtype=cv2.CV_32F)  # type: ignore[call-overload]
            cv2.add(self._float, self._add, dst=self._float)  # type: ignore[call-overload]
            self._write(self._float, out)
        return t

    def _letterbox(self, frame: np.ndarray, out: np.ndarray, ys: slice, xs: slice, size: tuple[int, int]) -> None:
        """The frame resized straight into the row's inner rectangle (OpenCV writes through a strided view),
        the border around it painted with the pad value. A BGRx frame: its first three bytes (a strided view)
        are what is copied, after a resize at the model's size where it is not that size yet (OpenCV cannot
        read a 3-of-4-bytes view, and the 4-byte resize gives the same values per channel)."""
        inner = out[ys, xs]
        if frame.shape[2] == 4:
            if frame.shape[1::-1] != size:
                if self._resized4.shape[:2] != (size[1], size[0]):
                    self._resized4 = np.empty((size[1], size[0], 4), np.uint8)
                cv2.resize(frame, size, dst=self._resized4, interpolation=cv2.INTER_LINEAR)
                frame = self._resized4
            np.copyto(inner, frame[:, :, :3])
        elif frame.shape[1::-1] == size:
            np.copyto(inner, frame)
        elif cv2.resize(frame, size, dst=inner, interpolation=cv2.INTER_LINEAR) is not inner:
            raise RuntimeError("cv2.resize did not write into the row it was given")  # an OpenCV that copies
        owned = self._owned.get(id(out))
        if owned is not None and owned[0] is out:  # a row of own_rows (held here, so its id is its own)
            if owned[1] == (ys, xs):
                return  # its border is painted for this geometry already
            self._owned[id(out)] = (out, (ys, xs))
        pad = self.spec.pad_value
        out[: ys.start] = pad
        out[ys.stop :] = pad
        out[ys, : xs.start] = pad
        out[ys, xs.stop :] = pad

    def _write(self, src: np.ndarray, out: np.ndarray) -> None:
        if self.spec.layout == "NHWC":
            np.copyto(out, src, casting="unsafe")
        else:
            np.copyto(out, src.transpose(2, 0, 1), casting="unsafe")
