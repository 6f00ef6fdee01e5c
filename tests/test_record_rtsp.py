"""Recording an RTSP camera: a real gst-rtsp-server (tests/rtsp_server.py) sends the demo video as H.264; the
camera's own packets, taken after the parser and before the decoder (capture/gstreamer/tap.py), fill its ring
with no re-encode (the ring holds the very bytes of the served file); a span of it becomes an MP4 that GStreamer's
discoverer reads, that covers the asked range within one keyframe interval and whose first frame is the source
frame of its time; the ring's byte bound holds; a server restart gives a new segment."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edged.daemon.capture.camera import Camera
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.gstreamer.tap import EARLY_MAX
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.capture.sources import open_source
from edged.daemon.config import CameraConfig
from edged.daemon.record.mux import write_mp4
from edged.models.demo import DemoAssets

from .conftest import wait_until
from .test_capture_gst import RtspServer
from .test_record_ring import DEMO_FPS, SPEC, Taker, check_clip, discover, matches_source, source_thumbs

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer: {gst.why_unavailable()}")

KEY_EVERY = 15  # frames: the served file has a keyframe every second (15 fps)


@pytest.fixture(scope="module")
def h264_1s(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo video as an MP4 of H.264 with a keyframe every second, as an IP camera sends it."""
    out = tmp_path_factory.mktemp("rec") / "demo.h264.mp4"
    enc = f"openh264enc complexity=low bitrate=2000000 gop-size={KEY_EVERY} rate-control=bitrate"
    text = f"filesrc location={demo.video} ! qtdemux ! decodebin ! videoconvert ! {enc} ! h264parse ! mp4mux"
    subprocess.run(["gst-launch-1.0", "-q", *text.split(), "!", "filesink", f"location={out}"], check=True, timeout=120)
    return out


def file_packets(video: Path, caps: str = "video/x-h264,stream-format=avc,alignment=au") -> list[bytes]:
    """The access units of an MP4, as the camera's parser hands them to its decoder (`caps`: H.264 as avc, one
    AU each, unless told otherwise)."""
    g, _ = gst.modules()
    parser = "h265parse" if caps.startswith("video/x-h265") else "h264parse"
    pipeline = g.parse_launch(f"filesrc location={video} ! qtdemux ! {parser} ! {caps} ! appsink name=sink sync=false")
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(g.State.PLAYING)
    out = []
    while (sample := sink.try_pull_sample(5 * g.SECOND)) is not None:
        buf = sample.get_buffer()
        out.append(buf.extract_dup(0, buf.get_size()))
    pipeline.set_state(g.State.NULL)
    return out


@pytest.fixture
def server(h264_1s: Path) -> Iterator[RtspServer]:
    s = RtspServer(h264_1s, "--h264", "--protocols", "tcp")
    yield s
    s.stop()


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


def rtsp_camera(
    server: RtspServer, name: str, cond: threading.Condition, stop: threading.Event, **rec: float
) -> Camera:
    cfg = {"name": name, "uri": server.uri(), "record": rec, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0}
    cam = Camera(CameraConfig.model_validate(cfg), Preprocessor(SPEC), cond, stop)
    cam.start()
    return cam


def test_rtsp_packets_fill_the_ring_as_sent_and_a_clip_of_them_is_the_source(
    demo: DemoAssets,
    h264_1s: Path,
    server: RtspServer,
    tmp_path: Path,
    rig: tuple[threading.Condition, threading.Event],
) -> None:
    cond, stop = rig
    thumbs = source_thumbs(demo.video)
    cam = rtsp_camera(server, "rec", cond, stop)
    small = rtsp_camera(server, "small", cond, stop, ring_mb=0.4)  # a second client: 1.6 s at 2 Mbit/s
    Taker(cam, cond, stop)
    Taker(small, cond, stop)
    ring = cam.ring
    assert ring is not None
    wait_until(lambda: (ring.newest_wall() or 0) - (ring.oldest_wall() or 1e12) > 6.5, 60, "6.5 s of packets")
    assert cam.record_path == "camera's own h264" and cam.record_why == ""
    caps, packets = ring.span(0, 1e12)
    assert "stream-format=(string)avc" in caps and "codec_data" in caps
    keys = [p for p in packets if p.key]
    assert len(keys) >= 5 and len(packets) > 5 * len(keys)
    # no re-encode: the ring's frames are the served file's own access units, byte for byte (a keyframe's
    # SPS/PPS may travel in the caps' codec_data instead of in front of it)
    sent = file_packets(h264_1s)
    deltas = [p.data for p in packets if not p.key]
    assert all(d in set(sent) for d in deltas)
    assert all(any(s.endswith(k.data) for s in sent) for k in keys)
    # the served stream starts at the file's frame 0 for each client: a packet's frame is its time since the
    # segment's first packet (nothing evicted yet), at the file's rate
    assert packets[0].key and ring.evicted == 0
    first_pts = packets[0].pts_ns
    t0 = packets[0].wall
    check_clip(cam, lambda p: (p.pts_ns - first_pts) / 1e9 * DEMO_FPS, demo.video, thumbs, tmp_path, t0 + 2.5, t0 + 6.0)
    # the tiny ring: its byte bound held all along, by evicting the oldest packets (counted)
    tiny = small.ring
    assert tiny is not None
    st = tiny.stats()
    assert 0 < st["bytes"] <= 0.4 * 1024 * 1024 and st["evicted"] > 0
    assert st["segment"] == 1 and st["added"] == st["packets"] + st["evicted"]
    _, kept = tiny.span(0, 1e12)
    assert kept and kept[0].key


