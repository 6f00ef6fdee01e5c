"""Camera threads against real sources: files, a real MJPEG-over-HTTP camera process, synthetic."""

from __future__ import annotations

import collections
import itertools
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.daemon.capture.camera import Camera
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.capture.sources import _has_gstreamer, open_source
from edged.daemon.config import CameraConfig
from edged.errors import CaptureError
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec

from .conftest import free_port, wait_until

SPEC = InputSpec(name="x", shape=[1, 64, 64, 3], layout="NHWC")
HERE = Path(__file__).parent


class Consumer:
    """Takes frames from cameras as the inference thread would; records (camera, frame number)."""

    def __init__(self, cams: list[Camera], cond: threading.Condition, stop: threading.Event) -> None:
        self.cams, self.cond, self.stop = cams, cond, stop
        self.taken: list[tuple[str, int]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.cond:
                for c in self.cams:
                    got = c.take_locked()
                    if got:
                        self.taken.append((c.name, got[1].frame))
                        c.release_locked(got[0])
                self.cond.wait(0.05)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in list(self.taken) if n == name)


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


def camera(cfg: dict[str, object], cond: threading.Condition, stop: threading.Event) -> Camera:
    return Camera(CameraConfig.model_validate(cfg), Preprocessor(SPEC), cond, stop)


def test_file_camera_plays_every_frame_when_not_realtime(demo: DemoAssets, rig) -> None:
    cond, stop = rig
    cam = camera({"name": "f", "uri": f"file://{demo.video}", "realtime": False, "fps_max": 240}, cond, stop)
    consumer = Consumer([cam], cond, stop)
    cam.start()
    wait_until(lambda: cam.stats.state == "ended", 60, "the file to end")
    wait_until(lambda: consumer.count("f") == 300, 5, "every frame taken")
    assert [f for _, f in consumer.taken] == list(range(300)) and cam.stats.drops == 0


class CountingCondition(threading.Condition):
    """The shared condition, counting the waits on it by thread name."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: collections.Counter[str] = collections.Counter()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits[threading.current_thread().name] += 1
        return super().wait(timeout)


class CountingEvent(threading.Event):
    """A camera's taken-event, counting the waits on it that ran out (nobody set it in time)."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts = 0

    def wait(self, timeout: float | None = None) -> bool:
        got = super().wait(timeout)
        self.timeouts += not got
        return got


def test_a_file_camera_waits_for_its_frame_to_be_taken_without_the_shared_condition(demo: DemoAssets) -> None:
    """A file read faster than real time waits for its frame to be taken on its own event: the shared condition
    (notified at every frame any camera offers and every batch gathered) does not wake it. Two thousand
    notifications while it waits, the lock let go between them: not one wait of the camera's on the condition,
    no frame offered over the one not taken; a take wakes it at once (its wait is not left to run out), the next
    frames come in order; a stop while it waits ends its thread."""
    cond, stop = CountingCondition(), threading.Event()
    cam = camera({"name": "f", "uri": f"file://{demo.video}", "realtime": False}, cond, stop)
    cam._taken_evt = taken = CountingEvent()
    cam.start()
    try:

        def ready() -> bool:
            with cond:
                return cam.has_ready_locked()

        wait_until(ready, 30, "the first frame")
        wait_until(lambda: cam.in_call()[0] == "" and cam.stats.frames == 1, 10, "the camera to wait with frame 1 read")
        for _ in range(2000):  # what four cameras' offers and the gather thread's batches do to the condition
            with cond:
                cond.notify_all()
            time.sleep(0)  # the lock and the interpreter let go: a thread waiting on the condition would run
        assert cond.waits["camera-f"] == 0 and cam.stats.frames == 1 and cam.stats.drops == 0
        frames, timeouts = [], taken.timeouts
        for _ in range(30):  # taken as soon as offered: each take, not the wait's 0.1 s bound, lets the next come
            wait_until(ready, 10, "the next frame", step=0.001)
            with cond:
                got = cam.take_locked()
                assert got is not None
                frames.append(got[1].frame)
                cam.release_locked(got[0])
        assert frames == list(range(30)) and cam.stats.drops == 0
        assert taken.timeouts - timeouts < 10, f"{taken.timeouts - timeouts} of 30 waits ran out: takes do not wake it"
        wait_until(ready, 10, "frame 30, offered and not taken")
    finally:
        stop.set()
    cam.join(5)
    assert not cam._thread.is_alive() and cam.stats.state == "stopped"
    assert cond.waits["camera-f"] == 0


