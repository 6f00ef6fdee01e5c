"""The asker behind `edged diagnose` and `edged clips` (cli/ask.py) against a real mosquitto on 127.0.0.1, with
a device stand-in that answers the command contract (protocol/commands.py `reply_doc`) on the response topic it
is given: a reply is matched by its correlation data (a stale one is passed over), several asks share one
connection, a refusal carries its code, silence and an unreachable broker are errors that say so.

The full round trips through real daemons are in tests/test_diagnose.py and tests/test_clips_daemon.py."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.cli.ask import Asker
from edged.daemon.config import MqttConfig
from edged.errors import Code, CommandError, PublishError
from edged.protocol.commands import reply_doc
from tests.conftest import Broker, free_port

DEVICE = "dev-1"


class Device:
    """Answers ``edged/dev-1/cmd/<verb>``: `echo` with its arguments (after a stale reply under other
    correlation data), `refuse` with a refusal, `silent` not at all. `asked` keeps (topic, response topic,
    expiry) per command."""

    def __init__(self, broker: Broker) -> None:
        self.asked: list[tuple[str, str, int]] = []
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(f"edged/{DEVICE}/cmd/#", qos=1)
        self.c.on_subscribe = lambda *a: ready.set()
        self.c.on_message = self._on
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        assert ready.wait(10), "the device stand-in did not subscribe"

    def _on(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        verb = m.topic.rsplit("/", 1)[1]
        to, corr = m.properties.ResponseTopic, m.properties.CorrelationData  # type: ignore[union-attr]
        self.asked.append((m.topic, to, m.properties.MessageExpiryInterval))  # type: ignore[union-attr]
        if verb == "silent":
            return
        if verb == "refuse":
            doc = reply_doc(verb, error=CommandError(Code.NOT_FOUND, "no such clip"))
        else:
            self._reply(to, b"stale-" + corr, reply_doc(verb, {"stale": True}))
            doc = reply_doc(verb, {"args": json.loads(m.payload)})
        self._reply(to, corr, doc)

    def _reply(self, topic: str, corr: bytes, doc: dict[str, Any]) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.CorrelationData = corr
        self.c.publish(topic, json.dumps(doc).encode(), qos=1, properties=props)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def device(broker: Broker) -> Iterator[Device]:
    d = Device(broker)
    yield d
    d.close()


def test_asks_on_one_connection_get_their_own_replies(broker: Broker, device: Device) -> None:
    cfg = MqttConfig(host=broker.host, port=broker.port)
    with Asker(cfg, DEVICE, "clips", timeout_s=20) as asker:
        first = asker.ask("echo", {"limit": 5})
        second = asker.ask("echo", {"id": "x", "part": 1})
    assert first == {"args": {"limit": 5}} and second == {"args": {"id": "x", "part": 1}}
    assert [topic for topic, _, _ in device.asked] == [f"edged/{DEVICE}/cmd/echo"] * 2
    reply_topics = {to for _, to, _ in device.asked}
    assert len(reply_topics) == 1 and reply_topics.pop().startswith(f"edged/{DEVICE}/reply/clips-")
    assert {expiry for _, _, expiry in device.asked} == {20}  # never run after the asker stopped waiting


def test_a_refusal_a_silent_device_and_no_broker_are_errors_that_say_so(broker: Broker, device: Device) -> None:
    cfg = MqttConfig(host=broker.host, port=broker.port)
    with Asker(cfg, DEVICE, "diagnose", timeout_s=1.5) as asker:
        with pytest.raises(CommandError, match=f"^{DEVICE}: refuse: no such clip$") as refused:
            asker.ask("refuse", {})
        assert refused.value.code is Code.NOT_FOUND
        with pytest.raises(PublishError, match=re.escape(f"{DEVICE}: no reply to diagnose {{'lines': 3}} in 1.5 s")):
            asker.ask("silent", {"lines": 3}, "diagnose {'lines': 3}")
    nowhere = MqttConfig(host="127.0.0.1", port=free_port())
    with pytest.raises(PublishError, match=r"cannot reach the broker at 127\.0\.0\.1"):
        Asker(nowhere, DEVICE, "clips", timeout_s=5).__enter__()
