"""A GStreamer buffer's memory seen by NumPy without PyGObject's copy: ``gst_buffer_map`` through ctypes on the
GstBuffer* a PyGObject wrapper holds. PyGObject's own ``map`` hands the bytes over as a new ``bytes`` per frame
(1.5 MB and ~0.4 ms for a 960x540 frame on this class of host; bench/pipeline_copies.py); a `Mapped` holds a
reference on the buffer and unmaps it when the last NumPy view of it goes. Where libgstreamer does not load
through ctypes, or the wrapper's pointer cannot be confirmed, the caller copies as before (``libgst`` None,
``buffer_pointer`` None)."""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from typing import Any

from edged.errors import CaptureError

logger = logging.getLogger(__name__)


class MapInfo(ctypes.Structure):
    """GstMapInfo (gst/gstmemory.h), as ``gst_buffer_map`` fills it."""

    _fields_ = [
        ("memory", ctypes.c_void_p),
        ("flags", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("maxsize", ctypes.c_size_t),
        ("user_data", ctypes.c_void_p * 4),
        ("_gst_reserved", ctypes.c_void_p * 4),
    ]


_GST_MAP_READ = 1


@cache
def libgst() -> Any:
    """libgstreamer through ctypes, for mapping a buffer without PyGObject's copy; None where it does not load."""
    try:
        lib = ctypes.CDLL("libgstreamer-1.0.so.0")
    except OSError as exc:
        logger.info("libgstreamer not loadable through ctypes (%s): frames are copied out of their buffers", exc)
        return None
    lib.gst_buffer_map.argtypes = [ctypes.c_void_p, ctypes.POINTER(MapInfo), ctypes.c_int]
    lib.gst_buffer_map.restype = ctypes.c_int
    lib.gst_buffer_unmap.argtypes = [ctypes.c_void_p, ctypes.POINTER(MapInfo)]
    lib.gst_buffer_unmap.restype = None
    return lib


def buffer_pointer(buf: Any) -> int | None:
    """The GstBuffer* a PyGObject wrapper holds: what its hash is (PyGObject hashes a boxed value by its
    pointer), confirmed against the pointer field of the wrapper's own struct (PyGBoxed: the object header,
    then the pointer), neither read from GStreamer's memory. None where the two disagree (another PyGObject)."""
    ptr = hash(buf)
    held = ctypes.c_void_p.from_address(id(buf) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    return ptr if ptr > 0 and ptr == held else None


class Mapped:
    """A buffer's memory mapped for reading, seen by NumPy (``__array_interface__``, read-only): a frame is a
    view of GStreamer's own memory, not PyGObject's copy of it (``info.data`` is a new ``bytes`` per frame:
    1.5 MB and ~0.4 ms for a 960x540 frame here). It holds a reference on the buffer, so the buffer is not
    reused while a view of it lives; the last view gone, the mapping ends and the buffer goes back to its pool."""

    def __init__(self, lib: Any, buf: Any, ptr: int) -> None:
        info = MapInfo()
        if not lib.gst_buffer_map(ptr, ctypes.byref(info), _GST_MAP_READ):
            raise CaptureError("cannot map a buffer")
        self._lib, self._buf, self._ptr, self._info = lib, buf, ptr, info
        self.__array_interface__ = {"shape": (info.size,), "typestr": "|u1", "data": (info.data, True), "version": 3}

    def __del__(self) -> None:
        self._lib.gst_buffer_unmap(self._ptr, ctypes.byref(self._info))
