"""The encoded ring (daemon/capture/encoded.py), the MP4 writer (daemon/record/mux.py) and the encoder path
(daemon/capture/gstreamer/encode.py): real GStreamer encoders and muxers, the real demo video, MP4s read back by
GStreamer's own discoverer and decoded by OpenCV, their first frame held against the source frame of its time.
The RTSP path (the camera's own packets, no re-encode) is in test_record_rtsp.py."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edged.daemon.capture.camera import Camera
from edged.daemon.capture.encoded import EncodedRing, Packet, ring_for
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.gstreamer.encode import encoder_check, pick_encoder
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import CameraConfig
from edged.daemon.config.cameras import RecordConfig
from edged.daemon.record.mux import write_mp4
from edged.errors import RecordError
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec

from .conftest import wait_until

SPEC = InputSpec(name="x", shape=[1, 256, 256, 3], layout="NHWC")
DEMO_FPS = 15.0
needs_gst = pytest.mark.skipif(not gst.available(), reason=f"GStreamer: {gst.why_unavailable()}")
needs_encoder = pytest.mark.skipif(pick_encoder()[0] is None, reason=f"recording: {pick_encoder()[1]}")


def pk(wall: float, key: bool, size: int = 100) -> Packet:
    return Packet(wall, int(wall * 1e9), int(1e9 / 10), key, bytes(size))


# --- the ring as a data structure -------------------------------------------------------------------------


def test_ring_span_starts_on_the_keyframe_at_or_before_the_start() -> None:
    ring = EncodedRing(1 << 20, 100.0)
    ring.new_segment("video/x-h264")
    for i in range(50):  # 10 packets a second, a keyframe every second
        ring.add(pk(100 + i / 10, key=i % 10 == 0))
    caps, got = ring.span(102.35, 103.5)
    assert caps == "video/x-h264"
    assert got[0].key and got[0].wall == pytest.approx(102.0)
    assert got[-1].wall == pytest.approx(103.5) and len(got) == 16
    _, exact = ring.span(103.0, 103.0)  # a keyframe at the very start: it, and only it
    assert [p.wall for p in exact] == [pytest.approx(103.0)]
    _, before = ring.span(50.0, 100.25)  # nothing kept that old: from the oldest keyframe
    assert before[0].wall == pytest.approx(100.0) and len(before) == 3
    assert ring.span(10.0, 20.0)[1] == []  # ended before anything kept
    assert ring.span(104.95, 200.0)[1][0].wall == pytest.approx(104.0)
    assert ring.newest_wall() == pytest.approx(104.9)
    with pytest.raises(ValueError, match="ends before it starts"):
        ring.span(2.0, 1.0)


def test_ring_bounds_by_bytes_and_seconds_evicting_the_oldest_counted() -> None:
    ring = EncodedRing(10_000, 1000.0)
    ring.new_segment("video/x-h264")
    for i in range(200):
        ring.add(pk(i / 10, key=i % 10 == 0, size=500 if i % 10 else 1500))
        assert ring.bytes <= 10_000
    st = ring.stats()
    assert st["bytes"] <= 10_000 and st["evicted"] > 150 and st["added"] == 200
    assert st["evicted_bytes"] + st["bytes"] == sum(1500 if i % 10 == 0 else 500 for i in range(200))
    _, kept = ring.span(0, 1e9)
    assert kept[0].key  # what cannot start a clip went first
    assert ring.oldest_wall() == kept[0].wall
    by_time = EncodedRing(1 << 30, 2.0)
    by_time.new_segment("video/x-h264")
    for i in range(100):
        by_time.add(pk(i / 10, key=i % 10 == 0))
    assert by_time.stats()["span_s"] <= 2.0 and by_time.evicted > 70
    big = EncodedRing(1000, 10.0)
    big.new_segment("video/x-h264")
    big.add(pk(1.0, True, size=2000))  # larger than the whole ring: refused, counted, nothing evicted for it
    assert big.refused == 1 and big.stats()["packets"] == 0


def test_ring_segments_never_mix_and_packets_wait_for_caps() -> None:
    ring = EncodedRing(1 << 20, 100.0)
    ring.add(pk(1.0, True))
    assert ring.refused == 1  # no caps yet: a packet the muxer could not read
    ring.new_segment("video/x-h264,width=8")
    for i in range(20):
        ring.add(pk(10 + i / 10, key=i % 10 == 0))
    ring.new_segment("video/x-h264,width=8")  # a reopen with the same caps: timestamps may restart
    assert ring.segment == 2 and ring.span(0, 1e9)[1] == []
    ring.add(pk(20.0, True))
    ring.set_caps("video/x-h264,width=8")  # the same caps again: nothing changes
    assert ring.segment == 2 and len(ring.span(0, 1e9)[1]) == 1
    ring.set_caps("video/x-h264,width=16")  # caps changed within an open: a new segment
    assert ring.segment == 3 and ring.span(0, 1e9)[1] == []
    cfg = RecordConfig(pre_s=4, post_s=6, max_clip_s=60, ring_mb=2)
    made = ring_for(cfg)
    assert made.max_bytes == 2 * 1024 * 1024 and made.max_s >= 4 + 60 + 6


# --- real H.264 from the demo video --------------------------------------------------------------------------


def source_thumbs(video: Path) -> np.ndarray:
    """Every frame of `video`, grey and 96 x 54, for finding which one a clip's frame is."""
    cap = cv2.VideoCapture(str(video))
    thumbs = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        thumbs.append(thumb(frame))
    cap.release()
    return np.array(thumbs, np.float32)