def test_a_reconnect_starts_a_new_segment_that_no_span_crosses(
    server: RtspServer, rig: tuple[threading.Condition, threading.Event]
) -> None:
    cond, stop = rig
    cam = rtsp_camera(server, "rec", cond, stop)
    Taker(cam, cond, stop)
    ring = cam.ring
    assert ring is not None
    wait_until(lambda: ring.stats()["keyframes"] >= 2, 60, "two keyframes")
    first = ring.segment
    server.stop()
    restarted = time.time()
    server.start()
    wait_until(lambda: ring.segment > first and ring.stats()["keyframes"] >= 1, 60, "packets of a new segment")
    wait_until(lambda: ring.stats()["packets"] > 20, 30, "packets of the new segment")
    _, packets = ring.span(restarted - 60, time.time())
    assert packets and packets[0].key and all(p.wall >= restarted for p in packets)
    pts = [p.pts_ns for p in packets]
    assert np.all(np.diff(pts) > 0)  # one segment: its timestamps only go forward


def test_a_camera_that_records_nothing_lets_go_of_the_tap(server: RtspServer) -> None:
    """The pipeline taps every parser it meets (the ring is attached after the open); a camera without
    ``record:`` never attaches, and the tap removes its probe after EARLY_MAX packets: no cost after that."""
    source = open_source(CameraConfig(name="plain", uri=server.uri()))
    try:
        tap = getattr(source, "tap", None)
        assert tap is not None and tap.codec == "h264"
        for _ in range(EARLY_MAX + 30):  # 15 fps: 6 s
            assert source.read() is not None
        assert tap.packets == EARLY_MAX  # the probe saw that many packets, then was gone
        raw = getattr(source, "raw_tap", None)  # and the decoded frames' tap likewise
        assert raw is not None and raw.frames == EARLY_MAX
    finally:
        source.close()


# --- an H.265 camera --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h265_1s(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo video as an MP4 of H.265 with a keyframe every second (no B-frames, as IP cameras send it)."""
    if not gst.has_element("x265enc"):
        pytest.skip("no x265enc (gstreamer1.0-plugins-bad)")
    out = tmp_path_factory.mktemp("rec265") / "demo.h265.mp4"
    enc = f"x265enc tune=zerolatency speed-preset=ultrafast bitrate=2000 key-int-max={KEY_EVERY}"
    text = f"filesrc location={demo.video} ! qtdemux ! decodebin ! videoconvert ! {enc} ! h265parse ! mp4mux"
    subprocess.run(["gst-launch-1.0", "-q", *text.split(), "!", "filesink", f"location={out}"], check=True, timeout=180)
    return out


def test_an_h265_cameras_own_packets_fill_the_ring_and_a_clip_of_them_decodes(
    demo: DemoAssets, h265_1s: Path, tmp_path: Path, rig: tuple[threading.Condition, threading.Event]
) -> None:
    """The same over an H.265 camera (rtph265pay): h265parse's packets, byte for byte the served file's access
    units, no re-encode; a span of them is an H.265 MP4 that the discoverer reads and whose first frame is the
    source frame of its time."""
    server = RtspServer(h265_1s, "--h265", "--protocols", "tcp")
    try:
        cond, stop = rig
        cam = rtsp_camera(server, "rec265", cond, stop)
        Taker(cam, cond, stop)
        ring = cam.ring
        assert ring is not None
        wait_until(lambda: (ring.newest_wall() or 0) - (ring.oldest_wall() or 1e12) > 4.5, 60, "4.5 s of packets")
        assert cam.record_path == "camera's own h265" and cam.record_why == "", (cam.record_path, cam.record_why)
        caps, packets = ring.span(0, 1e12)
    finally:
        server.stop()
    assert caps.startswith("video/x-h265") and "alignment=(string)au" in caps, caps
    keys = [p for p in packets if p.key]
    assert packets[0].key and ring.evicted == 0
    assert len(keys) >= 4 and len(packets) > 4 * len(keys), (len(keys), len(packets))
    # no re-encode: the ring's packets are the served file's access units, as the parser hands them on (in the
    # stream format the camera's parser negotiated; a keyframe's VPS/SPS/PPS may travel in front of it, or in the
    # caps' codec_data)
    fmt = caps.split("stream-format=(string)")[1].split(",")[0]
    sent = file_packets(h265_1s, f"video/x-h265,stream-format={fmt},alignment=au")
    deltas = [p.data for p in packets if not p.key]
    assert deltas and all(d in set(sent) for d in deltas)
    assert all(any(s.endswith(k.data) or k.data.endswith(s) for s in sent) for k in keys)
    # a span 1.5 s .. 4 s in: an H.265 MP4 of the camera's packets, from the keyframe at or before its start
    t0, first_pts = packets[0].wall, packets[0].pts_ns
    start, end = t0 + 1.5, t0 + 4.0
    got_caps, span = ring.span(start, end)
    clip = write_mp4(got_caps, span, tmp_path / "h265.mp4")
    assert clip.codec == "h265" and not (tmp_path / "h265.mp4.part").exists()
    duration, codec, size = discover(clip.path)
    assert codec.startswith("H.265") and size == (960, 540), (codec, size)
    assert duration == pytest.approx(clip.duration_s, abs=0.15)
    assert start - KEY_EVERY / DEMO_FPS - 0.1 <= clip.start_wall <= start + 0.1
    assert clip.start_wall + duration >= end - 0.2
    index, mad = matches_source(clip.path, demo.video, source_thumbs(demo.video))
    expected = (span[0].pts_ns - first_pts) / 1e9 * DEMO_FPS  # each client's stream starts at the file's frame 0
    assert mad < 8.0 and abs(index - expected) <= 2.0, (index, expected, mad)
