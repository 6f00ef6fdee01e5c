"""The GStreamer capture path against real GStreamer and a real RTSP server (gst-rtsp-server in a
helper process, tests/rtsp_server.py). Skipped, with the reason, where PyGObject/GStreamer is not
installed; scripts/setup.sh installs them, so CI runs these."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.capture import uri as gstpipe
from edged.daemon.capture.camera import Camera, join_all, open_source
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.capture.probe import check_camera
from edged.daemon.config import CameraConfig
from edged.errors import CaptureError
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec

from .conftest import base_config, edged_cli, free_port, wait_until, write_config
from .test_capture import Consumer

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer capture path: {gst.why_unavailable()}")

HERE = Path(__file__).parent
SPEC = InputSpec(name="x", shape=[1, 256, 256, 3], layout="NHWC")
BGR = "video/x-raw,format=BGR"
PASSWORD = "s3cr#t!"  # percent-encoded in the URI


class RtspServer:
    def __init__(self, video: Path, *args: str) -> None:
        self.port = free_port()
        self.video, self.args = video, args
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "rtsp_server.py"), str(self.port), str(self.video), *self.args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"rtsp_server.py: {line!r}, exit {self.proc.poll()}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def uri(self, user: str = "", password: str = "") -> str:
        cred = f"{user}:{password.replace('#', '%23').replace('!', '%21')}@" if user else ""
        return f"rtsp://{cred}127.0.0.1:{self.port}/cam"


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


@pytest.fixture(scope="module")
def h264_video(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo video encoded to H.264 once, for servers with several clients: each client gets its own
    pipeline that only sends the file (cheap), not a shared one (gst-rtsp-server 1.22 can abort in
    gst_rtsp_media_get_rates when several clients join a shared media at once, which killed the camera
    these tests need)."""
    out = tmp_path_factory.mktemp("h264") / "demo.h264.mp4"
    encode = ["openh264enc", "complexity=low", "bitrate=2000000", "!", "h264parse", "!", "mp4mux"]
    pipeline = [f"location={demo.video}", "!", "qtdemux", "!", "decodebin", "!", "videoconvert", "!", *encode]
    cmd = ["gst-launch-1.0", "-q", "filesrc", *pipeline, "!", "filesink", f"location={out}"]
    subprocess.run(cmd, check=True, timeout=120)  # a fixture: pytest-timeout covers test bodies only
    return out


@pytest.fixture
def servers(demo: DemoAssets) -> Iterator[list[RtspServer]]:
    made: list[RtspServer] = []
    yield made
    for s in made:
        s.stop()


def camera(cfg: dict[str, Any], cond: threading.Condition, stop: threading.Event) -> Camera:
    return Camera(CameraConfig.model_validate(cfg), Preprocessor(SPEC), cond, stop)


def taken_sizes(cam: Camera, cond: threading.Condition, n: int, timeout: float) -> list[tuple[int, int]]:
    sizes: list[tuple[int, int]] = []

    def take() -> bool:
        with cond:
            got = cam.take_locked()
            if got:
                t = got[1].transform
                sizes.append((t.src_width, t.src_height))
                cam.release_locked(got[0])
        return len(sizes) >= n

    wait_until(take, timeout, f"{n} frames from {cam.name}")
    return sizes


# --- URIs and refusals ---------------------------------------------------------------------------
def test_file_uris_localhost_and_percent_encoding(demo: DemoAssets, tmp_path: Path) -> None:
    spaced = tmp_path / "a video #1.mp4"
    spaced.symlink_to(demo.video)
    for uri in (f"file://localhost{demo.video}", "file://" + str(spaced).replace(" ", "%20").replace("#", "%23")):
        for backend in ("gstreamer", "opencv"):
            cam = CameraConfig(name="c", uri=uri, backend=backend)
            assert check_camera(cam).startswith(backend)
            src = open_source(cam)
            frame = src.read()
            src.close()
            assert frame is not None and frame.shape == (540, 960, 3)
    with pytest.raises(CaptureError, match="only local files"):
        open_source(CameraConfig(name="c", uri=f"file://otherhost{demo.video}"))