def test_a_file_cameras_clock_is_its_playing_time_across_loops_and_a_new_fps(rig, tmp_path: Path) -> None:
    """The motion gate's seconds for a file: each frame 1/fps after the last, across a loop, and across a reopen
    that finds a file at another rate (a rotated recording): never back, never a jump."""
    cond, stop = rig

    def write(path: Path, fps: int) -> None:
        out = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (64, 48))
        for k in range(10):
            out.write(np.full((48, 64, 3), 20 * k, np.uint8))
        out.release()

    video = tmp_path / "v.avi"
    write(video, 10)
    write(tmp_path / "next.avi", 30)
    cam = camera({"name": "f", "uri": f"file://{video}", "realtime": False, "loop": True, "fps_max": 240}, cond, stop)
    clocks: list[float] = []
    cam.start()
    while len(clocks) < 25:
        with cond:
            got = cam.take_locked()
            if got is None:
                cond.wait(0.05)
                continue
            clocks.append(got[1].clock_s)
            cam.release_locked(got[0])
        if len(clocks) == 1:  # the camera holds the 10 fps file open: the loop reopens the path at 30 fps
            (tmp_path / "next.avi").replace(video)
    steps = [round(b - a, 6) for a, b in itertools.pairwise(clocks)]
    assert steps == [0.1] * 10 + [round(1 / 30, 6)] * 14, steps


def test_realtime_file_with_fps_cap_and_slow_consumer_drops(demo: DemoAssets, rig) -> None:
    cond, stop = rig
    cam = camera({"name": "f", "uri": f"file://{demo.video}", "fps_max": 5}, cond, stop)
    cam.start()  # nobody takes frames: each new one replaces the last, counted as a drop
    wait_until(lambda: cam.stats.frames >= 1, 10, "the first frame")
    t0 = time.monotonic()
    wait_until(lambda: cam.stats.frames >= 11, 10, "ten more frames")
    took = time.monotonic() - t0
    s = cam.stats
    # ten frame intervals at 5 fps: 2 s, never faster (the cap), not much slower (a real-time file)
    assert s.state == "up" and 1.7 <= took <= 3.5 and s.drops == s.frames - 1, (took, s.frames, s.drops)


def test_a_camera_whose_open_raises_a_bug_retries_instead_of_dying(rig, caplog: pytest.LogCaptureFixture) -> None:
    """An exception that is not a CaptureError (a library bug, as PyGObject's first-use race was) ended the
    camera's thread for good: that camera never sent a result again. Now it is logged with its traceback,
    counted, and the camera retries with backoff."""
    from edged.daemon.capture.sources import SyntheticSource

    cond, stop = rig
    calls = itertools.count()

    def opener(_cfg: CameraConfig) -> SyntheticSource:
        n = next(calls)
        if n == 0:  # the camera's own refusal first: the bug after it still gets its traceback
            raise CaptureError("connection refused")
        if n < 3:
            raise AttributeError("type object 'PadProbeReturn' has no attribute 'OK'")
        return SyntheticSource(64, 48, 30)

    cfg = CameraConfig.model_validate({"name": "c", "uri": "synthetic://?fps=30", "reconnect_min_s": 0.05})
    cam = Camera(cfg, Preprocessor(SPEC), cond, stop, opener=opener)
    consumer = Consumer([cam], cond, stop)
    cam.start()
    wait_until(lambda: consumer.count("c") >= 5, 10, "frames after three failed opens")
    assert cam.stats.errors == 2 and cam.stats.reconnects == 1 and cam.stats.state == "up"
    assert "unexpected AttributeError opening it: type object 'PadProbeReturn' has no attribute 'OK'" in caplog.text
    assert caplog.text.count("Traceback") == 1, "once per streak, not at every retry"


