"""The GStreamer capture path: a pipeline per camera ending in an appsink, through PyGObject.

Why: the pip OpenCV is built without GStreamer, so on a Jetson it has no CSI camera, no hardware
decoder and no hardware scaler, and every full-size frame crosses into Python before it is resized.
Here ``decodebin`` picks the decoder by rank (``nvv4l2decoder`` is ranked first where it exists),
the frame is scaled to the model's input inside the pipeline (``nvvidconv`` on Jetson, ``videoscale``
elsewhere) once the source's caps say its size, and Python receives model-sized BGR frames together
with the source size the boxes map back to. A frame is a read-only view of the buffer GStreamer wrote it
into (``mapping.py``), not a copy; for a folded package's camera a Jetson pipeline ends at nvvidconv's BGRx
(``bgrx_tail``) and the letterbox copy into the model's input drops the fourth byte.

Latest frame wins: a live source's appsink keeps one buffer and drops older ones; a file's keeps one
and makes the decoder wait (no frame of a file is lost). A read waits at most ``stall_timeout_s``;
errors on the bus (401, refused, 404, no such device, caps not negotiated) end the source with the
reason, credentials scrubbed, so the camera's ``last_error`` says why.

A frame over the camera's ``max_frame_pixels`` (``framebound``) is dropped before the decoder, by the
size its input's caps announce (what a parser or demuxer read from the stream), and, where no decoder
announced one (a ``gst://`` pipeline), before its sample is mapped into Python; each is counted.

Where decodebin puts an H.264/H.265 parser before the decoder, a tap (``tap.py``) on its output keeps the stream's
own packets for a camera that records (``record:``), which attaches its encoded ring after the open.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import logging
import threading
import time
import warnings
from collections import OrderedDict
from functools import cache
from typing import Any

import numpy as np

from edged.errors import CaptureError

from ...config import CameraConfig
from ..framebound import FrameBound
from ..netcam import tls_refusal
from ..redact import scrub
from ..registry import GST_SCHEMES, plan  # GST_SCHEMES: the rows with a plan, what the GStreamer path opens
from ..uri import TO_BGR, Plan
from .mapping import Mapped, buffer_pointer, libgst
from .tap import PARSERS, ParsedTap, RawTap
from .why import Tls, connect_reason, describe_certificate_errors, explain

logger = logging.getLogger(__name__)

OPTIONAL = ("nvvidconv", "nvarguscamerasrc", "nvv4l2decoder")
SIZES_KEPT = 64  # buffers between the scaler and the reader whose source size is remembered
POLL_S = 0.1  # how often a waiting read looks at the bus and at the stop event
_CHANNELS = {"BGR": 3, "RGB": 3, "BGRx": 4, "BGRA": 4, "RGBx": 4, "RGBA": 4, "GRAY8": 1}


_LOAD_LOCK = threading.Lock()


def _load() -> tuple[Any, Any, str]:
    """(Gst, GLib, '') when PyGObject and GStreamer load, else (None, None, why not). Once per process,
    whichever camera thread comes first."""
    with _LOAD_LOCK:
        return _load_once()


@cache
def _load_once() -> tuple[Any, Any, str]:
    _unwind_with_libgcc()
    try:
        with warnings.catch_warnings():  # gi's importer predates exec_module (an ImportWarning on 3.11)
            warnings.simplefilter("ignore", ImportWarning)
            import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

            gi.require_version("Gst", "1.0")
            gi.require_version("GstApp", "1.0")
            # GstApp: appsink's pull methods (resolved below)
            from gi.repository import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
                GLib,
                Gst,
                GstApp,
            )
    except (ImportError, ValueError) as exc:
        return None, None, f"PyGObject/GStreamer not importable: {exc}"
    Gst.init(None)
    try:
        _resolve_now(Gst, GLib, GstApp)
    except Exception as exc:  # a GStreamer without one of them: found where it is used, with its own error
        logger.warning("GStreamer: could not resolve its Python classes up front: %s", exc)
    for extra in ("GstBase", "GstVideo"):  # optional: only the classes built from them are resolved sooner
        try:
            gi.require_version(extra, "1.0")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ImportWarning)
                module = importlib.import_module(f"gi.repository.{extra}")
            _resolve_now(module)
        except Exception as exc:  # an override module or a class gi cannot build: it is resolved when used
            logger.debug("PyGObject %s: %s", extra, exc)
    dec = Gst.ElementFactory.find("nvv4l2decoder")
    if dec is not None:  # decodebin must take the hardware decoder over avdec_*
        dec.set_rank(Gst.Rank.PRIMARY + 100)
    return Gst, GLib, ""


# What this module and its callbacks touch, by attribute path from the gi module they live in.
_RESOLVED = {
    "Gst": (
        "EventType.CAPS PadProbeReturn.OK PadProbeType.EVENT_DOWNSTREAM PadProbeType.BUFFER State.NULL State.PLAYING "
        "StateChangeReturn.FAILURE MessageType.ERROR MessageType.EOS IteratorResult.OK MapFlags.READ Rank.PRIMARY "
        "CLOCK_TIME_NONE PadProbeInfo Event Caps Structure Sample Buffer MapInfo Message Bus Pad Element Bin Pipeline "
        "Iterator ElementFactory Object BufferFlags.DELTA_UNIT Format.TIME FlowReturn.OK PadProbeReturn.REMOVE "
        "Segment"
    ),
    "GLib": "Error",
    "GstApp": "AppSink AppSrc",
    # the parents PyGObject builds an element's class from (filesrc, h264parse, videoscale, the decoders)
    "GstBase": "BaseSrc PushSrc BaseParse BaseTransform BaseSink",
    "GstVideo": "VideoFilter VideoDecoder",
    "Gio": "TlsFileDatabase TlsCertificate TlsConnection TlsClientConnection TlsCertificateFlags Initable",
}


def _resolve_now(*modules: Any) -> None:
    """PyGObject builds a module's classes and enum members lazily, on first use, and not safely across
    threads: cameras opening at once saw enums without members ("type object 'PadProbeReturn' has no
    attribute 'OK'") and a wrapper class made twice ("Expected Gst.PadProbeInfo, but got
    gi.repository.Gst.PadProbeInfo"), and their threads died. Everything used is resolved here, once,
    under the load lock, before any camera thread touches it."""
    for module in modules:
        for path in _RESOLVED[module.__name__.rsplit(".", 1)[-1]].split():
            obj = module
            for name in path.split("."):
                obj = getattr(obj, name)


def _unwind_with_libgcc() -> None:
    """Debian's libgstreamer links libunwind, and PyGObject opens it into the global symbol scope, so its
    `_Unwind_*` would replace libgcc's for every library loaded after it: a C++ exception thrown there
    (ONNX Runtime refusing a model, OpenCV refusing a frame) then crashes the process with SIGSEGV or an
    abort instead of raising. libgcc_s made global first keeps the unwinder C++ expects."""
    with contextlib.suppress(OSError):  # no libgcc_s by that name: nothing to protect here
        ctypes.CDLL("libgcc_s.so.1", mode=ctypes.RTLD_GLOBAL)


def _gio() -> Any:
    with _LOAD_LOCK:
        return _gio_once()


@cache
def _gio_once() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)
        import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

        gi.require_version("Gio", "2.0")
        from gi.repository import Gio  # type: ignore[import-untyped,import-not-found,unused-ignore]
    try:
        _resolve_now(Gio)
    except Exception as exc:  # as in _load_once
        logger.warning("Gio: could not resolve its TLS classes up front: %s", exc)
    return Gio


def modules() -> tuple[Any, Any]:
    """(Gst, GLib), loaded and initialised once; CaptureError with the reason where they do not load."""
    gst, glib, why = _load()
    if gst is None:
        raise CaptureError(why)
    return gst, glib


def available() -> bool:
    return _load()[0] is not None


def why_unavailable() -> str:
    return _load()[2]


def version() -> str:
    gst = _load()[0]
    return str(gst.version_string()) if gst is not None else "none"


def has_element(name: str) -> bool:
    gst = _load()[0]
    return gst is not None and gst.ElementFactory.find(name) is not None


def have() -> set[str]:
    return {e for e in OPTIONAL if has_element(e)}


def bgrx_tail(p: Plan) -> Plan:
    """A Jetson plan (nvvidconv: the VIC cannot write packed 3-byte BGR) that ends at nvvidconv's BGRx instead
    of passing through videoconvert, a CPU pass over every frame to drop the fourth byte: for a reader that
    drops it itself (a folded package's letterbox copy, ``Preprocessor``). Other plans are returned as they are."""
    bgr = f"format=BGRx ! {TO_BGR}"
    if not p.nvmm or bgr not in p.description:
        return p
    return dataclasses.replace(p, description=p.description.replace(bgr, "format=BGRx ! appsink name=sink"))


def parse_check(description: str, shown: str) -> None:
    """Raise CaptureError when a pipeline does not parse (an unknown element, a bad property)."""
    gst, glib, why = _load()
    if gst is None:
        raise CaptureError(f"{shown}: {why}")
    try:
        pipeline = gst.parse_launch(description)
    except glib.Error as exc:
        raise CaptureError(f"{shown}: bad pipeline: {scrub(str(exc.message))}") from exc
    pipeline.set_state(gst.State.NULL)


class GstSource:
    """One running pipeline. `read` gives the next BGR frame (model-sized when scaled in the pipeline;
    `scaled_from` is then the source's (width, height)), None at a file's end or after a read that
    waited `timeout_s` for nothing (a stall); raises CaptureError when the pipeline failed.

    A frame is a read-only view of the buffer GStreamer decoded or scaled into (`mapping.py`), not a copy;
    `bgrx`: a 4-byte format (BGRx, BGRA) is handed over as it is, [h, w, 4], for a reader that drops the
    fourth byte in its own copy (else it is dropped here, in a copy)."""

    def __init__(
        self,
        p: Plan,
        timeout_s: float,
        target_size: Any = None,
        stop: threading.Event | None = None,
        shown: str = "",
        tls: Tls | None = None,
        bound: FrameBound | None = None,
        bgrx: bool = False,
    ) -> None:
        gst, glib, why = _load()
        if gst is None:
            raise CaptureError(why)
        self._bgrx = bgrx
        self._lib = libgst()  # None: frames are copied out of their buffers (PyGObject's map)
        self._gst, self._timeout_s, self._stop, self._shown = gst, timeout_s, stop or threading.Event(), shown
        self.fps = 0.0
        self.scaled_from: tuple[int, int] | None = None
        self.codec = ""  # the source's caps name (video/x-h264 …), for --probe-cameras
        self.decoder = ""  # the decoder decodebin chose (nvv4l2decoder = hardware)
        self.tap: ParsedTap | None = None  # the stream's own H.264/H.265 packets, for a camera that records
        self.raw_tap: RawTap | None = None  # the decoded frames, for a camera that records another codec
        self._src_size: tuple[int, int] | None = None
        self._bound = bound or FrameBound(shown)
        self._coded_size: tuple[int, int] | None = None  # what the decoder's input caps announce
        self._coded_framed = False  # its buffers are whole frames (parsed); else a refused size counts once
        self._coded_counted = False
        self._target_size = target_size
        self._live = p.live
        self._nvmm = p.nvmm
        self._pending: np.ndarray | None = None
        self._caps: tuple[Any, tuple[int, int, str]] | None = None  # the appsink's caps and (width, height, format)
        # the source size each buffer entering the scaler had, by its timestamp: a buffer already past the
        # scaler (in the appsink) when the source changes resolution keeps the size it was scaled from
        self._sizes: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._sizes_lock = threading.Lock()
        # what the probes (on GStreamer's streaming threads) compare and return, looked up once here: a probe
        # running at interpreter exit cannot look them up ("no attribute 'CAPS'")
        self._caps_event, self._probe_ok, self._no_pts = gst.EventType.CAPS, gst.PadProbeReturn.OK, gst.CLOCK_TIME_NONE
        self._probe_drop = gst.PadProbeReturn.DROP
        # every probe and signal handler connected here holds this object, which holds the pipeline: a
        # cycle through C that Python's collector cannot see. `close` undoes them, or the closed pipeline
        # (its bus's socket pair, its decoder's buffers) outlived it: 4 fds and 1-4 MB at every reopen.
        self._hooks: list[tuple[Any, int, bool]] = []  # (element or pad, handler or probe id, is a probe)
        self.pipeline: Any = None
        self.sink: Any = None
        self._bus: Any = None
        self._size: Any = None
        self._tls = tls or Tls()
        self._tls_problem = ""  # why the camera's certificate was refused (accept-certificate), for the error
        try:
            self.pipeline = gst.parse_launch(p.description)
        except glib.Error as exc:
            raise CaptureError(f"{shown}: bad pipeline: {scrub(str(exc.message))}") from exc
        refused, bound_px = self._bound.refused, self._bound.max_pixels
        try:
            self._build(p)
            if self.pipeline.set_state(gst.State.PLAYING) == gst.StateChangeReturn.FAILURE:
                self._raise_bus_error(f"{shown}: the pipeline would not start")
            self._pending = self._pull(timeout_s)
        except CaptureError as exc:
            self.close()
            if self._bound.refused > refused:  # it ended (or failed) having sent only frames over the bound
                raise CaptureError(f"{exc}; its frames were over max_frame_pixels {bound_px}") from exc
            raise
        except BaseException:
            self.close()
            raise
        if self._pending is None:
            self.close()
            if self._bound.refused > refused:
                raise CaptureError(f"{shown}: no frame: its frames are over max_frame_pixels {bound_px}")
            if self._live and p.props.get("location"):  # a network camera: connected, or not, and then silent
                raise CaptureError(f"{shown}: no answer (no frame) within {timeout_s:g} s")
            raise CaptureError(f"{shown}: no frame within {timeout_s:g} s of opening")

    def _build(self, p: Plan) -> None:
        """Set the source's properties, connect the callbacks (each recorded for `close`), tune the appsink."""
        gst = self._gst
        src = self.pipeline.get_by_name("src")
        for key, value in p.props.items():
            if src is None:
                raise CaptureError(f"{self._shown}: pipeline without a source named src")
            src.set_property(key, value)
        if src is not None and src.get_factory() is not None and src.get_factory().get_name() == "rtspsrc":
            self._connect(src, "select-stream", self._video_only)  # a camera's audio track is not linked
            self._setup_tls(src)
        self.sink = self.pipeline.get_by_name("sink") or self._find_appsink()
        if self.sink.get_property("caps") is None:  # a gst:// pipeline that left them open: formats we read
            self.sink.set_property("caps", gst.Caps.from_string(f"video/x-raw,format={{{','.join(_CHANNELS)}}}"))
        self.sink.set_property("max-buffers", 1)
        self.sink.set_property("drop", p.live)
        self.sink.set_property("sync", False)
        dec = self.pipeline.get_by_name("dec")
        if dec is not None:
            self._connect(dec, "deep-element-added", self._element_added)
        scaler = self.pipeline.get_by_name("scaler")
        self._size = self.pipeline.get_by_name("size")
        if scaler is not None:
            pad = scaler.get_static_pad("sink")
            self._hooks.append((pad, pad.add_probe(gst.PadProbeType.EVENT_DOWNSTREAM, self._on_caps), True))
            self._hooks.append((pad, pad.add_probe(gst.PadProbeType.BUFFER, self._on_buffer), True))
        self._bus = self.pipeline.get_bus()

    def _connect(self, element: Any, signal: str, handler: Any) -> None:
        self._hooks.append((element, element.connect(signal, handler), False))

    def _setup_tls(self, src: Any) -> None:
        """rtsps://: the CA file the camera's certificate must chain to (a self-signed camera's own
        certificate pins it), or, with tls_verify false, any certificate. rtspsrc checks against its
        tls-database with tls-validation-flags; what fails those checks goes to accept-certificate,
        which refuses it (recording why) or, with tls_verify false, accepts it."""
        gio = _gio()  # also resolves the types accept-certificate passes
        if self._tls.ca_file is not None:
            try:
                database = gio.TlsFileDatabase.new(str(self._tls.ca_file))
            except Exception as exc:  # GLib.Error: unreadable, or no certificate in it
                raise CaptureError(f"{self._shown}: tls_ca_file {self._tls.ca_file}: {scrub(str(exc))}") from exc
            src.set_property("tls-database", database)
        self._connect(src, "accept-certificate", self._accept_certificate)

    def _accept_certificate(self, _src: Any, _conn: Any, _cert: Any, errors: Any) -> bool:
        if not self._tls.verify:
            return True  # tls_verify: false, warned at start and by check-config
        self._tls_problem = describe_certificate_errors(int(errors))
        return False

    # --- pipeline callbacks (streaming threads) -----------------------------------------------
    def _video_only(self, _src: Any, _num: int, caps: Any) -> bool:
        media = caps.get_structure(0).get_value("media")
        return media is None or media == "video"

    def _element_added(self, _bin: Any, _sub: Any, element: Any) -> None:
        factory = element.get_factory()
        if factory is None:
            return
        klass = factory.get_metadata("klass") or ""
        if factory.get_name() in PARSERS and self.tap is None:  # the packets before the decoder, for a ring
            self.tap = ParsedTap(self._gst, element.get_static_pad("src"), factory.get_name())
        if "Decoder" in klass and ("Video" in klass or "Image" in klass):  # jpegdec is Codec/Decoder/Image
            pad = element.get_static_pad("sink")
            if "Video" in klass:
                self.decoder = factory.get_name()
                src_pad = element.get_static_pad("src")
                if self.raw_tap is None and src_pad is not None:
                    self.raw_tap = RawTap(self._gst, src_pad)
                if pad is not None:
                    caps = pad.get_current_caps() or pad.query_caps(None)
                    if caps is not None and caps.get_size():
                        self.codec = caps.get_structure(0).get_name()
            if pad is not None:  # the bound, before decoding: by the size the decoder's input caps announce
                gst = self._gst
                self._hooks.append((pad, pad.add_probe(gst.PadProbeType.EVENT_DOWNSTREAM, self._on_coded_caps), True))
                self._hooks.append((pad, pad.add_probe(gst.PadProbeType.BUFFER, self._on_coded_buffer), True))

    def _on_coded_caps(self, _pad: Any, info: Any) -> Any:
        event = info.get_event()
        if event.type == self._caps_event:
            s = event.parse_caps().get_structure(0)
            ok_w, w = s.get_int("width")
            ok_h, h = s.get_int("height")
            self._coded_size = (w, h) if ok_w and ok_h else None
            self._coded_framed = any(s.get_boolean(k) == (True, True) for k in ("parsed", "framed"))
            self._coded_counted = False
        return self._probe_ok

    def _on_coded_buffer(self, _pad: Any, _info: Any) -> Any:
        size = self._coded_size
        if size is None or size[0] * size[1] <= self._bound.max_pixels:
            return self._probe_ok
        if self._coded_framed or not self._coded_counted:  # unparsed buffers are chunks: the size counts once
            self._bound.allows(*size)  # counts and logs the refusal
            self._coded_counted = True
        return self._probe_drop  # never decoded

    def _on_caps(self, pad: Any, info: Any) -> Any:
        event = info.get_event()
        if event.type != self._caps_event:
            return self._probe_ok
        s = event.parse_caps().get_structure(0)
        ok_w, w = s.get_int("width")
        ok_h, h = s.get_int("height")
        ok_f, num, den = s.get_fraction("framerate")
        if ok_f and den and num:
            self.fps = num / den
        if not (ok_w and ok_h):
            return self._probe_ok
        self._src_size = (w, h)
        if self._target_size is not None and self._size is not None:
            tw, th = self._target_size(w, h)
            fmt = ",format=BGRx" if self._nvmm else ""
            self._size.set_property("caps", self._gst.Caps.from_string(f"video/x-raw{fmt},width={tw},height={th}"))
        return self._probe_ok

    def _on_buffer(self, _pad: Any, info: Any) -> Any:
        buf, src = info.get_buffer(), self._src_size
        if buf is not None and src is not None and buf.pts != self._no_pts:
            with self._sizes_lock:
                self._sizes[buf.pts] = src
                while len(self._sizes) > SIZES_KEPT:
                    self._sizes.popitem(last=False)
        return self._probe_ok

    def _size_of(self, buf: Any) -> tuple[int, int] | None:
        """The source size `buf` was scaled from: recorded by its timestamp as it entered the scaler, else
        (no timestamp) the newest size the caps announced."""
        with self._sizes_lock:
            return self._sizes.get(buf.pts, self._src_size)

    # --- reading ------------------------------------------------------------------------------
    def _find_appsink(self) -> Any:
        it = self.pipeline.iterate_recurse()
        while True:
            ok, element = it.next()
            if ok != self._gst.IteratorResult.OK:
                raise CaptureError(f"{self._shown}: the pipeline has no appsink")
            factory = element.get_factory()
            if factory is not None and factory.get_name() == "appsink":
                return element

    def _raise_bus_error(self, fallback: str) -> None:
        msg = self._bus.timed_pop_filtered(int(0.5e9), self._gst.MessageType.ERROR)
        if msg is not None:
            err, debug = msg.parse_error()
            raise CaptureError(f"{self._shown}: {self._why(err, debug)}")
        raise CaptureError(fallback)

    def _why(self, err: Any, debug: str | None) -> str:
        if self._tls_problem:
            return tls_refusal(self._tls_problem, self._tls.ca_file)
        return explain(err, debug)

    def _check_bus(self) -> bool:
        """Raise on an error message; True at the end of the stream."""
        gst = self._gst
        while True:
            msg = self._bus.pop_filtered(gst.MessageType.ERROR | gst.MessageType.EOS)
            if msg is None:
                return False
            if msg.type == gst.MessageType.ERROR:
                err, debug = msg.parse_error()
                raise CaptureError(f"{self._shown}: {self._why(err, debug)}")
            return True

    def _pull(self, wait_s: float) -> np.ndarray | None:
        """The next frame; None at a file's end, at `stop`, or after `wait_s` without one."""
        deadline = time.monotonic() + wait_s
        while True:
            ended = self._check_bus()
            # after the end, what the appsink still holds (a file's last frame) is taken first
            sample = self.sink.try_pull_sample(0 if ended else int(POLL_S * 1e9))
            if sample is not None:
                w, h, fmt = self._caps_of(sample)
                if self._bound.allows(w, h):
                    return self._frame(sample, w, h, fmt)
                continue  # over the bound (counted there): never mapped into Python; the next may be fine
            if ended or self.sink.is_eos():
                self._check_bus()  # an error posted with the end is the reason
                if self._live:
                    raise CaptureError(f"{self._shown}: end of stream (the source closed it)")
                return None
            if self._stop.is_set() or time.monotonic() >= deadline:
                return None

    def _caps_of(self, sample: Any) -> tuple[int, int, str]:
        """A sample's (width, height, format), read through GI once per caps: a sample of the caps before
        (the same GstCaps, which the reference kept here keeps unchanged) costs one pointer comparison
        instead of five GI calls per frame."""
        caps = sample.get_caps()
        known = self._caps
        if known is not None and known[0] == caps:  # PyGObject compares boxed values by their pointer
            return known[1]
        s = caps.get_structure(0)
        got = (s.get_value("width"), s.get_value("height"), s.get_value("format"))
        if not self.fps:
            ok_f, num, den = s.get_fraction("framerate")
            self.fps = num / den if ok_f and num and den else 0.0
        self._caps = (caps, got)
        return got

    def _frame(self, sample: Any, w: int, h: int, fmt: str) -> np.ndarray:
        ch = _CHANNELS.get(fmt)
        if ch is None:
            raise CaptureError(
                f"{self._shown}: appsink format {fmt}: end the pipeline with videoconvert ! video/x-raw,format=BGR"
            )
        buf = sample.get_buffer()
        ptr = buffer_pointer(buf) if self._lib is not None else None
        if ptr is not None:
            frame = self._view(np.asarray(Mapped(self._lib, buf, ptr)), w, h, ch)
        else:
            ok, info = buf.map(self._gst.MapFlags.READ)
            if not ok:
                raise CaptureError(f"{self._shown}: cannot map a buffer")
            try:
                raw = info.data
                view = self._view(np.frombuffer(raw, np.uint8), w, h, ch)
                # PyGObject hands the mapped bytes over as a copy (`bytes`): a read-only view of it is the frame.
                # gst-python's override gives a memoryview of the mapping instead, which dies with `unmap`:
                # that one is copied.
                frame = view if isinstance(raw, bytes) else np.array(view, copy=True)
            finally:
                buf.unmap(info)
        if fmt.startswith("RGB"):
            frame = np.ascontiguousarray(frame[:, :, [2, 1, 0]])
        elif ch == 4 and not self._bgrx:
            frame = np.ascontiguousarray(frame[:, :, :3])
        if self._target_size is None:
            self.scaled_from = None
        else:
            src = self._size_of(buf)
            self.scaled_from = src if src is not None and src != (w, h) else None
        return frame

    @staticmethod
    def _view(data: np.ndarray, w: int, h: int, ch: int) -> np.ndarray:
        """A buffer's bytes as an image: rows `len / h` bytes apart (padded rows keep their padding out)."""
        stride = len(data) // h
        rows = data[: stride * h].reshape(h, stride)[:, : w * ch]
        return rows.reshape(h, w, ch) if ch > 1 else rows.reshape(h, w)

    def read(self) -> np.ndarray | None:
        if self.pipeline is None:
            raise ValueError(f"{self._shown}: read after close")
        if self._pending is not None:
            frame, self._pending = self._pending, None
            return frame
        return self._pull(self._timeout_s)

    def close(self) -> None:
        """Stop the pipeline and let go of it: its probes and signal handlers removed, every reference to
        it dropped, so it is freed now with its fds, threads and buffers. Closing twice is harmless."""
        pipeline, self.pipeline = self.pipeline, None
        if pipeline is None:
            return
        if pipeline.set_state(self._gst.State.NULL) == self._gst.StateChangeReturn.FAILURE:
            logger.warning("%s: the pipeline did not stop cleanly", self._shown)
        for obj, hook, is_probe in reversed(self._hooks):
            if is_probe:
                obj.remove_probe(hook)
            else:
                obj.disconnect(hook)
        self._hooks.clear()
        for tap in (self.tap, self.raw_tap):
            if tap is not None:
                tap.close()
        self.sink = self._bus = self._size = self._pending = self._caps = None
        with self._sizes_lock:
            self._sizes.clear()


def use_gstreamer(cam: CameraConfig) -> bool:
    """Whether `cam` goes through the GStreamer path (`backend`; auto = where PyGObject and GStreamer load)."""
    scheme = cam.uri.split("://", 1)[0]
    if scheme not in GST_SCHEMES or cam.backend == "opencv":
        return False
    if cam.backend == "gstreamer":
        if not available():
            raise CaptureError(f"{cam.display}: backend gstreamer: {why_unavailable()}")
        return True
    return available()


def open_gst(
    uri: str,
    shown: str,
    latency_ms: int,
    transport: str,
    timeout_s: float,
    target_size: Any = None,
    stop: threading.Event | None = None,
    tls: Tls | None = None,
    bound: FrameBound | None = None,
    bgrx: bool = False,
) -> GstSource:
    """`bgrx`: the reader takes 4-byte BGRx frames (and drops the fourth byte itself): a Jetson pipeline then
    ends at nvvidconv's BGRx, without videoconvert (`bgrx_tail`)."""
    p = plan(uri, have(), latency_ms, transport, timeout_s)
    if bgrx:
        p = bgrx_tail(p)
    try:
        return GstSource(p, timeout_s, target_size if p.scalable else None, stop, shown, tls, bound, bgrx)
    except CaptureError as exc:
        if uri.startswith("rtsp") and "Failed to connect" in str(exc):
            why = connect_reason(uri, timeout_s)
            if why is not None:
                raise CaptureError(f"{shown}: {why}") from exc
        raise
