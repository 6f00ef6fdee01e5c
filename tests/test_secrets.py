"""Camera credentials never leave the device: not in the log, not on the broker (telemetry's
`last_error`, status, events, command replies), not in `edged check-config`. Real daemon, real
mosquitto, real servers on 127.0.0.1 that refuse the camera."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.capture.redact import redact
from edged.daemon.config import load_config
from edged.errors import ConfigError
from edged.models.demo import DemoAssets

from .conftest import Broker, Subscriber, base_config, edged_cli, free_port, wait_until, write_config
from .test_capture import mjpeg_server


def _last_telemetry(sub: Subscriber) -> dict[str, Any]:
    msgs = sub.on("telemetry")
    return msgs[-1].json() if msgs else {}


def _cameras_failed(sub: Subscriber, names: list[str]) -> bool:
    cams = _last_telemetry(sub).get("cameras", {})
    return all(cams.get(n, {}).get("last_error") for n in names)


def _retained(b: Broker) -> list[str]:
    """Every retained message under edged/# as text, collected by a fresh client."""
    got: list[str] = []
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"ret-{free_port()}", protocol=mqtt.MQTTv5)
    c.on_connect = lambda c_, u, f, rc, p: c_.subscribe([("edged/#", 1), ("edged/_end", 1)])
    c.on_message = lambda c_, u, m: done.set() if m.topic == "edged/_end" else got.append(f"{m.topic} {m.payload!r}")
    c.on_subscribe = lambda c_, u, mid, rcs, p: c_.publish("edged/_end", b"x", qos=1)
    c.connect(b.host, b.port)
    c.loop_start()
    try:
        wait_until(done.is_set, 10, "the retained messages")
    finally:
        c.disconnect()
        c.loop_stop()
    return got


def _rtsp_refusing() -> socket.socket:
    """An RTSP server on 127.0.0.1 that answers every request `401 Unauthorized` (edged's DESCRIBE
    probe passes; FFmpeg's open, with the credentials, is refused)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def answer(c: socket.socket) -> None:
        buf = b""
        with c, contextlib.suppress(OSError):  # edged's probe hangs up after the first answer
            while data := c.recv(4096):
                buf += data
                while b"\r\n\r\n" in buf:
                    req, buf = buf.split(b"\r\n\r\n", 1)
                    cseq = [h for h in req.split(b"\r\n") if h.lower().startswith(b"cseq")] or [b"CSeq: 1"]
                    auth = b'WWW-Authenticate: Basic realm="x"'
                    c.sendall(b"RTSP/1.0 401 Unauthorized\r\n" + cseq[0] + b"\r\n" + auth + b"\r\n\r\n")

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=answer, args=(srv.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv


class _RtspAuthChecker:
    """An RTSP server on 127.0.0.1 that asks for credentials and checks them as a camera does: the first
    connection of FFmpeg's is challenged with Basic, the next with Digest (MD5, RFC 2617 without qop, as
    IP cameras commonly do; edged's own DESCRIBE probe, which brings no credentials, gets Basic). It
    records, per scheme, whether the credentials FFmpeg sent were exactly `user:password`, then answers
    404 (it serves no stream), so the daemon reconnects."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password
        self.checked: list[tuple[str, bool, str]] = []  # (scheme, right, what was sent)
        self._connections = 0
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=self._answer, args=(self.srv.accept()[0],), daemon=True).start()

    def _verdict(self, method: str, auth: str) -> tuple[str, bool, str]:
        import base64
        import hashlib

        scheme, _, rest = auth.partition(" ")
        if scheme == "Basic":
            sent = base64.b64decode(rest).decode("utf-8", "replace")
            return "Basic", sent == f"{self.user}:{self.password}", sent
        fields = dict(re.findall(r'(\w+)="?([^",]*)"?', rest))

        def md5(text: str) -> str:
            return hashlib.md5(text.encode()).hexdigest()

        ha1 = md5(f"{self.user}:x:{self.password}")
        want = md5(f"{ha1}:{fields.get('nonce')}:{md5(method + ':' + fields.get('uri', ''))}")
        return "Digest", fields.get("username") == self.user and fields.get("response") == want, rest

    def _answer(self, c: socket.socket) -> None:
        buf = b""
        challenge = ""
        with c, contextlib.suppress(OSError):
            while data := c.recv(4096):
                buf += data
                while b"\r\n\r\n" in buf:
                    raw, buf = buf.split(b"\r\n\r\n", 1)
                    lines = raw.decode("utf-8", "replace").split("\r\n")
                    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                    cseq = f"CSeq: {headers.get('cseq', '1')}"
                    auth = headers.get("authorization")
                    if not challenge:
                        ffmpeg = headers.get("user-agent") != "edged"
                        self._connections += ffmpeg
                        digest = ffmpeg and self._connections % 2 == 0
                        challenge = f'Digest realm="x", nonce="{uuid.uuid4().hex}"' if digest else 'Basic realm="x"'
                    if auth is None:
                        reply = f"RTSP/1.0 401 Unauthorized\r\n{cseq}\r\nWWW-Authenticate: {challenge}\r\n\r\n"
                    else:
                        self.checked.append(self._verdict(lines[0].split(" ", 1)[0], auth))
                        reply = f"RTSP/1.0 404 Not Found\r\n{cseq}\r\n\r\n"
                    c.sendall(reply.encode())

    def close(self) -> None:
        self.srv.close()


