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
from edged.models.demo import DemoAssets

from .conftest import wait_until
from .test_capture_gst import RtspServer
from .test_record_ring import DEMO_FPS, SPEC, Taker, check_clip, source_thumbs

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


def file_packets(video: Path) -> list[bytes]:
    """The H.264 access units of an MP4, as the camera's parser hands them to its decoder (avc, one AU each)."""
    g, _ = gst.modules()
    caps = "video/x-h264,stream-format=avc,alignment=au"
    pipeline = g.parse_launch(f"filesrc location={video} ! qtdemux ! h264parse ! {caps} ! appsink name=sink sync=false")
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