def test_check_config_refusals(tmp_path: Path) -> None:
    def refused(uri: str, match: str) -> None:
        with pytest.raises(CaptureError, match=match):
            check_camera(CameraConfig(name="c", uri=uri))

    refused(f"file://{tmp_path}/none.mp4", "no such file")
    refused("v4l2://7", "no such device /dev/video7")  # v4l2://N is /dev/videoN
    refused("v4l2:///dev/video9?width=640&height=480&fps=30&format=MJPG", "no such device /dev/video9")
    refused("v4l2:///dev/video0?size=640", "unknown option")
    if not gst.has_element("nvarguscamerasrc"):
        refused("csi://0?width=1920&height=1080&fps=30", "needs GStreamer's nvarguscamerasrc")
    refused("gst://videotestsrc ! nosuchelement ! appsink", 'no element "nosuchelement"')
    refused("gst://videotestsrc ! fakesink", "must end in an appsink")
    with pytest.raises(CaptureError, match=r"can't handle caps video/x-raw, format=\(string\)NV12"):
        open_source(CameraConfig(name="c", uri=f"gst://videotestsrc ! video/x-raw,format=NV12 ! appsink caps={BGR}"))
    with pytest.raises(ValueError, match="rtsps://, http://, https://"):
        CameraConfig(name="c", uri="ftp://x/y")


def test_check_config_cli_probes_cameras(demo: DemoAssets, tmp_path: Path) -> None:
    cams = [
        {"name": "file", "uri": f"file://{demo.video}"},
        {"name": "test", "uri": "gst://videotestsrc ! video/x-raw,width=320,height=240,framerate=30/1 ! appsink"},
    ]
    doc = base_config(type("A", (), {"host": "127.0.0.1", "port": 1})(), demo, tmp_path, cams)
    cfg = write_config(tmp_path / "c.yaml", doc)
    r = edged_cli("check-config", "-c", str(cfg), "--no-model", "--probe-cameras")
    assert r.returncode == 0, r.stderr
    assert "probe: 960x540, 15.0 fps, video/mpeg; GStreamer" in r.stdout and "avdec_mpeg4 (software)" in r.stdout
    assert "probe: 320x240, 30.0 fps" in r.stdout
    doc["cameras"].append({"name": "gone", "uri": f"file://{tmp_path}/gone.mp4"})
    r = edged_cli("check-config", "-c", str(write_config(cfg, doc)), "--no-model")
    assert r.returncode == 1 and "no such file" in r.stderr


# --- pipelines feeding `edged run` ---------------------------------------------------------------
def test_videotestsrc_pipeline_feeds_the_daemon(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path) -> None:
    sub = subscribe(broker, "edged/#")
    pipe = "videotestsrc num-buffers=45 ! video/x-raw,width=640,height=480,framerate=15/1 ! videoconvert ! appsink"
    cams = [{"name": "test", "uri": f"gst://{pipe}", "backend": "gstreamer"}]
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams)), "--duration", "20")
    wait_until(lambda: len(sub.results()) >= 20, 60, "results from the videotestsrc camera")
    assert all(r["image"] == {"width": 640, "height": 480} for r in sub.results())
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0, d.output()[-2000:]
    assert "capture path GStreamer" in d.output()


def recall_through(backend: str, broker, subscribe, start_daemon, demo: DemoAssets, tmp: Path) -> float:
    from .test_daemon import score

    sub = subscribe(broker, "edged/#")
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "realtime": False, "backend": backend}]
    if backend == "gstreamer":
        cams[0]["scale_in_pipeline"] = True  # by default only a hardware scaler (nvvidconv) scales in the pipeline
    tmp.mkdir()
    d = start_daemon(write_config(tmp / "c.yaml", base_config(broker, demo, tmp, cams)))
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    results = sub.results()
    assert sorted(r["frame"] for r in results) == list(range(300)), "every frame of the file, once"
    assert all(r["image"] == {"width": 960, "height": 540} for r in results), "boxes in source pixels"
    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    recall, precision, _ = score(results, truth)
    print(f"\n{backend}: recall {recall:.3f} precision {precision:.3f}")
    assert precision >= 0.9
    return recall