def test_an_rtsp_password_from_a_file_reaches_the_camera_decoded(
    broker: Broker, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """The password from `password_file` is put into the RTSP URI percent-encoded; FFmpeg (through
    OpenCV) must decode it before it answers the camera's challenge, Basic and Digest alike."""
    secret = f"pw{uuid.uuid4().hex[:8]}@:/%?#&+ =!"  # each of these is percent-encoded in the URI
    cam = _RtspAuthChecker("viewer", secret)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "cam_porch").write_text(secret + "\n")
    try:
        cams = [
            {"name": "lobby", "uri": f"file://{demo.video}", "loop": True},
            {
                "name": "porch",
                "uri": f"rtsp://viewer@127.0.0.1:{cam.port}/cam",
                "password_file": "${CREDENTIALS_DIRECTORY}/cam_porch",
                "reconnect_max_s": 1,
            },
        ]
        cfg = write_config(tmp_path / "edged.yaml", base_config(broker, demo, tmp_path, cams))
        d = start_daemon(cfg, env={"CREDENTIALS_DIRECTORY": str(creds)})
        wait_until(
            lambda: {scheme for scheme, _, _ in cam.checked} >= {"Basic", "Digest"},
            60,
            f"FFmpeg's answers to a Basic and a Digest challenge (so far {cam.checked})\n" + d.output(),
        )
        assert d.stop(signal.SIGTERM) == 0
    finally:
        cam.close()
    wrong = [(scheme, sent) for scheme, right, sent in cam.checked if not right]
    assert not wrong, f"FFmpeg sent other credentials than viewer:{secret!r}: {wrong}"
    assert secret not in d.output()