def test_file_that_disappears_reconnects_while_another_camera_serves(demo: DemoAssets, rig, tmp_path: Path) -> None:
    cond, stop = rig
    video = tmp_path / "cam.mp4"
    shutil.copy(demo.video, video)
    flaky = camera(
        {
            "name": "flaky",
            "uri": f"file://{video}",
            "loop": True,
            "fps_max": 30,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 0.4,
        },
        cond,
        stop,
    )
    steady = camera({"name": "steady", "uri": "synthetic://?fps=20", "fps_max": 20}, cond, stop)
    consumer = Consumer([flaky, steady], cond, stop)
    flaky.start()
    steady.start()
    wait_until(lambda: consumer.count("flaky") > 10, 10, "frames from the file camera")
    video.unlink()  # the open file keeps playing to its end; the reopen for the loop then fails
    wait_until(lambda: flaky.stats.state == "down", 40, "the file camera to go down")
    assert "no such file" in flaky.stats.last_error
    before = consumer.count("steady")
    wait_until(lambda: consumer.count("steady") >= before + 10, 5, "the other camera to keep serving")
    assert flaky.stats.state == "down"
    shutil.copy(demo.video, video)
    wait_until(lambda: flaky.stats.state == "up" and flaky.stats.reconnects == 1, 10, "the file camera to reconnect")
    n = consumer.count("flaky")
    wait_until(lambda: consumer.count("flaky") > n + 5, 10, "frames after the reconnect")


