"""``edged push --cancel --device ID …``: the operator's side of the ``cancel`` command (DESIGN §6).

Each device named stops the transfer it runs (chunks over MQTT or a download over HTTP(S)), drops its files,
publishes ``cancelled`` on ``…/ota/status`` and then replies, on its own ``…/reply/_push/<id>`` (as it
answers an offer: the ACL lets a device answer only for itself). The command carries an MQTT v5 Message
Expiry Interval equal to the wait here, so a device that comes back later never cancels a newer push.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from typing import Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.errors import PublishError
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client
from edged.protocol.ota import CANCEL_VERB, cancel_payload

CANCEL_WAIT_S = 60.0  # what `edged push --cancel` waits for the devices' replies (a device answers once stopped)


def cancel(mqtt_cfg: MqttSettings, devices: list[str], out: TextIO, wait_s: float = CANCEL_WAIT_S) -> int:
    """``edged push --cancel --device ID …``: each device stops its running transfer, drops its files and
    publishes ``cancelled`` (the ``cancel`` command); one line per device with its reply. Exit status: 0 when
    every device cancelled one, 1 otherwise (nothing ran: ``no_transfer``; no reply within `wait_s`)."""
    prefix, cid = mqtt_cfg.topic_prefix, f"cancel-{uuid.uuid4().hex[:12]}"
    replies: dict[str, dict[str, Any]] = {}
    subscribed, lock = threading.Event(), threading.Lock()

    def on_message(client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        dev, _ = topics.split(prefix, msg.topic)
        if dev in devices and msg.topic == topics.push_reply(topics.device_root(prefix, dev), cid):
            try:
                doc = json.loads(msg.payload)
            except ValueError:
                return
            with lock:
                replies[dev] = doc if isinstance(doc, dict) else {}

    client = make_client(mqtt_cfg, f"edged-push-{cid}")
    client.on_message = on_message
    refused: list[str] = []

    def on_subscribe(client: mqtt.Client, userdata: Any, mid: int, codes: list[Any], props: Any) -> None:
        refused.extend(str(c) for c in codes if getattr(c, "is_failure", False))  # a SUBACK that refuses
        subscribed.set()

    client.on_subscribe = on_subscribe
    try:
        client.connect(mqtt_cfg.host, mqtt_cfg.port, keepalive=30)
    except OSError as exc:
        raise PublishError(f"cannot reach the broker at {mqtt_cfg.host}:{mqtt_cfg.port}: {exc}") from exc
    client.loop_start()
    try:
        client.subscribe(topics.push_replies(prefix, cid), qos=1)
        if not subscribed.wait(15.0):
            raise PublishError(f"the broker at {mqtt_cfg.host}:{mqtt_cfg.port} did not confirm our subscription")
        if refused:
            raise PublishError(
                f"the broker refused our subscription to the devices' replies ({', '.join(refused)}): "
                "check the ACL for this user"
            )
        for dev in devices:
            root = topics.device_root(prefix, dev)
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.ResponseTopic = topics.push_reply(root, cid)
            props.CorrelationData = dev.encode()
            props.MessageExpiryInterval = max(1, math.ceil(wait_s))  # never run after we stopped waiting
            info = client.publish(topics.command(root, CANCEL_VERB), cancel_payload(), qos=1, properties=props)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise PublishError(f"cannot send the cancel to {dev}: {mqtt.error_string(info.rc)}")
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            with lock:
                if len(replies) == len(devices):
                    break
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    failed = 0
    for dev in devices:
        doc = replies.get(dev)
        if doc is None:
            failed += 1
            print(f"  FAIL {dev:<20} no reply within {wait_s:.0f} s (offline? the cancel expires unread)", file=out)
        elif doc.get("ok"):
            r = doc.get("result") or {}
            model = r.get("model") or {}
            what = f"transfer {r.get('transfer')} of {model.get('name')}@{model.get('version')}"
            print(f"  ok   {dev:<20} cancelled {what}; its files dropped", file=out)
        else:
            failed += 1
            err = doc.get("error") or {}
            print(f"  FAIL {dev:<20} {err.get('code', '?')}: {err.get('message', '')}", file=out)
    print(f"push: cancel: {len(devices) - failed} of {len(devices)} device(s) cancelled a transfer", file=out)
    return 0 if failed == 0 else 1