def test_camera_credentials_reach_no_log_message_or_output(
    broker: Broker, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    user, secret = f"u{uuid.uuid4().hex[:10]}", f"pw{uuid.uuid4().hex[:12]}"
    refusing = free_port()  # an HTTP camera that answers 401 to these credentials
    closed = free_port()  # nothing listens: an RTSP camera that is refused
    server = mjpeg_server(refusing, "--auth", "someone:else")
    rtsp = _rtsp_refusing()  # answers, then refuses FFmpeg's open
    rtsp_port = rtsp.getsockname()[1]
    try:
        cams = [
            {"name": "lobby", "uri": f"file://{demo.video}", "loop": True},
            {"name": "door", "uri": f"http://{user}:{secret}@127.0.0.1:{refusing}/video", "reconnect_max_s": 1},
            {"name": "gate", "uri": f"rtsp://{user}:{secret}@127.0.0.1:{closed}/cam", "reconnect_max_s": 1},
            {"name": "porch", "uri": f"rtsp://{user}:{secret}@127.0.0.1:{rtsp_port}/cam", "reconnect_max_s": 1},
            {
                "name": "yard",  # a Jetson's GStreamer pipeline with the camera's URL in it
                "uri": f"gst://rtspsrc location=rtsp://{user}:{secret}@127.0.0.1:{closed}/cam ! decodebin ! appsink",
                "reconnect_max_s": 1,
            },
        ]
        cfg = write_config(tmp_path / "edged.yaml", base_config(broker, demo, tmp_path, cams))
        sub = subscribe(broker)
        d = start_daemon(cfg)
        wait_until(
            lambda: _cameras_failed(sub, ["door", "gate", "porch", "yard"]), 60, "telemetry with the cameras' errors"
        )
        wait_until(lambda: bool(sub.results("lobby")), 30, "results from the working camera")
        sub.client.publish("edged/test-01/cmd/status", b"{}", qos=1)
        wait_until(lambda: bool(sub.on("cmd/status/reply")), 10, "the status reply")
        # a reload with an invalid file: the reply carries the config error
        good = cfg.read_text()
        cfg.write_text(good.replace(f"{secret}@127.0.0.1:{closed}/", f"{secret}@127.0.0.1:{closed}: /", 1))
        sub.client.publish("edged/test-01/cmd/reload", b"{}", qos=1)
        wait_until(lambda: bool(sub.on("cmd/reload/reply")), 10, "the reload reply")
        cfg.write_text(good)
        assert d.stop(signal.SIGTERM) == 0
        retained = _retained(broker)
    finally:
        server.terminate()
        server.wait(10)
        rtsp.close()

    checked = edged_cli("check-config", "-c", str(cfg), "--no-model")
    bad_yaml = tmp_path / "bad-yaml.yaml"
    bad_yaml.write_text(good.replace(f"{secret}@127.0.0.1:{closed}/", f"{secret}@127.0.0.1:{closed}: /", 1))
    bad_scheme = tmp_path / "bad-scheme.yaml"
    bad_scheme.write_text(good.replace("rtsp://", "rstp://", 1))
    invalid = [edged_cli("check-config", "-c", str(p), "--no-model") for p in (bad_yaml, bad_scheme)]

    log = d.output()
    broker_text = "\n".join(f"{m.topic} {m.payload!r}" for m in sub.messages) + "\n".join(retained)
    outputs = {
        "daemon log": log,
        "messages on edged/#": broker_text,
        "check-config": checked.stdout + checked.stderr,
        "check-config, bad YAML": invalid[0].stdout + invalid[0].stderr,
        "check-config, bad scheme": invalid[1].stdout + invalid[1].stderr,
    }
    leaks = {where: text.count(secret) for where, text in outputs.items() if secret in text or user in text}
    assert not leaks, f"the camera's credentials leaked into: {leaks}"
    # each place does name the camera (by its host), so an empty message could not pass
    host = f"127.0.0.1:{refusing}"
    assert host in log and host in broker_text and host in checked.stdout, "the HTTP camera named by its host"
    assert f"127.0.0.1:{closed}" in log and f"127.0.0.1:{closed}" in broker_text
    reload_reply = sub.on("cmd/reload/reply")[-1].json()
    assert "config_invalid" in json.dumps(reload_reply)
    assert checked.returncode == 0
    assert invalid[0].returncode == 1 and "line" in invalid[0].stderr
    assert invalid[1].returncode == 1 and f"not rstp://***@127.0.0.1:{closed}/cam" in invalid[1].stderr
    assert "HTTP 401" in log
    assert f"127.0.0.1:{rtsp_port}" in broker_text, "the RTSP camera FFmpeg could not open named by its host"


def test_password_from_a_file(
    broker: Broker, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """`password_file` (e.g. `${CREDENTIALS_DIRECTORY}/cam_door`): the password reaches the camera at open
    time only; the YAML holds none, and the log shows none."""
    secret = f"pw{uuid.uuid4().hex[:12]}@:/%"  # characters a URI's userinfo cannot hold as they are
    port = free_port()
    server = mjpeg_server(port, "--auth", f"viewer:{secret}")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "cam_door").write_text(secret + "\n")
    try:
        cams = [
            {
                "name": "door",
                "uri": f"http://viewer@127.0.0.1:{port}/video",
                "password_file": "${CREDENTIALS_DIRECTORY}/cam_door",
            }
        ]
        cfg = write_config(tmp_path / "edged.yaml", base_config(broker, demo, tmp_path, cams))
        assert secret not in cfg.read_text()
        sub = subscribe(broker)
        d = start_daemon(cfg, env={"CREDENTIALS_DIRECTORY": str(creds)})
        wait_until(lambda: len(sub.results("door")) >= 3, 60, "results from the camera that needs the password")
        assert d.stop(signal.SIGTERM) == 0
    finally:
        server.terminate()
        server.wait(10)
    assert secret not in d.output() and secret[:14] not in d.output()
    assert f"camera door: up (http://***@127.0.0.1:{port}/video)" in d.output()
    checked = edged_cli("check-config", "-c", str(cfg), "--no-model", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert checked.returncode == 0, checked.stderr
    assert f"camera door: http://***@127.0.0.1:{port}/video (password from password_file)" in checked.stdout


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("rtsp://admin:s3cret@127.0.0.1:8554/cam", "rtsp://***@127.0.0.1:8554/cam"),
        ("http://admin@[::1]:8080/video", "http://***@[::1]:8080/video"),
        ("rtsp://127.0.0.1/cam", "rtsp://127.0.0.1/cam"),
        (
            "gst://rtspsrc location=rtsp://admin:s3cret@cam/1 user-pw=s3cret ! decodebin ! appsink",
            "gst://rtspsrc location=rtsp://***@cam/1 user-pw=*** ! decodebin ! appsink",
        ),
    ],
)
def test_display_form(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("rtsp://admin:s3cret@cam/1", "names the user and no password"),
        ("rtsp://cam/1", "names the user and no password"),
        ("file:///v.mp4", "password_file is for rtsp:// and http:// cameras"),
    ],
)
def test_password_file_needs_a_user_and_no_password_in_the_uri(tmp_path: Path, uri: str, problem: str) -> None:
    doc = {"device_id": "d", "model": {"name": "m"}, "cameras": [{"name": "a", "uri": uri, "password_file": "pw"}]}
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        load_config(write_config(tmp_path / "c.yaml", doc), environ={})
    assert "s3cret" not in str(err.value)