def mjpeg_server(port: int, *args: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, str(HERE / "mjpeg_server.py"), str(port), *args])

    def listening() -> bool:
        if p.poll() is not None:
            raise AssertionError(f"mjpeg_server.py exited with {p.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_until(listening, 15, f"the MJPEG server on port {port}")
    return p


def test_network_camera_that_dies_reconnects_with_backoff(rig) -> None:
    cond, stop = rig
    port = free_port()
    server = mjpeg_server(port)
    try:
        cam = camera(
            {
                "name": "ip",
                "uri": f"http://127.0.0.1:{port}/stream.mjpg",
                "fps_max": 30,
                "stall_timeout_s": 2,
                "reconnect_min_s": 0.2,
                "reconnect_max_s": 1.0,
            },
            cond,
            stop,
        )
        steady = camera({"name": "steady", "uri": "synthetic://?fps=20", "fps_max": 20}, cond, stop)
        consumer = Consumer([cam, steady], cond, stop)
        cam.start()
        steady.start()
        wait_until(lambda: consumer.count("ip") > 10, 15, "frames from the network camera")
        server.kill()  # a real process killed with a real signal
        server.wait()
        wait_until(lambda: cam.stats.state == "down", 10, "the camera to notice")
        time.sleep(2.0)  # several failed attempts with backoff, not a tight loop
        before = consumer.count("steady")
        time.sleep(0.5)
        assert consumer.count("steady") > before
        server = mjpeg_server(port)
        wait_until(lambda: cam.stats.state == "up" and cam.stats.reconnects >= 1, 10, "reconnect")
        n = consumer.count("ip")
        wait_until(lambda: consumer.count("ip") > n + 10, 10, "frames after the reconnect")
    finally:
        server.kill()
        server.wait()


def test_stalled_network_camera_counts_a_stall(rig) -> None:
    cond, stop = rig
    port = free_port()
    server = mjpeg_server(port, "--hang-after", "20")
    try:
        cam = camera(
            {
                "name": "ip",
                "uri": f"http://127.0.0.1:{port}/s.mjpg",
                "stall_timeout_s": 1.5,
                "reconnect_min_s": 0.2,
                "reconnect_max_s": 0.5,
            },
            cond,
            stop,
        )
        Consumer([cam], cond, stop)
        cam.start()
        wait_until(lambda: cam.stats.stalls >= 1, 20, "a stall to be detected")
        wait_until(lambda: cam.stats.reconnects >= 1, 10, "a reconnect after the stall")
    finally:
        server.kill()
        server.wait()


def test_unsupported_sources_give_clear_errors(tmp_path: Path) -> None:
    """The OpenCV path (backend: opencv) as before; the GStreamer path in tests/test_capture_gst.py."""

    def cfg(uri: str) -> CameraConfig:
        return CameraConfig(name="c", uri=uri, backend="opencv")

    with pytest.raises(CaptureError, match="no such file"):
        open_source(cfg(f"file://{tmp_path}/none.mp4"))
    if not _has_gstreamer():
        with pytest.raises(CaptureError, match=r"built without GStreamer .*which csi:// needs"):
            open_source(cfg("csi://0"))
    with pytest.raises(CaptureError, match="bad synthetic parameters"):
        open_source(cfg("synthetic://?width=abc"))
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    with pytest.raises(CaptureError, match="cannot open"):
        open_source(cfg(f"file://{tmp_path}/junk.mp4"))


def test_mjpeg_parts_without_a_length_and_a_new_size_mid_stream(rig) -> None:
    """Parts that end at the next boundary (no Content-Length) are read too, and a frame of a new size
    gets its own transform: the size the results carry and the boxes map back to."""
    cond, stop = rig
    port = free_port()
    server = mjpeg_server(port, "--no-length", "--switch-after", "10", "--pad-to", "400x400", "--fps", "30")
    sizes: list[tuple[int, int]] = []
    try:
        cam = camera({"name": "ip", "uri": f"http://127.0.0.1:{port}/s.mjpg", "fps_max": 30}, cond, stop)
        cam.start()

        def take() -> bool:
            with cond:
                got = cam.take_locked()
                if got:
                    t = got[1].transform
                    sizes.append((t.src_width, t.src_height))
                    cam.release_locked(got[0])
            return len(set(sizes)) == 2 and sizes[-1] == (400, 400)

        wait_until(take, 15, "frames of both sizes")
        assert cam.stats.state == "up" and cam.stats.reconnects == 0, "read across the change, no reopen"
    finally:
        server.kill()
        server.wait()
    assert sizes[0] == (320, 240)


def test_uri_rules_and_the_pipelines_they_make() -> None:
    """URI parsing shared by both paths, and the GStreamer pipeline text (no GStreamer needed)."""
    from edged.daemon.capture.registry import plan
    from edged.daemon.capture.uri import csi_options, file_path, v4l2_options

    assert file_path("file://localhost/srv/a%20b.mp4") == Path("/srv/a b.mp4")
    assert file_path("file:///srv/c%23d.mp4") == Path("/srv/c#d.mp4")
    with pytest.raises(CaptureError, match="only local files"):
        file_path("file://nas/srv/x.mp4")
    assert v4l2_options("v4l2://0").device == "/dev/video0"
    assert v4l2_options("v4l2:///dev/video2").device == "/dev/video2"
    o = v4l2_options("v4l2:///dev/video1?width=1280&height=720&fps=30&format=mjpg")
    assert (o.width, o.height, o.fps, o.format) == (1280, 720, 30, "MJPG")
    with pytest.raises(CaptureError, match="fps='x': want a whole number"):
        v4l2_options("v4l2://0?fps=x")
    with pytest.raises(CaptureError, match="format=H264: one of MJPG"):
        v4l2_options("v4l2://0?format=h264")
    c = csi_options("csi://1?width=1920&height=1080&fps=30&sensor_mode=2")
    assert (c.sensor_id, c.width, c.height, c.fps, c.sensor_mode) == (1, 1920, 1080, 30, 2)

    mj = plan("v4l2://0?width=1280&height=720&fps=30&format=MJPG", set(), 200, "auto", 5)
    assert mj.description.startswith("v4l2src name=src ! image/jpeg,width=1280,height=720,framerate=30/1 ! decodebin")
    assert mj.props == {"device": "/dev/video0"} and "videoscale name=scaler" in mj.description
    yuyv = plan("v4l2://0?format=YUYV", set(), 200, "auto", 5)
    assert "video/x-raw,format=YUY2 ! decodebin" in yuyv.description
    rtsp = plan("rtsp://u:p@cam/s", set(), 100, "tcp", 5)
    assert "u:p" not in rtsp.description and rtsp.props["location"] == "rtsp://u:p@cam/s"
    assert rtsp.props["protocols"] == "tcp" and rtsp.props["latency"] == 100
    with pytest.raises(CaptureError, match="needs GStreamer's nvarguscamerasrc"):
        plan("csi://0", set(), 200, "auto", 5)
    csi = plan("csi://0?width=1920&height=1080&fps=30", {"nvarguscamerasrc", "nvvidconv"}, 200, "auto", 5)
    assert "video/x-raw(memory:NVMM),width=1920,height=1080,framerate=30/1 ! nvvidconv name=scaler" in csi.description
    assert not plan(f"file://localhost{HERE}/x.mp4", set(), 200, "auto", 5).live, "a file keeps every frame"