def thumb(frame: np.ndarray) -> np.ndarray:
    """Grey, 96 x 54, its mean taken away: the two decoders' colour conversions (GStreamer's, which the camera
    read the frame with, and FFmpeg's, which OpenCV reads the clip with) differ by a level or two of brightness."""
    small = cv2.resize(cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY), (96, 54), interpolation=cv2.INTER_AREA)
    small = small.astype(np.float32)
    out: np.ndarray = small - small.mean()
    return out


def source_frame(video: Path, index: int) -> np.ndarray:
    cap = cv2.VideoCapture(str(video))
    cap.set(cv2.CAP_PROP_POS_FRAMES, index)
    ok, frame = cap.read()
    cap.release()
    assert ok, f"frame {index} of {video}"
    return frame


def first_frame(mp4: Path) -> np.ndarray:
    cap = cv2.VideoCapture(str(mp4))
    ok, frame = cap.read()
    cap.release()
    assert ok, f"{mp4}: its first frame does not decode"
    return frame


def discover(mp4: Path) -> tuple[float, str, tuple[int, int]]:
    """(duration in s, codec description, (width, height)) as GStreamer's discoverer (gst-discoverer-1.0's
    library) reads the file; fails the test when it is no valid media file."""
    with warnings.catch_warnings():  # gi's importer predates exec_module (an ImportWarning on 3.11)
        warnings.simplefilter("ignore", ImportWarning)
        import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

        gi.require_version("GstPbutils", "1.0")
        from gi.repository import GstPbutils  # type: ignore[import-untyped,import-not-found,unused-ignore]

    g, _ = gst.modules()
    info = GstPbutils.Discoverer.new(20 * g.SECOND).discover_uri(mp4.resolve().as_uri())
    assert info.get_result() == GstPbutils.DiscovererResult.OK, f"{mp4}: {info.get_result()}"
    (video,) = info.get_video_streams()
    codec = GstPbutils.pb_utils_get_codec_description(video.get_caps())
    assert "quicktime" in info.get_stream_info().get_caps().to_string()  # an MP4 (ISO/QuickTime) container
    return info.get_duration() / 1e9, codec, (video.get_width(), video.get_height())