def test_demo_faces_through_gstreamer_at_the_recall_of_opencv(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """filesrc ! decodebin ! videoscale (to the model's 256x144 inside the pipeline) against OpenCV's
    full-size decode and cv2.resize: every frame, boxes mapped back to 960x540, the same recall."""
    gst_recall = recall_through("gstreamer", broker, subscribe, start_daemon, demo, tmp_path / "g")
    cv_recall = recall_through("opencv", broker, subscribe, start_daemon, demo, tmp_path / "o")
    assert gst_recall >= 0.9 and abs(gst_recall - cv_recall) <= 0.02, (gst_recall, cv_recall)


# --- a real RTSP server ----------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_rtsp_over_tcp_and_udp(transport: str, demo: DemoAssets, servers, rig) -> None:
    servers.append(server := RtspServer(demo.video, "--protocols", transport))
    cond, stop = rig
    cam = camera({"name": "ip", "uri": server.uri(), "rtsp_transport": transport, "fps_max": 30}, cond, stop)
    cam.start()
    sizes = taken_sizes(cam, cond, 15, 30)
    assert set(sizes) == {(960, 540)} and cam.stats.state == "up"


def test_rtsp_server_restarted_mid_run_reconnects(demo: DemoAssets, servers, rig) -> None:
    servers.append(server := RtspServer(demo.video))
    cond, stop = rig
    cfg = {"name": "ip", "uri": server.uri(), "stall_timeout_s": 3, "reconnect_min_s": 0.2, "reconnect_max_s": 0.5}
    cam = camera(cfg, cond, stop)
    consumer = Consumer([cam], cond, stop)
    cam.start()
    wait_until(lambda: consumer.count("ip") > 10, 30, "frames over RTSP")
    server.stop()
    wait_until(lambda: cam.stats.state == "down", 10, "the camera to notice the server went away")
    assert cam.stats.last_error, "a reason"
    server.start()
    wait_until(lambda: cam.stats.state == "up" and cam.stats.reconnects >= 1, 30, "the reconnect")
    n = consumer.count("ip")
    wait_until(lambda: consumer.count("ip") > n + 10, 30, "frames after the reconnect")


def test_rtsp_wrong_password_is_a_clear_401_with_the_password_redacted(
    demo: DemoAssets, servers, rig, caplog: pytest.LogCaptureFixture
) -> None:
    servers.append(server := RtspServer(demo.video, "--user", "cam", "--password", PASSWORD))
    cond, stop = rig
    good = camera({"name": "good", "uri": server.uri("cam", PASSWORD)}, cond, stop)
    bad = camera({"name": "bad", "uri": server.uri("cam", "wr0ng#pw"), "reconnect_min_s": 0.5}, cond, stop)
    good.start()
    bad.start()
    wait_until(lambda: bad.stats.state == "down", 20, "the wrong password to be refused")
    assert bad.stats.last_error.startswith("rtsp://***@127.0.0.1:")
    assert "401 Unauthorized: wrong user or password" in bad.stats.last_error
    taken_sizes(good, cond, 5, 30)  # the right password gets frames
    for text in (bad.stats.last_error, caplog.text):
        assert "wr0ng" not in text and "s3cr" not in text and "%23" not in text


def test_hung_rtsp_server_is_a_stall_and_parallel_stop_is_prompt(h264_video: Path, servers, rig) -> None:
    """SIGSTOP: the server keeps its sockets and sends nothing. Each camera counts a stall within its
    stall_timeout_s; stopping three cameras stuck on it takes one short wait, not one each."""
    servers.append(server := RtspServer(h264_video, "--h264"))
    cond, stop = rig
    cams = [
        camera({"name": f"ip{i}", "uri": server.uri(), "stall_timeout_s": 2, "reconnect_min_s": 0.2}, cond, stop)
        for i in range(3)
    ]
    consumer = Consumer(cams, cond, stop)
    for c in cams:
        c.start()
    wait_until(lambda: all(consumer.count(c.name) > 5 for c in cams), 40, "frames on every camera")
    server.proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    wait_until(lambda: all(c.stats.stalls >= 1 for c in cams), 10, "a stall on every camera")
    assert time.monotonic() - t0 < 2 + 3, "within stall_timeout_s (and a poll)"
    wait_until(lambda: all(c.stats.state == "down" for c in cams), 10, "down, reopening")
    stop.set()
    t0 = time.monotonic()
    assert join_all(cams, 5.0) == []
    assert time.monotonic() - t0 < 2.5, "stopped in parallel"
    server.proc.send_signal(signal.SIGCONT)


@pytest.mark.slow
def test_four_rtsp_cameras_at_once(h264_video: Path, servers, rig) -> None:
    servers.append(server := RtspServer(h264_video, "--h264"))
    cond, stop = rig
    cams = [camera({"name": f"ip{i}", "uri": server.uri(), "fps_max": 15}, cond, stop) for i in range(4)]
    consumer = Consumer(cams, cond, stop)
    for c in cams:
        c.start()
    wait_until(lambda: all(consumer.count(c.name) >= 30 for c in cams), 60, "30 frames on each of four cameras")
    assert all(c.stats.reconnects == 0 and c.stats.state == "up" for c in cams)


FIRST_OPENS = """
import json, sys, threading, time
from edged.daemon.capture.camera import Camera, join_all
from edged.daemon.config import CameraConfig
from edged.daemon.capture.preprocess import Preprocessor
from edged.models.package import InputSpec
sys.setswitchinterval(1e-5)  # threads switch often: what a busy device does now and then
video, n = sys.argv[1], int(sys.argv[2])
cond, stop = threading.Condition(), threading.Event()
spec = InputSpec(name="x", shape=[1, 64, 64, 3], layout="NHWC")
cfgs = [{"name": f"c{i}", "uri": f"file://{video}", "realtime": False, "loop": True} for i in range(n)]
cams = [Camera(CameraConfig.model_validate(c), Preprocessor(spec), cond, stop) for c in cfgs]
for c in cams:
    c.start()
got, end = {c.name: 0 for c in cams}, time.monotonic() + 20
while min(got.values()) < 5 and time.monotonic() < end:
    with cond:
        for c in cams:
            taken = c.take_locked()
            if taken:
                got[c.name] += 1
                c.release_locked(taken[0])
        cond.wait(0.05)
stop.set()
assert join_all(cams, 10.0) == []
print(json.dumps({"frames": got, "errors": sum(c.stats.errors for c in cams)}))
"""


def test_cameras_opening_at_once_in_a_fresh_process_all_come_up(demo: DemoAssets) -> None:
    """PyGObject builds its classes and enum members on first use, not safely across threads: GStreamer
    cameras opening at once in a new daemon saw "type object 'PadProbeReturn' has no attribute 'OK'" or
    "Expected Gst.PadProbeInfo, but got gi.repository.Gst.PadProbeInfo", and their threads died (4 of 6
    fresh processes here lost cameras). Three fresh processes, six cameras each, threads switching often."""
    for _ in range(3):
        run = subprocess.run(
            [sys.executable, "-c", FIRST_OPENS, str(demo.video), "6"], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert min(out["frames"].values()) >= 5 and out["errors"] == 0, (out, run.stderr[-3000:])
        for sign in ("Traceback", "has no attribute", "but got gi.repository"):
            assert sign not in run.stderr, run.stderr[-3000:]


def test_a_cpp_exception_after_gstreamer_loads_raises_instead_of_crashing(tmp_path: Path) -> None:
    """Debian's libgstreamer links libunwind; loaded into the global symbol scope first, it took over C++
    exception unwinding, and ONNX Runtime refusing a model (or OpenCV refusing a frame) killed the daemon
    with SIGSEGV/SIGABRT instead of raising: a bad model pushed to a device with GStreamer cameras crashed
    it instead of being rejected. A fresh process, as the daemon loads things: numpy, GStreamer, then both."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from edged.daemon.capture.gstreamer import pipeline as gst\n"
        "assert gst.available(), gst.why_unavailable()\n"
        "from edged.daemon.backends import OnnxRuntimeBackend\n"
        "from edged.errors import EngineLoadError\n"
        "import cv2\n"
        "try:\n"
        f"    OnnxRuntimeBackend(Path({str(bad)!r}))\n"
        "except EngineLoadError as e:\n"
        "    print('refused:', e)\n"
        "try:\n"
        "    cv2.resize(np.zeros((0, 0), np.uint8), (0, 0))\n"
        "except cv2.error:\n"
        "    print('cv2.error')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "refused:" in r.stdout and "ONNX Runtime cannot load it" in r.stdout and "cv2.error" in r.stdout


def test_a_mid_stream_resolution_change_gives_every_frame_its_own_source_size() -> None:
    # A real pipeline whose source changes resolution (videotestsrc renegotiates when the capsfilter
    # `res` changes), scaled in the pipeline to a tenth of the source: each frame's size tells the source
    # size it came from. Frames already past the scaler when the new caps pass it (here held in a queue
    # after it, as buffers in flight are between nvvidconv and the appsink) must keep their own source
    # size: they were labelled with the new one before.
    sizes = [(320, 240), (640, 360), (480, 320)]
    desc = (
        "videotestsrc name=src num-buffers=90 ! capsfilter name=res caps=video/x-raw,width=320,height=240,"
        "framerate=30/1 ! "
        + gstpipe.tail(nvmm=False).replace("caps=video/x-raw ! ", "caps=video/x-raw ! queue max-size-buffers=3 ! ")
    )
    source = gst.GstSource(gstpipe.Plan(desc, {}, False), 5.0, lambda w, h: (w // 10, h // 10), shown="test")
    res = source.pipeline.get_by_name("res")
    seen: list[tuple[tuple[int, int], tuple[int, int] | None]] = []
    try:
        while (frame := source.read()) is not None:
            seen.append(((frame.shape[1], frame.shape[0]), source.scaled_from))
            if len(seen) % 30 == 0 and len(seen) // 30 < len(sizes):
                w, h = sizes[len(seen) // 30]
                caps = f"video/x-raw,width={w},height={h},framerate=30/1"
                res.set_property("caps", gst._load()[0].Caps.from_string(caps))

                # the new caps pass the scaler while frames of the old size wait in the queue after it
                def reached(size: tuple[int, int] = (w, h)) -> bool:
                    return source._src_size == size

                wait_until(reached, 5.0, "the new size reaches the scaler")
    finally:
        source.close()
    assert {out for out, _ in seen} == {(w // 10, h // 10) for w, h in sizes}, seen
    wrong = [(out, src) for out, src in seen if src is None or (src[0] // 10, src[1] // 10) != out]
    assert not wrong, f"frames labelled with another frame's source size: {wrong}"


def test_a_samples_caps_are_read_once_per_caps_and_again_when_they_change() -> None:
    # The reader reads width, height and format through GI once per caps (issue 34's per-frame CPU): every
    # frame of one caps shares the one reading; a change of format and size mid-stream is read again, and
    # each frame comes out in its own size and channel order (videotestsrc's first pixel is white either way).
    desc = (
        "videotestsrc name=src num-buffers=40 pattern=white ! capsfilter name=res "
        "caps=video/x-raw,format=BGR,width=64,height=48,framerate=30/1 ! appsink name=sink max-buffers=2"
    )
    source = gst.GstSource(gstpipe.Plan(desc, {}, False), 5.0, None, shown="test")
    res = source.pipeline.get_by_name("res")
    seen: list[tuple[tuple[int, ...], tuple[int, int, str]]] = []  # the readings kept alive: their ids stay theirs
    try:
        while (frame := source.read()) is not None:
            assert source._caps is not None
            seen.append((frame.shape, source._caps[1]))
            assert frame.dtype.name == "uint8" and int(frame[0, 0, 0]) == 255, frame[0, 0]
            if len(seen) == 10:
                caps = "video/x-raw,format=RGBx,width=32,height=16,framerate=30/1"
                res.set_property("caps", gst._load()[0].Caps.from_string(caps))
    finally:
        source.close()
    shapes = [shape for shape, _ in seen]
    assert shapes[:10] == [(48, 64, 3)] * 10 and shapes[-1] == (16, 32, 3), shapes
    readings = {shape: {id(reading) for s, reading in seen if s == shape} for shape in set(shapes)}
    assert all(len(r) == 1 for r in readings.values()), readings
    assert readings[(48, 64, 3)] != readings[(16, 32, 3)]
    assert source._caps is None, "close lets go of the caps"
