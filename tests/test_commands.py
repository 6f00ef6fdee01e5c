"""The command channel: strict parsing, a reply for every command, and the verbs end to end."""

from __future__ import annotations

import json
import signal
import time
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

from edged.daemon.commands import (
    MAX_COMMAND_BYTES,
    CommandError,
    Commands,
    NoArgs,
    parse_payload,
    response_topic_allowed,
)
from edged.models.demo import DemoAssets

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
        self.c.connect(host, port)
        self.c.subscribe(
            [("edged/test-01/reply/backend", 1), ("edged/test-01/snapshot/#", 0), ("edged/test-01/cmd/+/reply", 1)]
        )
        self.c.loop_start()
        time.sleep(0.3)
        self.n = 0

    def _on(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        corr = getattr(m.properties, "CorrelationData", None)
        if corr is not None:
            self.replies[bytes(corr)] = json.loads(m.payload)
        else:
            self.other.append(m)

    def send(self, verb: str, payload: bytes | str = b"{}", retain: bool = False) -> bytes:
        self.n += 1
        corr = f"req-{self.n}".encode()
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = "edged/test-01/reply/backend"  # the device's own reply namespace
        props.CorrelationData = corr
        self.c.publish(f"edged/test-01/cmd/{verb}", payload, qos=1, retain=retain, properties=props)
        return corr

    def call(self, verb: str, payload: bytes | str = b"{}", retain: bool = False) -> dict[str, Any]:
        corr = self.send(verb, payload, retain)
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
        time.sleep(1.0)
        n = len(sub.results())
        time.sleep(2.0)
        assert len(sub.results()) <= n + 1, "paused: no new results"
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

        # reload: a new threshold applies live; a camera change needs a restart
        changed = yaml.safe_load(cfg.read_text())
        changed["detection"]["score_threshold"] = 0.9
        changed["cameras"][0]["fps_max"] = 5
        cfg.write_text(yaml.safe_dump(changed))
        rel = cli.call("reload")
        assert rel["ok"] and "detection" in rel["result"]["applied"] and rel["result"]["restart_needed"] == ["cameras"]
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
        ("edged/_push/0123abcd/reply", True),
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