def matches_source(mp4: Path, video: Path, thumbs: np.ndarray) -> tuple[int, float]:
    """(the source frame the clip's first frame is, the mean absolute difference to it at full size), with the
    check that it is that frame and no other: frames 1 s away differ far more."""
    clip = first_frame(mp4)
    diffs = np.abs(thumbs - thumb(clip)).mean(axis=(1, 2))
    index = int(np.argmin(diffs))
    src = source_frame(video, index)
    assert clip.shape == src.shape
    mad = float(np.abs(clip.astype(np.float32) - src.astype(np.float32)).mean())
    away = [diffs[j] for j in (index - 15, index + 15) if 0 <= j < len(diffs)]
    assert min(away) > 2 * diffs[index], f"frame {index} is not told apart from its neighbours: {diffs}"
    return index, mad


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


class Taker:
    """Takes frames as inference would, and records each one's (frame number, wall time)."""

    def __init__(self, cam: Camera, cond: threading.Condition, stop: threading.Event) -> None:
        self.cam, self.cond, self.stop = cam, cond, stop
        self.frames: list[tuple[int, float]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.cond:
                got = self.cam.take_locked()
                if got:
                    self.frames.append((got[1].frame, got[1].captured_at))
                    self.cam.release_locked(got[0])
                self.cond.wait(0.02)

    def frame_at(self, wall: float) -> float:
        """The file's frame read at `wall`: the taken frame nearest in time, and the frames since at the file's
        rate (a file camera's FrameMeta.frame is its index in the file; an encoded frame's packet carries the
        very wall time of the frame it holds, so a frame that was taken is found exactly)."""
        n, at = min(self.frames, key=lambda f: abs(f[1] - wall))
        return n + (wall - at) * DEMO_FPS


def recording_camera(uri: str, cond: threading.Condition, stop: threading.Event, **record: Any) -> Camera:
    cfg = CameraConfig.model_validate({"name": "rec", "uri": uri, "record": record})
    cam = Camera(cfg, Preprocessor(SPEC), cond, stop)
    cam.start()
    return cam


def check_clip(
    cam: Camera,
    frame_of: Callable[[Packet], float],
    video: Path,
    thumbs: np.ndarray,
    tmp: Path,
    start: float,
    end: float,
) -> None:
    """span(start, end) of the camera's ring -> an MP4 that is valid, covers the span within one keyframe
    interval, and whose first frame is the source frame of its time (`frame_of` its first packet, in frames of
    the source video, within two frames)."""
    ring = cam.ring
    assert ring is not None
    caps, packets = ring.span(start, end)
    assert packets and packets[0].key and caps.startswith("video/x-h264")
    keys = [p.wall for p in ring.span(0, 1e12)[1] if p.key]
    interval = max(np.diff(keys)) if len(keys) > 1 else 10.0
    clip = write_mp4(caps, packets, tmp / "clip.mp4")
    assert not (tmp / "clip.mp4.part").exists() and clip.path.stat().st_size == clip.bytes
    duration, codec, size = discover(clip.path)
    assert codec.startswith("H.264") and size == (960, 540)
    assert duration == pytest.approx(clip.duration_s, abs=0.15)
    # the clip covers [start, end]: it begins at most one keyframe interval before start, ends within a frame
    assert start - interval - 0.1 <= clip.start_wall <= start + 0.1
    assert clip.start_wall + duration >= end - 0.2
    index, mad = matches_source(clip.path, video, thumbs)
    assert mad < 8.0, f"the clip's first frame differs from source frame {index} by {mad:.1f} grey levels"
    # and it is the frame of its time, within two frames
    expected = frame_of(packets[0])
    assert abs(index - expected) <= 2.0, f"the clip starts at source frame {index}, its time says {expected:.1f}"


@needs_gst
@needs_encoder
def test_a_file_camera_is_encoded_into_the_ring_and_its_clip_is_its_frames(
    demo: DemoAssets, tmp_path: Path, rig: tuple[threading.Condition, threading.Event]
) -> None:
    cond, stop = rig
    thumbs = source_thumbs(demo.video)
    cam = recording_camera(f"file://{demo.video}", cond, stop, ring_mb=64)
    taker = Taker(cam, cond, stop)
    ring = cam.ring
    assert ring is not None and cam.record_why == ""
    wait_until(lambda: (ring.newest_wall() or 0) - (ring.oldest_wall() or 1e12) > 6.0, 60, "6 s of packets")
    best = pick_encoder()[0]
    # the best encoder present (x264enc here), fed by the decoder itself (full size, every frame)
    assert best is not None and cam.record_path == f"{best.name} (decoded frames)"
    st = ring.stats()
    assert st["keyframes"] >= 4 and st["packets"] > 3 * st["keyframes"]  # keyframes about every second, deltas
    keys = [p.wall for p in ring.span(0, 1e12)[1] if p.key]
    assert 0.5 < float(np.median(np.diff(keys))) < 2.5
    # the decoder's frames keep the file's timestamps: a packet's frame is its pts at the file's rate, and its
    # wall time is when the camera read that frame (within a few frames: the decoder runs a little ahead)
    packets = ring.span(0, 1e12)[1]
    frames = [p.pts_ns / 1e9 * DEMO_FPS for p in packets]
    assert all(abs(f - round(f)) < 0.01 for f in frames) and len(set(map(round, frames))) == len(frames)
    lag = [taker.frame_at(p.wall) - f for p, f in zip(packets, frames, strict=True)]
    assert abs(float(np.median(lag))) < 5.0
    t0 = ring.oldest_wall() or 0.0
    check_clip(cam, lambda p: p.pts_ns / 1e9 * DEMO_FPS, demo.video, thumbs, tmp_path, t0 + 2.5, t0 + 5.0)


@needs_gst
def test_no_such_encoder_leaves_the_ring_none_with_the_reason(
    demo: DemoAssets, rig: tuple[threading.Condition, threading.Event]
) -> None:
    cond, stop = rig
    if pick_encoder("nvv4l2h264enc")[0] is not None:
        pytest.skip("this machine has the Jetson encoder")
    cam = recording_camera(f"file://{demo.video}", cond, stop, encoder="nvv4l2h264enc")
    taker = Taker(cam, cond, stop)
    wait_until(lambda: cam.ring is None, 30, "the ring given up")
    assert "nvv4l2h264enc is not installed" in cam.record_why and "nvidia-l4t-gstreamer" in cam.record_why
    wait_until(lambda: len(taker.frames) > 5, 30, "frames all the same")  # the camera itself runs on
    status, detail, fix = encoder_check(1)
    assert detail.startswith("clip encoder: ") and (status == "ok") == (pick_encoder()[0] is not None)
    assert status == "ok" or "gstreamer1.0-plugins-ugly" in fix


@needs_gst
@needs_encoder
def test_a_source_off_gstreamer_is_encoded_too_and_without_an_encoder_records_nothing_from_the_start(
    rig: tuple[threading.Condition, threading.Event],
) -> None:
    cond, stop = rig
    cam = recording_camera("synthetic://?width=320&height=240&fps=10", cond, stop)
    Taker(cam, cond, stop)
    ring = cam.ring
    assert ring is not None
    wait_until(lambda: ring.stats()["keyframes"] >= 2, 60, "two keyframes from the synthetic camera")
    caps, packets = ring.span(0, 1e12)
    assert "width=(int)320" in caps and "height=(int)240" in caps and packets[0].key
    if pick_encoder("nvv4l2h264enc")[0] is None:
        cfg = CameraConfig.model_validate(
            {"name": "none", "uri": "synthetic://", "record": {"encoder": "nvv4l2h264enc"}}
        )
        none = Camera(cfg, Preprocessor(SPEC), cond, stop)  # not started: known before any open
        assert none.ring is None and "nvv4l2h264enc is not installed" in none.record_why


@needs_gst
@needs_encoder
def test_a_loop_reopens_into_a_new_segment(demo: DemoAssets, rig: tuple[threading.Condition, threading.Event]) -> None:
    cond, stop = rig
    cam = CameraConfig.model_validate(
        {"name": "rec", "uri": f"file://{demo.video}", "loop": True, "realtime": False, "record": {}}
    )
    camera = Camera(cam, Preprocessor(SPEC), cond, stop)
    camera.start()
    taker = Taker(camera, cond, stop)
    wait_until(lambda: camera.ring is not None and camera.ring.segment >= 2, 120, "a second segment (a loop)")
    assert camera.ring is not None
    _, packets = camera.ring.span(0, 1e12)
    assert all(p.pts_ns >= 0 for p in packets) and len(taker.frames) > 300


def encoded_packets(video: Path, encoder: str, caps: str, frames: int) -> tuple[str, list[Packet]]:
    """The first `frames` frames of `video` encoded by `encoder` into packets as a ring holds them, each
    packet's wall time its frame's time in the file (from 1000.0)."""
    g, _ = gst.modules()
    text = (
        f"filesrc location={video} ! qtdemux ! decodebin ! videoconvert ! video/x-raw,format=I420 ! {encoder} ! "
        f"{caps} ! appsink name=sink sync=false max-buffers={frames + 5}"
    )
    pipeline = g.parse_launch(text)
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(g.State.PLAYING)
    out: list[Packet] = []
    got_caps = ""
    while len(out) < frames and (sample := sink.try_pull_sample(30 * g.SECOND)) is not None:
        buf = sample.get_buffer()
        got_caps = sample.get_caps().to_string()
        key = not buf.has_flags(g.BufferFlags.DELTA_UNIT)
        out.append(Packet(0.0, int(buf.pts), int(buf.duration), key, buf.extract_dup(0, buf.get_size())))
    pipeline.set_state(g.State.NULL)
    base = out[0].pts_ns
    return got_caps, [Packet(1000.0 + (p.pts_ns - base) / 1e9, p.pts_ns, p.dur_ns, p.key, p.data) for p in out]


@needs_gst
@pytest.mark.skipif(not gst.has_element("x265enc"), reason="no x265enc (gstreamer1.0-plugins-bad)")
def test_h265_packets_become_an_mp4_of_their_frames(demo: DemoAssets, tmp_path: Path) -> None:
    enc = "x265enc tune=zerolatency speed-preset=ultrafast key-int-max=15 bitrate=3000 ! h265parse"
    caps, packets = encoded_packets(demo.video, enc, "video/x-h265,stream-format=hvc1,alignment=au", 45)
    ring = EncodedRing(64 << 20, 100.0)
    ring.new_segment(caps)
    for p in packets:
        ring.add(p)
    start = 1000.0 + 20 / DEMO_FPS  # frame 20: the clip starts on the keyframe before it, frame 15
    got_caps, span = ring.span(start, start + 1.0)
    clip = write_mp4(got_caps, span, tmp_path / "h265.mp4")
    assert clip.codec == "h265" and clip.start_wall == pytest.approx(1000.0 + 15 / DEMO_FPS, abs=1e-3)
    duration, codec, size = discover(clip.path)
    assert codec.startswith("H.265") and size == (960, 540)
    assert duration == pytest.approx(len(span) / DEMO_FPS, abs=0.1)
    index, mad = matches_source(clip.path, demo.video, source_thumbs(demo.video))
    assert index == 15 and mad < 8.0


# --- the writer's refusals -----------------------------------------------------------------------------------


def test_write_mp4_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    caps = "video/x-h264,stream-format=avc,alignment=au"
    with pytest.raises(RecordError, match="no packets"):
        write_mp4(caps, [], tmp_path / "a.mp4")
    with pytest.raises(RecordError, match="start on a keyframe"):
        write_mp4(caps, [pk(1.0, False)], tmp_path / "a.mp4")
    with pytest.raises(RecordError, match=r"only H\.264 and H\.265"):
        write_mp4("video/x-vp8", [pk(1.0, True)], tmp_path / "a.mp4")


@needs_gst
def test_write_mp4_of_garbage_raises_and_leaves_no_file(tmp_path: Path) -> None:
    caps = "video/x-h264,stream-format=byte-stream,alignment=au"
    junk = b"\x00\x00\x00\x01" + bytes(50)  # a start code and nothing a parser can read
    packets = [Packet(1.0 + i / 10, i * 100_000_000, 100_000_000, i == 0, junk) for i in range(5)]
    target = tmp_path / "bad.mp4"
    with pytest.raises(RecordError):
        write_mp4(caps, packets, target)
    assert not target.exists() and not (tmp_path / "bad.mp4.part").exists()
