"""A folded package's camera side on the GStreamer path: frames as views of GStreamer's own buffers (no copy
out of them), and the Jetson tail that ends at nvvidconv's BGRx without videoconvert, its fourth byte dropped
inside the one letterbox copy into the slot.

This machine has no nvvidconv: the BGRx tail runs here through the same code (GstSource with a Jetson plan,
bgrx=True) with a software stand-in for nvvidconv (STAND_IN: videoscale, then videoconvert to BGRx), fed the
real demo video; its slots must equal the BGR path's, frame for frame. The Jetson pipeline text itself is
checked as the code builds it for a machine that has nvvidconv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edged.daemon.capture import uri as gstpipe
from edged.daemon.capture.camera import _at_source_size, _bgr
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.preprocess import Preprocessor
from edged.models.demo import DemoAssets
from edged.models.fold import folded_spec
from edged.models.package import InputSpec

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer capture path: {gst.why_unavailable()}")

JETSON = {"nvvidconv", "nvarguscamerasrc"}
# The software stand-in for nvvidconv (which scales and converts to BGRx in one element, on the VIC).
STAND_IN = "videoscale name=scaler ! videoconvert"


def folded(demo: DemoAssets) -> InputSpec:
    return folded_spec(demo.packages["blazeface-back"].manifest.input)


def test_the_jetson_tail_for_a_folded_package_ends_at_nvvidconvs_bgrx() -> None:
    p = gstpipe.plan_file("file:///v/demo.mp4", JETSON, 200, "auto", 5.0)
    assert "videoconvert" in p.description  # what an unfolded package's camera keeps: packed BGR
    tail = gst.bgrx_tail(p)
    assert tail.description == (
        "filesrc name=src ! decodebin name=dec ! nvvidconv name=scaler ! "
        "capsfilter name=size caps=video/x-raw,format=BGRx ! appsink name=sink"
    )
    assert (tail.props, tail.live, tail.scalable, tail.nvmm) == (p.props, p.live, p.scalable, p.nvmm)
    csi = gst.bgrx_tail(gstpipe.plan_csi("csi://0?width=1920&height=1080&fps=30", JETSON, 200, "auto", 5.0))
    assert csi.description.endswith("nvvidconv name=scaler ! capsfilter name=size caps=video/x-raw,format=BGRx ! "
                                    "appsink name=sink")  # fmt: skip
    assert "videoconvert" not in csi.description
    rtsp = gst.bgrx_tail(gstpipe.plan_rtsp("rtsp://cam/1", JETSON, 200, "auto", 5.0))
    assert "videoconvert" not in rtsp.description and rtsp.description.startswith("rtspsrc name=src")


def test_off_a_jetson_the_bgrx_tail_changes_nothing() -> None:
    for p in (
        gstpipe.plan_file("file:///v/demo.mp4", set(), 200, "auto", 5.0),  # videoscale: videoconvert stays
        gstpipe.plan_gst("gst://videotestsrc ! videoconvert ! appsink name=sink", JETSON, 200, "auto", 5.0),
    ):
        assert gst.bgrx_tail(p) is p


def _slots(src: gst.GstSource, pre: Preprocessor, n: int) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    try:
        while len(out) < n:
            frame = src.read()
            if frame is None:
                break
            row = pre.new_row()
            pre.run(frame, row, src.scaled_from)
            out.append(row)
    finally:
        src.close()
    return out


def _frames(src: gst.GstSource) -> list[np.ndarray]:
    """Every frame of a file source, then closed."""
    out: list[np.ndarray] = []
    try:
        while (frame := src.read()) is not None:
            out.append(frame)
    finally:
        src.close()
    return out


def _root(a: np.ndarray) -> object:
    """What an array's memory finally belongs to (its base's base ...)."""
    root: object = a
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    return root


def _stand_in(path: Path, target: object) -> gst.GstSource:
    """The Jetson plan for a folded package, nvvidconv replaced by its software stand-in."""
    p = gst.bgrx_tail(gstpipe.plan_file(f"file://{path}", JETSON, 200, "auto", 5.0))
    p.description = p.description.replace("nvvidconv name=scaler", STAND_IN)
    return gst.GstSource(p, 10.0, target, shown="bgrx stand-in", bgrx=True)


@pytest.mark.parametrize("scaled", [True, False], ids=["scaled-in-pipeline", "full-size"])
def test_bgrx_frames_fill_the_same_slots_as_bgr_frames(demo: DemoAssets, scaled: bool) -> None:
    """The real demo video, frame for frame: the BGRx tail (fourth byte dropped in the letterbox copy) gives
    the slots the BGR tail (videoconvert to BGR) gives, scaled in the pipeline (a Jetson's default) or not."""
    spec = folded(demo)
    pre_bgr, pre_bgrx = Preprocessor(spec), Preprocessor(spec)
    assert pre_bgrx.pixels
    n = 90
    bgrx = _stand_in(demo.video, pre_bgrx.inner_size if scaled else None)
    first = bgrx.read()
    assert first is not None and first.shape[2] == 4  # the tail ended at BGRx: no conversion to BGR in it
    assert first.shape[:2] == ((144, 256) if scaled else (540, 960))
    bgrx._pending = first  # read again below, as the first frame
    ref = gst.open_gst(f"file://{demo.video}", "bgr", 200, "auto", 10.0, pre_bgr.inner_size if scaled else None)
    want, got = _slots(ref, pre_bgr, n), _slots(bgrx, pre_bgrx, n)
    assert len(want) == len(got) == n
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape == (256, 256, 3)
        assert np.array_equal(a, b), f"frame {i}: {int(np.count_nonzero(a != b))} values differ"
    assert len({int(s.sum()) for s in want}) > n // 2  # real, moving frames, not one picture repeated


def test_a_bgrx_frame_into_an_unfolded_row_equals_its_bgr(demo: DemoAssets) -> None:
    """An unfolded package's camera is never handed BGRx by the pipeline; given one anyway, its row is the
    BGR frame's."""
    spec = demo.packages["blazeface-back"].manifest.input
    src = gst.open_gst(f"file://{demo.video}", "bgr", 200, "auto", 10.0)
    try:
        frame = src.read()
    finally:
        src.close()
    assert frame is not None
    x = np.dstack([frame, np.full(frame.shape[:2], 7, np.uint8)])
    a, b = Preprocessor(spec), Preprocessor(spec)
    ra, rb = a.new_row(), b.new_row()
    a.run(frame, ra)
    b.run(x, rb)
    assert np.array_equal(ra, rb) and float(np.abs(ra).sum()) > 0


def test_snapshots_and_crops_of_a_bgrx_frame_are_bgr() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 255, (90, 160, 4), np.uint8)
    assert np.array_equal(_bgr(x), x[:, :, :3]) and _bgr(x).flags.c_contiguous
    assert _at_source_size(x, None).shape == (90, 160, 3)
    assert _at_source_size(x, (320, 180)).shape == (180, 320, 3)
    bgr = x[:, :, :3].copy()
    assert _bgr(bgr) is bgr


