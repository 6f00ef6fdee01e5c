"""HTTP snapshot cameras (``snapshot+http://``), against a real HTTP server on 127.0.0.1 serving real JPEGs of
the demo video's frames: frames flow through a capture camera, 401/404/refused/no answer are said clearly and
the camera reconnects, max_frame_pixels is held before decoding, credentials never reach a message."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.daemon.capture.camera import Camera
from edged.daemon.capture.framebound import FrameBound
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.capture.probe import check_camera
from edged.daemon.capture.registry import BY_SCHEME, GST_SCHEMES, source_type
from edged.daemon.capture.sources import open_source
from edged.daemon.config import CameraConfig
from edged.daemon.doctor import camera_path
from edged.errors import CaptureError
from edged.models.demo import DemoAssets
from edged.models.package import InputSpec

from .conftest import free_port, wait_until
from .test_capture_tls import self_signed

SPEC = InputSpec(name="x", shape=[1, 64, 64, 3], layout="NHWC")


def demo_jpegs(video: Path, n: int, size: tuple[int, int] | None = None) -> list[bytes]:
    cap = cv2.VideoCapture(str(video))
    out = []
    for _ in range(n):
        ok, img = cap.read()
        assert ok
        if size is not None:
            img = cv2.resize(img, size)
        ok, jpg = cv2.imencode(".jpg", img)
        assert ok
        out.append(jpg.tobytes())
    cap.release()
    return out


class SnapshotServer:
    """A camera that serves only /snapshot.jpg: the next of `jpegs` at each request (or `status` instead of
    200; Basic auth when `auth` is set). `stop()` closes its socket (connection refused); `start()` listens
    again on the same port."""

    def __init__(self, jpegs: list[bytes], port: int) -> None:
        self.jpegs, self.port = jpegs, port
        self.status = 200
        self.auth: str | None = None
        self.requests = 0
        self.served: list[bytes] = []
        self.cut = 0  # answers the client hung up on before their body was all sent
        self.tls: tuple[Path, Path] | None = None  # (certificate, key): serve https
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                if (
                    outer.auth is not None
                    and self.headers.get("Authorization") != "Basic " + base64.b64encode(outer.auth.encode()).decode()
                ):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="cam"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path != "/snapshot.jpg" or outer.status != 200:
                    self.send_error(404 if outer.status == 200 else outer.status)
                    return
                body = outer.jpegs[len(outer.served) % len(outer.jpegs)]
                outer.served.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    outer.cut += 1

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture(scope="module")
def frames(demo: DemoAssets) -> list[bytes]:
    return demo_jpegs(demo.video, 8)


@pytest.fixture
def server(frames: list[bytes]) -> Iterator[SnapshotServer]:
    s = SnapshotServer(frames, free_port())
    s.start()
    yield s
    s.stop()


def cam_cfg(uri: str, **extra: object) -> CameraConfig:
    return CameraConfig.model_validate({"name": "snap", "uri": uri, **extra})


def url(server: SnapshotServer, userinfo: str = "", path: str = "/snapshot.jpg") -> str:
    return f"snapshot+http://{userinfo}127.0.0.1:{server.port}{path}"


@pytest.fixture
def rig() -> Iterator[tuple[threading.Condition, threading.Event]]:
    cond, stop = threading.Condition(), threading.Event()
    yield cond, stop
    stop.set()


def test_a_read_is_the_served_jpeg_decoded_and_polls_keep_to_fps_max(server: SnapshotServer) -> None:
    source = open_source(cam_cfg(url(server), fps_max=10))
    try:
        got = [source.read() for _ in range(6)]
        t0, n0 = time.monotonic(), server.requests
        while time.monotonic() - t0 < 1.0:
            assert source.read() is not None
        polled = server.requests - n0
    finally:
        source.close()
    for frame, body in zip(got, server.served, strict=False):
        expect = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR)
        assert frame is not None and expect is not None
        assert frame.shape == expect.shape and np.array_equal(frame, expect)
    assert got[0] is not None and got[0].shape[:2] == (540, 960)  # the demo video's frames
    assert 5 <= polled <= 12, polled  # 10 a second at most (a slow machine may poll fewer)


def test_frames_flow_through_a_capture_camera_and_a_404_or_a_dead_server_is_said_and_reconnected(
    server: SnapshotServer, rig
) -> None:
    cond, stop = rig
    cfg = cam_cfg(url(server), fps_max=20, stall_timeout_s=1.0, reconnect_min_s=0.1, reconnect_max_s=0.3)
    cam = Camera(cfg, Preprocessor(SPEC), cond, stop)  # the daemon's own opener: open_source, by the registry
    cam.start()
    wait_until(lambda: cam.stats.frames >= 5, 20, "frames from the snapshot camera")
    assert cam.stats.state == "up"

    server.status = 404  # the snapshot's path is gone: down at once with the reason, retried with back-off
    wait_until(lambda: cam.stats.state == "down", 10, "the camera down on a 404")
    assert "HTTP 404 Not Found: no snapshot at that path" in cam.stats.last_error
    assert cam.stats.last_error.startswith(f"snapshot+http://127.0.0.1:{server.port}/snapshot.jpg")
    server.status = 200
    frames, reconnects = cam.stats.frames, cam.stats.reconnects
    wait_until(lambda: cam.stats.state == "up" and cam.stats.frames > frames + 3, 20, "frames again after the 404")
    assert cam.stats.reconnects > reconnects

    server.stop()  # the camera's web server goes away: a stall, then the reason from each reopen
    wait_until(lambda: "connection refused" in cam.stats.last_error, 20, "the refused connection said")
    assert cam.stats.state == "down" and cam.stats.stalls >= 1
    server.start()
    frames, reconnects = cam.stats.frames, cam.stats.reconnects
    wait_until(lambda: cam.stats.state == "up" and cam.stats.frames > frames + 3, 20, "frames again after the restart")
    assert cam.stats.reconnects > reconnects
    stop.set()
    cam.join(10)
    assert cam.stats.state == "stopped"


def test_401_says_what_is_missing_and_password_file_gives_the_password(server: SnapshotServer, tmp_path: Path) -> None:
    server.auth = "viewer:s3cret pass"
    with pytest.raises(CaptureError, match=r"HTTP 401 Unauthorized: the camera wants a user and password"):
        open_source(cam_cfg(url(server)))
    with pytest.raises(CaptureError, match=r"refused the user and password given") as err:
        open_source(cam_cfg(url(server, "viewer:wrong@")))
    assert "wrong" not in str(err.value) and f"snapshot+http://***@127.0.0.1:{server.port}/" in str(err.value)

    secret = tmp_path / "pw"
    secret.write_text("s3cret pass\n")
    cfg = cam_cfg(url(server, "viewer@"), password_file=str(secret))
    source = open_source(cfg)
    try:
        assert source.read() is not None
    finally:
        source.close()
    assert "s3cret" not in cfg.display and "viewer" not in cfg.display


def test_a_path_that_is_not_there_is_a_404_with_the_reason(server: SnapshotServer) -> None:
    with pytest.raises(CaptureError, match=r"HTTP 404 Not Found: no snapshot at that path"):
        open_source(cam_cfg(url(server, path="/cgi-bin/nothing.jpg")))


def test_a_server_that_accepts_and_never_answers_is_bounded_by_stall_timeout_s() -> None:
    with socket.socket() as listener:  # the kernel accepts (backlog); nothing ever reads or answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(CaptureError, match=r"no snapshot within 1 s"):
            open_source(cam_cfg(f"snapshot+http://127.0.0.1:{port}/snapshot.jpg", stall_timeout_s=1.0))
        assert time.monotonic() - t0 < 4.0


def test_refused_connection_and_a_poll_rate_slower_than_a_stall_are_clear() -> None:
    port = free_port()
    with pytest.raises(CaptureError, match=r"connection refused"):
        open_source(cam_cfg(f"snapshot+http://127.0.0.1:{port}/snapshot.jpg"))
    with pytest.raises(CaptureError, match=r"every 10 s \(fps_max 0.1\) is no faster than stall_timeout_s 5"):
        open_source(cam_cfg(f"snapshot+http://127.0.0.1:{port}/snapshot.jpg", fps_max=0.1))


def test_max_frame_pixels_refuses_a_snapshot_by_its_header_and_the_camera_goes_on(demo: DemoAssets) -> None:
    small = demo_jpegs(demo.video, 1, (160, 120))[0]
    # 960 x 540 = 518,400 pixels, and 24 MiB after its end (decoders ignore it; more than loopback buffers hold)
    big = demo_jpegs(demo.video, 1)[0] + bytes(24 << 20)
    s = SnapshotServer([big], free_port())
    s.start()
    try:
        bound = FrameBound("snap", 50_000)
        cfg = cam_cfg(f"snapshot+http://127.0.0.1:{s.port}/snapshot.jpg", fps_max=20, max_frame_pixels=50_000)
        with pytest.raises(CaptureError, match=r"a 960x540 snapshot, over max_frame_pixels 50000"):
            open_source(cfg, bound=bound)
        assert bound.refused == 1
        s.jpegs = [small, big, big, small]  # the next poll from here on: small, big, big, small, small, …
        s.served.clear()
        source = open_source(cfg, bound=bound)
        try:
            shapes = [f.shape[:2] if (f := source.read()) is not None else None for _ in range(3)]
        finally:
            source.close()
        assert shapes == [(120, 160)] * 3 and bound.refused == 3  # the two big ones refused, not decoded
        wait_until(lambda: s.cut == 3, 10, "the server to see every big answer cut short")  # not even read whole
    finally:
        s.stop()


def test_the_config_checks_a_snapshot_uri_like_any_network_camera(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no host \(snapshot\+http://\[USER@\]HOST\[:PORT\]/PATH\)"):
        cam_cfg("snapshot+http:///snapshot.jpg")
    with pytest.raises(ValueError, match=r"scheme must be one of .*snapshot\+http://, snapshot\+https://, not"):
        cam_cfg("snapshot://cam/snapshot.jpg")
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    ok = cam_cfg("snapshot+https://admin@cam.local/snapshot.jpg", password_file=str(secret))
    assert ok.display == "snapshot+https://***@cam.local/snapshot.jpg"


def test_its_one_row_gives_the_config_doctor_and_check_config_their_lines() -> None:
    snap = cam_cfg("snapshot+http://cam.local/snapshot.jpg")
    assert source_type(snap.uri) is BY_SCHEME["snapshot+https"] and "snapshot+http" not in GST_SCHEMES
    assert check_camera(snap) == "edged"  # no GStreamer path: edged's own reader
    assert camera_path(snap).path == "edged polls snapshots" and not camera_path(snap).problem
    described = CameraConfig.model_fields["uri"].description or ""
    assert described.endswith("snapshot+http(s):// (a JPEG polled at fps_max)")


def test_https_verifies_the_cameras_certificate_and_says_why_not(frames: list[bytes], tmp_path: Path) -> None:
    s = SnapshotServer(frames, free_port())
    s.tls = self_signed(tmp_path, "camera")
    s.start()
    try:
        with pytest.raises(CaptureError, match=r"TLS: the camera's certificate does not verify .*self.signed") as err:
            open_source(cam_cfg(f"snapshot+https://admin:pw@127.0.0.1:{s.port}/snapshot.jpg"))
        assert "pw" not in str(err.value) and s.served == []  # nothing asked over an unverified connection
    finally:
        s.stop()
