"""Operability faults (issue 21): a hung camera holds no other camera up, a camera that changes
resolution keeps its boxes right, and two pushes of one package both end promptly. Real servers on
127.0.0.1, real OpenCV and ONNX Runtime, real daemons, real `edged push` processes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import pytest

from edged.daemon.capture.camera import Camera
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import CameraConfig
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec
from edged.models.signing import SigningKey

from .conftest import Broker, base_config, free_port, wait_until, write_config
from .test_capture import Consumer, mjpeg_server
from .test_ota import MODEL, build, device_doc, install, start_push, wait_results

SPEC = InputSpec(name="x", shape=[1, 64, 64, 3], layout="NHWC")


class HangingServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte: a camera
    whose network stack is up and whose streaming process is wedged. With `rtsp_options`, it answers
    RTSP OPTIONS requests (what FFmpeg sends first) and nothing else: a camera whose RTSP front end
    is alive and whose stream is not."""

    def __init__(self, rtsp_options: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.options = 0  # OPTIONS requests answered
        self._rtsp_options = rtsp_options
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # held open, never answered (but OPTIONS, when asked to)
            if self._rtsp_options:
                threading.Thread(target=self._answer_options, args=(conn,), daemon=True).start()

    def _answer_options(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, buf = buf.split(b"\r\n\r\n", 1)
                cseq = next(
                    (ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n") if ln.lower().startswith(b"cseq")), b"1"
                )
                if head.startswith(b"OPTIONS"):
                    self.options += 1
                    reply = b"RTSP/1.0 200 OK\r\nCSeq: " + cseq + b"\r\nPublic: OPTIONS, DESCRIBE, SETUP, PLAY\r\n\r\n"
                    conn.sendall(reply)

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        for c in self.accepted:
            c.close()


@pytest.fixture(params=[False])
def hanging(request: pytest.FixtureRequest) -> Iterator[HangingServer]:
    s = HangingServer(rtsp_options=request.param)
    yield s
    s.close()


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


def padding(path: Path, size: int) -> Path:
    path.write_bytes(bytes(range(256)) * (size // 256))
    return path


def short_clip(demo: DemoAssets, out: Path, frames: int = 15) -> Path:
    """The first `frames` frames of the demo video as a file: a camera that loops it reopens it
    through FFmpeg every second."""
    cap = cv2.VideoCapture(str(demo.video))
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"mp4v"), 15, (960, 540))
    for _ in range(frames):
        ok, img = cap.read()
        assert ok
        writer.write(img)
    writer.release()
    cap.release()
    return out


@pytest.mark.parametrize(
    ("scheme", "hanging"), [("http", False), ("rtsp", False), ("rtsp", True)], indirect=["hanging"]
)
def test_a_camera_whose_server_hangs_holds_no_other_camera_open(
    scheme: str, demo: DemoAssets, hanging: HangingServer, rig: Any, tmp_path: Path
) -> None:
    cond, stop = rig
    fast = {"reconnect_min_s": 0.2, "reconnect_max_s": 0.4}
    hung = Camera(
        CameraConfig(name="hung", uri=f"{scheme}://127.0.0.1:{hanging.port}/stream", stall_timeout_s=8, **fast),
        Preprocessor(SPEC),
        cond,
        stop,
    )
    clip = short_clip(demo, tmp_path / "clip.mp4")
    good = Camera(
        CameraConfig(name="good", uri=f"file://{clip}", loop=True, fps_max=15, **fast),
        Preprocessor(SPEC),
        cond,
        stop,
    )
    consumer = Consumer([hung, good], cond, stop)
    hung.start()
    wait_until(lambda: len(hanging.accepted) >= 1, 5, "the hung camera to be inside its open")
    t0 = time.monotonic()
    good.start()
    wait_until(lambda: consumer.count("good") >= 1, 8, "the good camera's first frame")
    first = time.monotonic() - t0
    # the clip lasts 1 s: every loop is a reopen, and none of them waits for the hung camera
    n = consumer.count("good")
    t_flow = time.monotonic()
    while consumer.count("good") < n + 30 and time.monotonic() < t_flow + 3.0:  # 2 s at 15 fps, within 3 s
        time.sleep(0.05)
    flowed, flow_s = consumer.count("good") - n, time.monotonic() - t_flow
    clip.rename(tmp_path / "away.mp4")
    wait_until(lambda: good.stats.state == "down", 10, "the good camera to go down")
    (tmp_path / "away.mp4").rename(clip)
    t1 = time.monotonic()
    wait_until(lambda: good.stats.state == "up" and good.stats.reconnects >= 1, 10, "the good camera to reopen")
    reopen = time.monotonic() - t1
    print(f"\n{scheme}: first frame after {first:.2f} s, {flowed} frames in {flow_s:.1f} s, reopened in {reopen:.2f} s")
    assert first < 2.0, f"the first open waited {first:.1f} s behind the hung camera"
    assert flowed >= 30 and flow_s <= 3.2, f"only {flowed} frames in {flow_s:.1f} s at 15 fps: the loop reopens waited"
    assert reopen < 2.0, f"the reopen waited {reopen:.1f} s behind the hung camera"
    # and the hung one gives up its open within its bound, says why, and tries again (still hung)
    wait_until(lambda: hung.stats.state == "down", 10, "the hung camera's open to give up")
    assert "no answer" in hung.stats.last_error and hung.stats.last_error.endswith("within 8 s")
    wait_until(lambda: len(hanging.accepted) >= 2, 5, "the hung camera to try again")


def test_an_mjpeg_open_gives_up_within_its_bound_and_says_so(hanging: HangingServer, rig: Any) -> None:
    from edged.daemon.capture.camera import open_source
    from edged.errors import CaptureError

    cfg = CameraConfig(name="c", uri=f"http://user:secret@127.0.0.1:{hanging.port}/s.mjpg", stall_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(CaptureError, match=r"no answer to an HTTP request within 1 s") as err:
        open_source(cfg)
    assert 0.9 < time.monotonic() - t0 < 2.5
    assert "secret" not in str(err.value), "camera passwords never reach messages"


def test_a_stream_that_changes_resolution_gets_sizes_and_boxes_of_the_new_frames(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, hanging: HangingServer
) -> None:
    """An MJPEG camera switches from 960x540 to a 1280x720 canvas (the same picture centred on it,
    so each face moves by (160, 90) and keeps its size), while another camera hangs: results carry
    the new size and the boxes land on the faces in the new frames' pixels."""
    port = free_port()
    server = mjpeg_server(port, "--still", f"{demo.video}:180", "--switch-after", "20", "--pad-to", "1280x720")
    sub = subscribe(broker, "edged/#")
    cams = [
        {"name": "hung", "uri": f"http://127.0.0.1:{hanging.port}/s.mjpg", "stall_timeout_s": 8},
        {"name": "ip", "uri": f"http://127.0.0.1:{port}/s.mjpg", "reconnect_min_s": 0.2, "reconnect_max_s": 0.4},
    ]
    cfg = write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, cams))
    d = start_daemon(cfg)
    faces = [[138.8, 154.1, 257.8, 287.1], [601.0, 133.9, 672.0, 206.7]]  # frame 180's, in demo.json
    try:
        wait_until(lambda: len(big(sub)) >= 10, 40, "results of the larger frames")
        small = [r for r in sub.results("ip") if r["image"] == {"width": 960, "height": 540}]
        assert small, "the first frames are 960x540"
        check_boxes(small, faces, (0, 0))
        check_boxes(big(sub), faces, (160, 90))
        # the server restarts (the camera rebooted): back at 960x540 first, promptly, the other still hung
        server.kill()
        server.wait()
        wait_until(lambda: "camera ip: down" in d.output(), 20, "the camera to go down")
        n = len(sub.results("ip"))
        server = mjpeg_server(port, "--still", f"{demo.video}:180", "--switch-after", "20", "--pad-to", "1280x720")
        t0 = time.monotonic()
        wait_until(lambda: len(sub.results("ip")) > n, 10, "results after the restart")
        print(f"\nresults again {time.monotonic() - t0:.2f} s after the camera's server restarted")
        assert time.monotonic() - t0 < 4.0
        assert not sub.results("hung") and hanging.accepted, "the other camera hung all along"
    finally:
        server.kill()
        server.wait()
    assert d.stop() == 0, d.output()[-3000:]


def big(sub: Any) -> list[dict[str, Any]]:
    return [r for r in sub.results("ip") if r["image"] == {"width": 1280, "height": 720}]


def iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def check_boxes(results: list[dict[str, Any]], faces: list[list[float]], offset: tuple[int, int]) -> None:
    """The first (large) face is found in every result, and every box lies on one of the faces."""
    ox, oy = offset
    want = [[f[0] + ox, f[1] + oy, f[2] + ox, f[3] + oy] for f in faces]
    for r in results:
        boxes = [det["box"] for det in r["detections"]]
        assert max((iou(want[0], b) for b in boxes), default=0.0) >= 0.6, f"{want[0]} missed in {r['image']}: {boxes}"
        for b in boxes:
            assert max(iou(w, b) for w in want) >= 0.5, f"box {b} is on no face of {want} in {r['image']}"


def test_two_pushes_of_one_package_at_once_both_end_promptly_and_truthfully(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """Two operators push the same package to one device at the same moment. The device runs one
    transfer (the second offer joins the first); each pusher must report what happened to the device,
    well before its --timeout, instead of one of them waiting the whole timeout for a transfer that
    is no longer its own."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"] = {"chunk_kb": 4, "window": 1, "retry_s": 2}  # a slow transfer: the second offer lands in it
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    v2 = build(demo, tmp_path, signer, 2, files={"padding.bin": padding(tmp_path / "padding.bin", 8 << 20)})
    t0 = time.monotonic()
    first = start_push(broker, v2, "--device", "cam-01", "--timeout", "60")
    wait_until(lambda: any(m.json().get("state") == "downloading" for m in sub.on("ota/status")), 30, "a download")
    second = start_push(broker, v2, "--device", "cam-01", "--timeout", "60")
    outs = []
    for p in (first, second):
        out, _ = p.communicate(timeout=90)
        outs.append((p.returncode, out, time.monotonic() - t0))
    for rc, out, took in outs:
        print(f"\nexit {rc} after {took:.1f} s:\n{out}")
    for rc, out, took in outs:
        assert "timed_out" not in out, out
        assert took < 40, f"a pusher took {took:.0f} s of its 60 s timeout"
        assert rc == 0 and "1 of 1 device(s) succeeded" in out, out
    wait_results(sub, 2)
    # the one whose transfer the other took over says so; both say how the device ended
    assert any("via transfer" in out for _, out, _ in outs), outs
    assert d.stop() == 0


def transfer_id(p: Any) -> str:
    """The transfer id from a running `edged push`'s first line: ``push: … (… MiB, transfer ID) via …``."""
    assert p.stdout is not None
    return str(p.stdout.readline().split("transfer ")[1].split(")")[0])


def test_a_second_push_joins_the_transfer_without_a_stall_and_says_so(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """When a second push of the package joins the running transfer, the device asks the chunks in flight
    again under the new id at once (before, they were dropped on arrival and the transfer stalled for
    `ota.retry_s`, 30 s here), publishes `joined` (`by` the new id) on the old transfer's status, and
    names the old id in its reply: each pusher's report says which transfer it followed or took over."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"] = {"chunk_kb": 4, "window": 1, "retry_s": 30}  # a stall would cost 30 s
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    v2 = build(demo, tmp_path, signer, 2, files={"padding.bin": padding(tmp_path / "padding.bin", 8 << 20)})
    first = start_push(broker, v2, "--device", "cam-01", "--timeout", "60")
    ours = transfer_id(first)
    wait_until(lambda: any(m.json().get("state") == "downloading" for m in sub.on("ota/status")), 30, "a download")
    t0 = time.monotonic()
    second = start_push(broker, v2, "--device", "cam-01", "--timeout", "60")
    theirs = transfer_id(second)
    outs = {}
    for name, p in (("first", first), ("second", second)):
        out, _ = p.communicate(timeout=90)
        outs[name] = (p.returncode, out, time.monotonic() - t0)
        print(
            f"\n{name} ({ours if name == 'first' else theirs}): exit {p.returncode} after {outs[name][2]:.1f} s:\n{out}"
        )
    for rc, out, took in outs.values():
        assert rc == 0 and "1 of 1 device(s) succeeded" in out, out
        assert took < 20, f"a pusher ended {took:.0f} s after the join: the transfer stalled (ota.retry_s is 30 s)"
    statuses = [m.json() for m in sub.on("ota/status")]
    joined = [s for s in statuses if s.get("state") == "joined"]
    assert [(s["transfer"], s["by"]) for s in joined] == [(ours, theirs)], joined
    assert joined[0]["model"] == {"name": MODEL, "version": 2} and 0 < joined[0]["bytes"] < joined[0]["total"]
    assert f"via transfer {theirs}" in outs["first"][1]
    assert f"took over transfer {ours}" in outs["second"][1]
    wait_results(sub, 2)
    assert d.stop() == 0


def test_a_pusher_whose_transfer_was_taken_over_takes_it_back_when_the_other_dies(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    """The pusher that took the transfer over is killed: the first one hears nothing for 10 s, offers
    again, and the device joins the transfer back to it, asking the chunk in flight again at once (with
    `ota.retry_s` at 30 s, a stall would show)."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["ota"] = {"chunk_kb": 4, "window": 1, "retry_s": 30}
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1)
    v2 = build(demo, tmp_path, signer, 2, files={"padding.bin": padding(tmp_path / "padding.bin", 8 << 20)})
    first = start_push(broker, v2, "--device", "cam-01", "--timeout", "90")
    ours = transfer_id(first)
    wait_until(lambda: any(m.json().get("state") == "downloading" for m in sub.on("ota/status")), 30, "a download")
    second = start_push(broker, v2, "--device", "cam-01", "--timeout", "90")
    theirs = transfer_id(second)

    def statuses_of(transfer: str) -> list[dict[str, Any]]:
        return [m.json() for m in sub.on("ota/status") if m.json().get("transfer") == transfer]

    try:
        wait_until(lambda: any(s["state"] == "downloading" for s in statuses_of(theirs)), 30, "the second's transfer")
    except AssertionError:
        second.kill()
        ota = [ln for ln in d.output().splitlines() if "ota" in ln or "swap" in ln or "offer" in ln]
        raise AssertionError(second.communicate()[0] + "\n" + "\n".join(ota[-30:])) from None
    second.kill()  # a real SIGKILL: nobody serves the transfer the device now runs
    second.wait()
    assert second.stdout is not None
    second.stdout.close()
    t0 = time.monotonic()
    out, _ = first.communicate(timeout=120)
    print(f"\nthe first pusher ended {time.monotonic() - t0:.1f} s after the second died:\n{out}")
    assert first.returncode == 0 and "1 of 1 device(s) succeeded" in out, out
    assert time.monotonic() - t0 < 30  # 10 s of silence, then the rest at once (a stall is 30 s more)
    joined = [(s["transfer"], s["by"]) for s in (m.json() for m in sub.on("ota/status")) if s["state"] == "joined"]
    assert joined == [(ours, theirs), (theirs, ours)], joined
    wait_results(sub, 2)
    assert d.stop() == 0


def test_an_mjpeg_stream_of_bytes_that_never_make_a_frame_is_a_stall() -> None:
    """A camera that answers 200 multipart and then streams bytes without a part delimiter (a wedged
    encoder, a proxy's garbage) gives no frame within the read's bound: the camera sees a stall and
    reconnects, rather than reading forever."""
    from edged.daemon.capture.netcam import open_http

    sock = socket.create_server(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary=frame\r\n\r\n")
        with conn:
            while not stop.is_set():
                try:
                    conn.sendall(b"\x00" * 1024)
                except OSError:
                    return
                time.sleep(0.005)

    threading.Thread(target=serve, daemon=True).start()
    source = open_http(f"http://127.0.0.1:{port}/s.mjpg", 1.0)
    assert source is not None
    t0 = time.monotonic()
    try:
        assert source.read() is None
        assert time.monotonic() - t0 < 3.0, "a read gives up within its bound"
    finally:
        stop.set()
        source.close()
        sock.close()