def test_frames_are_views_of_gstreamers_buffers_and_stay_unchanged_while_held(demo: DemoAssets) -> None:
    """No copy out of the buffer: a frame is a read-only view of GStreamer's mapped memory; a frame held while
    the pipeline reads on keeps its values (its buffer is not reused), and the pipeline does not wait on the
    frames held."""
    src = gst.open_gst(f"file://{demo.video}", "views", 200, "auto", 10.0)
    held: list[tuple[np.ndarray, np.ndarray]] = []
    try:
        for _ in range(40):
            frame = src.read()
            assert frame is not None
            assert isinstance(frame.base, np.ndarray) or frame.base is not None
            assert not frame.flags.writeable
            if len(held) < 12:
                held.append((frame, frame.copy()))
        assert type(_root(held[0][0])).__name__ == "Mapped", type(_root(held[0][0]))
    finally:
        src.close()
    for i, (view, copy) in enumerate(held):
        assert np.array_equal(view, copy), f"held frame {i} changed under its view"
    assert len({int(c.sum()) for _, c in held}) > 1


def test_a_view_holds_the_bytes_pygobjects_copy_holds(demo: DemoAssets, monkeypatch: pytest.MonkeyPatch) -> None:
    """The view of the mapped buffer and PyGObject's copy of it (the path where libgstreamer does not load
    through ctypes) are the same frames, value for value, on the demo video."""
    want = [f.copy() for f in _frames(gst.open_gst(f"file://{demo.video}", "views", 200, "auto", 10.0))]
    monkeypatch.setattr(gst, "libgst", lambda: None)
    got = _frames(gst.open_gst(f"file://{demo.video}", "copies", 200, "auto", 10.0))
    assert len(want) == len(got) == 300
    assert not any(type(_root(f)).__name__ == "Mapped" for f in got)
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert np.array_equal(a, b), f"frame {i}"
