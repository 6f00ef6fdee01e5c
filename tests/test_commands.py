"""The command channel: strict parsing, a reply for every command, and the verbs end to end."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel, ConfigDict

from edged.daemon.delivery.commands import Commands, NoArgs
from edged.errors import CommandError
from edged.models.demo import DemoAssets
from edged.protocol.commands import MAX_COMMAND_BYTES, parse_payload
from edged.protocol.topics import response_topic_allowed

from .conftest import base_config, free_port, wait_until, write_config


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xff\xfe{}", "not_utf8"),
        (b"{not json", "invalid_json"),
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b'{"a": NaN}', "not_a_number"),
        (b'{"a": -Infinity}', "not_a_number"),
        (b"[" * 40 + b"]" * 40, "too_deep"),
        (b'{"a":' * 17 + b"1" + b"}" * 17, "too_deep"),
        (b"[1, 2]", "not_an_object"),
        (b"x" * (MAX_COMMAND_BYTES + 1), "too_large"),
    ],
)
def test_strict_parsing(payload: bytes, code: str) -> None:
    with pytest.raises(CommandError) as exc:
        parse_payload(payload)
    assert exc.value.code == code


class Camera(BaseModel):
    model_config = ConfigDict(extra="forbid")
    camera: str


def commands() -> Commands:
    c = Commands("edged/dev", lambda topic, payload, props: None)
    c.register("status", NoArgs, lambda a: {"ok": 1}, idempotent=True)
    c.register("snapshot", Camera, lambda a: {"camera": a.camera}, idempotent=False)
    return c


def test_verbs_arguments_and_retained() -> None:
    c = commands()
    assert c.execute("status", b"{}", retained=True) == {"ok": 1}
    with pytest.raises(CommandError, match=r"send \{\} for no arguments"):
        c.execute("status", b"")
    assert c.execute("snapshot", b'{"camera": "dock"}') == {"camera": "dock"}
    for verb, payload, retained, code in [
        ("reboot", b"{}", False, "unknown_verb"),
        ("snapshot", b'{"camera": 3}', False, "invalid_arguments"),
        ("snapshot", b'{"camera": "a", "x": 1}', False, "invalid_arguments"),
        ("snapshot", b"{}", False, "invalid_arguments"),
        ("snapshot", b'{"camera": "a"}', True, "retained_ignored"),
    ]:
        with pytest.raises(CommandError) as exc:
            c.execute(verb, payload, retained)
        assert exc.value.code == code, (verb, payload)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["status", "snapshot", "nope", ""]), st.binary(max_size=2048), st.booleans())
def test_arbitrary_bytes_only_ever_give_a_result_or_a_command_error(verb: str, payload: bytes, retained: bool) -> None:
    try:
        out = commands().execute(verb, payload, retained)
    except CommandError as exc:
        assert exc.code
    else:
        assert isinstance(out, dict)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids), max_leaves=30))  # fmt: skip
def test_arbitrary_json_values(value: Any) -> None:
    try:
        data = json.dumps(value).encode()
    except ValueError:
        return
    try:
        commands().execute("snapshot", data)
    except CommandError as exc:
        assert exc.code in {"not_a_number", "not_an_object", "invalid_arguments", "too_deep", "too_large", "empty"}


class Client:
    """A backend-side MQTT v5 client that sends commands with a response topic and correlation data."""

    def __init__(self, host: str, port: int) -> None:
        self.replies: dict[bytes, dict[str, Any]] = {}
        self.other: list[mqtt.MQTTMessage] = []
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"backend-{free_port()}", protocol=mqtt.MQTTv5)
        self.c.on_message = self._on
        subscribed = threading.Event()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.c.connect(host, port)
        self.c.subscribe(
            [("edged/test-01/reply/backend", 1), ("edged/test-01/snapshot/#", 0), ("edged/test-01/cmd/+/reply", 1)]
        )
        self.c.loop_start()
        assert subscribed.wait(10), "the backend client could not subscribe"
        self.n = 0

    def _on(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        corr = getattr(m.properties, "CorrelationData", None)
        if corr is not None:
            self.replies[bytes(corr)] = json.loads(m.payload)
        else:
            self.other.append(m)

    def send(self, verb: str, payload: bytes | str = b"{}", retain: bool = False, expiry_s: int | None = None) -> bytes:
        self.n += 1
        corr = f"req-{self.n}".encode()
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = "edged/test-01/reply/backend"  # the device's own reply namespace
        props.CorrelationData = corr
        if expiry_s is not None:
            props.MessageExpiryInterval = expiry_s
        self.c.publish(f"edged/test-01/cmd/{verb}", payload, qos=1, retain=retain, properties=props)
        return corr

    def call(
        self, verb: str, payload: bytes | str = b"{}", retain: bool = False, expiry_s: int | None = None
    ) -> dict[str, Any]:
        corr = self.send(verb, payload, retain, expiry_s)
        wait_until(lambda: corr in self.replies, 10, f"a reply to {verb}")
        return self.replies[corr]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_commands_end_to_end(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    sub = subscribe(broker, "edged/test-01/results/#")
    doc = base_config(broker, demo, tmp_path, [{"name": "cam", "uri": "synthetic://?fps=10", "fps_max": 10}])
    cfg = write_config(tmp_path / "c.yaml", doc)
    cli = Client(broker.host, broker.port)
    stale = cli.send("reload", retain=True)  # a retained command, waiting for the device to subscribe
    d = start_daemon(cfg)
    wait_until(lambda: len(sub.results()) > 5, 60, "results")
    try:
        wait_until(lambda: stale in cli.replies, 10, "a reply to the retained command")
        assert cli.replies[stale]["error"]["code"] == "retained_ignored"
        cli.c.publish("edged/test-01/cmd/reload", b"", qos=1, retain=True)  # clear the retained message
        st_ = cli.call("status")
        assert st_["ok"] and st_["result"]["cameras"] == {"cam": "up"} and st_["result"]["paused"] is False

        assert cli.call("pause")["result"] == {"paused": True}
        paused_at = datetime.now(timezone.utc)
        time.sleep(2.0)
        n = len(sub.results())

        def captured(r: dict[str, Any]) -> datetime:
            return datetime.strptime(r["captured_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)

        # judged by when each frame was captured, not when its result arrived (delivery lags under load):
        # nothing captured after the pause (one frame in flight at the pause, at most)
        late = [r["seq"] for r in sub.results() if captured(r) > paused_at]
        assert len(late) <= 1, f"paused: results captured after the pause: {late}"
        assert cli.call("resume")["result"] == {"paused": False}
        wait_until(lambda: len(sub.results()) > n + 5, 10, "results after resume")

        snap = cli.call("snapshot", '{"camera": "cam"}')
        assert snap["ok"] and snap["result"]["topic"] == "edged/test-01/snapshot/cam"
        wait_until(lambda: any(m.topic.endswith("snapshot/cam") for m in cli.other), 10, "the JPEG")
        jpg = next(m for m in cli.other if m.topic.endswith("snapshot/cam")).payload
        img = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape == (360, 640, 3)
        assert cli.call("snapshot", '{"camera": "cam"}')["error"]["code"] == "rate_limited"
        assert cli.call("snapshot", '{"camera": "nope"}')["error"]["code"] == "unknown_camera"

        bad = {
            "not_utf8": b"\xc3\x28", "invalid_json": b"{", "duplicate_key": b'{"camera":"a","camera":"b"}',
            "not_a_number": b'{"x": NaN}', "too_deep": b"[" * 30 + b"]" * 30, "too_large": b" " * 17000,
            "invalid_arguments": b'{"camera": 5}',
        }  # fmt: skip
        for code, payload in bad.items():
            assert cli.call("snapshot", payload)["error"]["code"] == code
        assert cli.call("reboot")["error"]["code"] == "unknown_verb"

        # reload: a new threshold applies live; so does a camera's fps_max (the camera reopens with it)
        changed = yaml.safe_load(cfg.read_text())
        changed["detection"]["score_threshold"] = 0.9
        changed["cameras"][0]["fps_max"] = 5
        cfg.write_text(yaml.safe_dump(changed))
        rel = cli.call("reload")
        assert rel["ok"] and "detection" in rel["result"]["applied"] and rel["result"]["restart_needed"] == []
        assert rel["result"]["reopened"] == ["cam"]
        cfg.write_text("device_id: [broken")
        assert cli.call("reload")["error"]["code"] == "config_invalid"
        d.proc.send_signal(signal.SIGHUP)  # SIGHUP reloads too; a broken file keeps the running config
        wait_until(lambda: "SIGHUP: config not reloaded" in d.output(), 10, "the SIGHUP reload")

        # a reply without a response topic goes to …/cmd/<verb>/reply; the daemon still serves
        cli.c.publish("edged/test-01/cmd/status", b"{}", qos=1)
        wait_until(lambda: any(m.topic == "edged/test-01/cmd/status/reply" for m in cli.other), 10, "plain reply")
        n = len(sub.results())
        wait_until(lambda: len(sub.results()) > n + 5, 10, "still serving")
    finally:
        cli.close()
    assert d.stop() == 0


def test_fuzzed_commands_over_mqtt_each_get_a_reply(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    sub = subscribe(broker, "edged/test-01/results/#")
    doc = base_config(broker, demo, tmp_path, [{"name": "cam", "uri": "synthetic://?fps=10", "fps_max": 10}])
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    wait_until(lambda: len(sub.results()) > 3, 60, "results")
    cli = Client(broker.host, broker.port)
    sent: list[bytes] = []

    @settings(max_examples=80, deadline=None, database=None)
    @given(st.sampled_from(["status", "snapshot", "reload", "pause", "resume", "x", "cmd"]), st.binary(max_size=600))
    def send(verb: str, payload: bytes) -> None:
        if verb in ("pause", "reload"):
            verb = "status"  # keep the daemon serving and its config as it is
        sent.append(cli.send(verb, payload))

    try:
        send()
        wait_until(lambda: all(c in cli.replies for c in sent), 30, "a reply to every fuzzed command")
        n = len(sub.results())
        wait_until(lambda: len(sub.results()) > n + 3, 10, "still serving")
    finally:
        cli.close()
    assert all(r["schema"] == "edged.reply/1" and isinstance(r["ok"], bool) for r in cli.replies.values())
    assert d.stop() == 0 and "Traceback" not in d.output()


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("edged/dev/reply/backend", True),
        ("edged/dev/reply/a/b", True),
        ("edged/dev/reply/_push/0123abcd", True),  # an `edged push` offer's
        ("edged/_push/0123abcd/reply", False),  # the shared push reply topic older pushers named
        ("edged/other/reply/_push/0123abcd", False),  # another device's answer to a push
        ("edged/other/reply/x", False),  # another device's reply namespace
        ("edged/other/results/cam", False),
        ("edged/dev/results/cam", False),  # the device's own results: not a reply topic
        ("edged/dev/reply", False),
        ("$SYS/broker/x", False),
        ("backend/replies", False),
        ("edged/_push/a/b/reply", False),
        ("edged/_push/../reply", False),
        ("x/edged/_push/a/reply", False),
        ("edged/dev/reply/+", False),
        ("edged/dev/reply/#", False),
        ("edged/dev/reply/\x00", False),
        ("edged/dev/reply/" + "x" * 2000, False),
        ("", False),
    ],
)
def test_response_topics_are_confined_to_the_devices_own(topic: str, allowed: bool) -> None:
    assert response_topic_allowed(topic, "edged/dev") is allowed


NOW = datetime(2026, 11, 30, 14, 0, 0, tzinfo=timezone.utc)


def test_expires_at_in_the_payload() -> None:
    ran: list[bool] = []
    c = Commands("edged/dev", lambda topic, payload, props: None, wall=lambda: NOW)

    def pause(_: NoArgs) -> dict[str, Any]:
        ran.append(True)
        return {"paused": True}

    c.register("pause", NoArgs, pause, idempotent=True)
    for stale in ["2026-11-30T13:59:59Z", "2026-11-30T14:00:00+00:00", "2026-11-30T15:59:00+02:00"]:
        with pytest.raises(CommandError, match="expired at 2026-11-30T1") as exc:
            c.execute("pause", json.dumps({"expires_at": stale}).encode())
        assert exc.value.code == "expired"
    assert not ran
    # fresh: taken out of the payload before the verb's own (strict, no-arguments) schema is checked
    assert c.execute("pause", b'{"expires_at": "2026-11-30T14:00:05Z"}') == {"paused": True}
    assert c.execute("pause", b'{"expires_at": "2026-11-30T16:00:05+02:00"}') == {"paused": True}
    for bad, why in [("2026-11-30T14:05:00", "no UTC offset"), ("soon", "not an ISO-8601"), (1764511200, "string")]:
        with pytest.raises(CommandError, match=why) as exc:
            c.execute("pause", json.dumps({"expires_at": bad}).encode())
        assert exc.value.code == "invalid_arguments"


def _message(verb: str, corr: bytes, expiry_s: int | None) -> mqtt.MQTTMessage:
    m = mqtt.MQTTMessage(topic=f"edged/dev/cmd/{verb}".encode())
    m.payload = b"{}"
    m.properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    m.properties.CorrelationData = corr
    if expiry_s is not None:
        m.properties.MessageExpiryInterval = expiry_s
    return m


def test_a_command_whose_expiry_interval_runs_out_while_it_waits_on_the_device_is_not_run() -> None:
    """The broker drops what expires in its queue; one that arrived in time but waited here behind a slow
    command (a reload, an OTA offer) past its Message Expiry Interval is refused too."""
    now = [100.0]
    replies: dict[bytes, dict[str, Any]] = {}
    release, ran = threading.Event(), []

    def reply(topic: str, payload: bytes, props: Properties | None) -> None:
        replies[bytes(props.CorrelationData)] = json.loads(payload)  # type: ignore[union-attr]

    c = Commands("edged/dev", reply, clock=lambda: now[0])
    c.register("slow", NoArgs, lambda a: {"done": release.wait(10)}, idempotent=False)

    def verb(name: str) -> Callable[[NoArgs], dict[str, Any]]:
        def run(_: NoArgs) -> dict[str, Any]:
            ran.append(name)
            return {}

        return run

    c.register("rollback", NoArgs, verb("rollback"), idempotent=False)
    c.register("status", NoArgs, verb("status"), idempotent=True)
    c.start()
    try:
        c.on_message(_message("slow", b"1", None))
        c.on_message(_message("rollback", b"2", 2))  # 2 s left when it reached the device
        c.on_message(_message("status", b"3", 600))
        now[0] += 3.5  # the slow command held the thread past the rollback's expiry
        release.set()
        wait_until(lambda: len(replies) == 3, 10, "three replies")
    finally:
        c.stop()
    assert replies[b"1"]["ok"] and replies[b"3"]["ok"]
    assert replies[b"2"]["error"]["code"] == "expired"
    assert "Message Expiry Interval" in replies[b"2"]["error"]["message"]
    assert ran == ["status"]


def test_commands_expire_end_to_end(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    """(a) a command queued in the device's persistent session with a 2 s Message Expiry Interval while the
    device is stopped is never run; (b) a payload `expires_at` in the past is refused with `expired`;
    (c) a fresh one runs."""
    sub = subscribe(broker, "edged/test-01/#")
    doc = base_config(broker, demo, tmp_path, [{"name": "cam", "uri": "synthetic://?fps=10", "fps_max": 10}])
    cfg = write_config(tmp_path / "c.yaml", doc)
    cli = Client(broker.host, broker.port)
    try:
        d = start_daemon(cfg)  # the first start creates the device's persistent session (cmd/+ subscribed)
        wait_until(lambda: len(sub.results()) > 2, 60, "results")
        assert d.stop() == 0
        sent = time.monotonic()
        late = cli.send("pause", expiry_s=2)  # waits in the session while the device is stopped
        kept = cli.send("status", expiry_s=600)  # the control: the session does queue commands
        wait_until(lambda: time.monotonic() - sent > 3.0, 5, "the pause's expiry to pass")
        d = start_daemon(cfg)
        wait_until(lambda: kept in cli.replies, 60, "the queued status command's reply")
        assert late not in cli.replies, cli.replies[late]
        assert cli.call("status")["result"]["paused"] is False
        assert "paused by command" not in d.output()

        past = (datetime.now(timezone.utc) - timedelta(seconds=30)).isoformat()
        stale = cli.call("pause", json.dumps({"expires_at": past}))
        assert stale["ok"] is False and stale["error"]["code"] == "expired", stale
        assert "was not run" in stale["error"]["message"]
        assert cli.call("status")["result"]["paused"] is False

        future = (datetime.now(timezone.utc) + timedelta(seconds=60)).isoformat().replace("+00:00", "Z")
        assert cli.call("pause", json.dumps({"expires_at": future})) == {
            "schema": "edged.reply/1", "verb": "pause", "ok": True, "result": {"paused": True}
        }  # fmt: skip
        assert cli.call("resume", b"{}", expiry_s=30)["result"] == {"paused": False}
    finally:
        cli.close()
    assert d.stop() == 0


def _video_4k(path: Path, demo: DemoAssets) -> Path:
    """A 3840x2160 MJPEG AVI: demo video frames upscaled with sensor-like noise, so that each frame's JPEG at
    quality 80 is as big as a real 4K camera's (about 420 KiB; a plain upscale or the synthetic gradient
    compresses far too well)."""
    cap = cv2.VideoCapture(str(demo.video))
    rng = np.random.default_rng(7)
    out = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 5, (3840, 2160))
    for _ in range(3):
        ok, img = cap.read()
        assert ok
        big = np.asarray(cv2.resize(img, (3840, 2160), interpolation=cv2.INTER_CUBIC), np.int16)
        big += rng.normal(0, 8, big.shape).astype(np.int16)
        out.write(np.clip(big, 0, 255).astype(np.uint8))
    out.release()
    cap.release()
    return path


def test_snapshot_of_a_4k_camera_fits_the_cap(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    from edged.protocol.client import MAX_PAYLOAD_BYTES

    video = _video_4k(tmp_path / "4k.avi", demo)
    first = cv2.VideoCapture(str(video)).read()[1]
    assert first.shape == (2160, 3840, 3)
    full = len(cv2.imencode(".jpg", first, [cv2.IMWRITE_JPEG_QUALITY, 80])[1])
    assert full > MAX_PAYLOAD_BYTES, f"the test frame's JPEG ({full} bytes) must be over the cap to mean anything"
    # full-resolution frames (a camera scaled in a GStreamer pipeline snapshots its model-sized picture)
    cam = {"name": "uhd", "uri": f"file://{video}", "loop": True, "fps_max": 2, "scale_in_pipeline": False}
    sub = subscribe(broker, "edged/test-01/results/#")
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, [cam])))
    cli = Client(broker.host, broker.port)
    try:
        wait_until(lambda: len(sub.results()) > 0, 60, "a result from the 4K camera")
        snap = cli.call("snapshot", '{"camera": "uhd"}')
        assert snap["ok"], snap
        r = snap["result"]
        assert r["source"] == {"width": 3840, "height": 2160}
        assert r["bytes"] <= MAX_PAYLOAD_BYTES and (r["quality"] < 80 or r["scale"] < 1.0), r
        wait_until(lambda: any(m.topic.endswith("snapshot/uhd") for m in cli.other), 10, "the JPEG")
        jpg = next(m for m in cli.other if m.topic.endswith("snapshot/uhd")).payload
        assert len(jpg) == r["bytes"] <= MAX_PAYLOAD_BYTES
        img = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape == (r["height"], r["width"], 3)
        assert img.shape[1] == round(3840 * r["scale"])
    finally:
        cli.close()
    assert d.stop() == 0


def test_fit_jpeg_lowers_the_quality_then_scales() -> None:
    from edged.daemon.scene.draw import fit_jpeg

    rng = np.random.default_rng(3)
    noisy = rng.integers(0, 256, (2160, 3840, 3), dtype=np.uint8)  # the worst case: nothing compresses
    j = fit_jpeg(noisy, 256 * 1024)
    assert j.quality == 50 and j.scale < 0.5 and len(j.data) <= 256 * 1024
    img = cv2.imdecode(np.frombuffer(j.data, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.shape == (j.height, j.width, 3) and j.width == round(3840 * j.scale)
    flat = np.full((2160, 3840, 3), 90, np.uint8)
    assert fit_jpeg(flat, 256 * 1024).quality == 80 and fit_jpeg(flat, 256 * 1024).scale == 1.0
    with pytest.raises(CommandError, match="does not fit 2000 bytes") as exc:
        fit_jpeg(noisy, 2000)
    assert exc.value.code == "too_large"
