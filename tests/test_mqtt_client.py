"""The device's paho client (daemon/delivery/client.py) against a real mosquitto: a plain success PUBACK is
handed on without paho's per-PUBACK decoding, every other PUBACK (a refusal) as paho decodes it, paho's
per-message debug lines are not formatted for `on_log` unless a logger is attached, and packets published
by other threads are written by the network thread."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.delivery.client import _SUCCESS, DeviceClient

from .conftest import Broker, wait_until


def _client(broker: Broker, name: str, cls: type[mqtt.Client]) -> mqtt.Client:
    c = cls(CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    c.connect(broker.host, broker.port)
    c.loop_start()
    wait_until(c.is_connected, 10, f"{name} connected")
    return c


def test_pubacks_success_short_path_and_refusals_as_paho_decodes_them(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite ok/#\n")  # anonymous clients: ok/# only; no/# is refused (0x87)
    broker = Broker(tmp_path, extra=f"allow_anonymous true\nacl_file {acl}")
    broker.start()
    try:
        listener = _client(broker, "listener", mqtt.Client)
        subscribed = threading.Event()
        listener.on_subscribe = lambda *a: subscribed.set()
        listener.subscribe("ok/heard", qos=1)
        assert subscribed.wait(10)
        device = _client(broker, "device", DeviceClient)
        acks: dict[int, Any] = {}
        device.on_publish = lambda c, u, mid, rc, props: acks.__setitem__(mid, (rc, props))
        heard = device.publish("ok/heard", b"1", qos=1)  # a subscriber: Success (0)
        unheard = device.publish("ok/nobody", b"2", qos=1)  # none: No matching subscribers (16), a success
        refused = device.publish("no/way", b"3", qos=1)  # Not authorized (0x87)
        wait_until(lambda: len(acks) == 3, 10, f"3 PUBACKs, got {acks}")
        assert acks[heard.mid][0] is _SUCCESS[0x00] and acks[unheard.mid][0] is _SUCCESS[0x10]
        rc, _ = acks[refused.mid]
        assert rc.is_failure and rc.value == 0x87 and rc not in _SUCCESS.values(), rc
        assert heard.is_published() and unheard.is_published() and refused.is_published()
        assert not device._out_messages and device._inflight_messages == 0  # all released, as paho does
        for c in (device, listener):
            c.disconnect()
            c.loop_stop()
    finally:
        broker.stop()


def test_debug_lines_are_not_formatted_for_on_log_unless_a_logger_is_attached(broker: Broker) -> None:
    device = _client(broker, "device", DeviceClient)
    levels: list[Any] = []
    device.on_log = lambda c, u, level, buf: levels.append(level)
    device.publish("t/a", b"1", qos=1).wait_for_publish(10)
    assert mqtt.MQTT_LOG_DEBUG not in levels, levels
    logger = logging.getLogger("test.mqtt_client")
    logger.setLevel(logging.DEBUG)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        device.enable_logger(logger)
        device.publish("t/a", b"2", qos=1).wait_for_publish(10)
        assert any("Sending PUBLISH" in s for s in seen) and any("PUBACK" in s for s in seen), seen
    finally:
        logger.removeHandler(handler)
    device.disconnect()
    device.loop_stop()


def test_packets_published_by_another_thread_are_written_by_the_network_thread(broker: Broker) -> None:
    """As the session drives it (its own thread calling loop(), not paho's loop_start): a PUBLISH queued by
    another thread (the publisher's, a command's) is written by the network thread, never by its own."""
    device = DeviceClient(CallbackAPIVersion.VERSION2, client_id="device", protocol=mqtt.MQTTv5)
    writes: list[tuple[str, int]] = []
    send = device._sock_send

    def traced(buf: bytes | bytearray) -> int:
        writes.append((threading.current_thread().name, buf[0] & 0xF0))
        return send(buf)

    device._sock_send = traced  # type: ignore[method-assign]
    device.connect(broker.host, broker.port)
    stop = threading.Event()

    def network() -> None:
        while not stop.is_set():
            device.loop(timeout=0.2)

    net = threading.Thread(target=network, name="network")
    net.start()
    try:
        wait_until(device.is_connected, 10, "connected")
        infos: list[mqtt.MQTTMessageInfo] = []

        def publisher() -> None:
            infos.extend(device.publish("t/a", b"%d" % i, qos=1) for i in range(20))

        pub = threading.Thread(target=publisher, name="publisher")
        pub.start()
        pub.join()
        wait_until(lambda: all(i.is_published() for i in infos), 10, "20 PUBACKs")
    finally:
        stop.set()
        net.join(5)
        device.disconnect()
    publishes = [name for name, kind in writes if kind == 0x30]
    assert publishes == ["network"] * 20, publishes


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311])
def test_a_window_of_one_sends_every_queued_message_at_qos_1_and_2(broker: Broker, protocol: int) -> None:
    """What the short path leaves to paho still works: the next queued message goes on each PUBACK (QoS 1)
    and PUBCOMP (QoS 2, paho's own decoding), on MQTT v5 and v3.1.1 (paho's own decoding), and the
    in-flight count comes back to 0."""
    device = DeviceClient(CallbackAPIVersion.VERSION2, client_id="window", protocol=protocol)
    device.max_inflight_messages_set(1)
    device.connect(broker.host, broker.port)
    device.loop_start()
    try:
        wait_until(device.is_connected, 10, "connected")
        infos = [device.publish("t/a", b"%d" % i, qos=qos) for qos in (1, 2) for i in range(30)]
        wait_until(lambda: all(i.is_published() for i in infos), 20, "60 messages acknowledged")
        assert device._inflight_messages == 0 and not device._out_messages
    finally:
        device.disconnect()
        device.loop_stop()
