#!/usr/bin/env python3
"""A results consumer that scales out: run N copies with the same --group and the broker splits the fleet's
results between them (an MQTT v5 shared subscription, ``$share/<group>/<prefix>/+/results/+``); each
result goes to one member of the group. Duplicates (QoS 1 is at least once) are dropped by
``(device, boot_id, seq)``. The session is persistent (a fixed --client-id, clean start off, a session
expiry): what arrives for this member while it restarts is kept for it by the broker.

    python examples/shared_consumer.py --host broker --port 8883 --group analytics --client-id analytics-1 \
        --ca pki/ca.crt --cert pki/backend.crt --key pki/backend.key

Needs only paho-mqtt 2.x. See docs/subscriber.md, Scaling out: shared subscriptions.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

Handler = Callable[[dict[str, Any]], None]


class SharedConsumer:
    """One member of a shared subscription to every device's results; `handle` gets each new result once."""

    def __init__(
        self,
        host: str,
        port: int,
        group: str,
        client_id: str,
        handle: Handler,
        prefix: str = "edged",
        tls: tuple[str, str, str] | None = None,
        session_expiry_s: int = 3600,
        receive_maximum: int = 100,
    ) -> None:
        self.topic = f"$share/{group}/{prefix}/+/results/+"
        self.handle = handle
        self.last_seq: dict[tuple[str, str], int] = {}  # (device, boot_id) -> highest seq handled
        self.duplicates = 0
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if tls is not None:
            ca, cert, key = tls
            self.client.tls_set(ca_certs=ca, certfile=cert, keyfile=key)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 30)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = session_expiry_s  # the broker keeps our share while we are away
        props.ReceiveMaximum = receive_maximum  # results in flight to us (mosquitto's default is 20)
        self.client.connect(host, port, clean_start=False, properties=props)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            print(f"connect refused: {reason}")
            return
        if not flags.session_present:  # a new session: subscribe (a kept one still has the subscription)
            client.subscribe(self.topic, qos=1)
        else:
            self.subscribed.set()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        if any(code.is_failure for code in codes):
            print(f"subscription to {self.topic} refused: {codes}")
            return
        self.subscribed.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            result = json.loads(msg.payload)
            key = (result["device"], result["boot_id"])
            seq = int(result["seq"])
        except (ValueError, KeyError, TypeError) as exc:
            print(f"{msg.topic}: not a result ({exc})")
            return
        if seq <= self.last_seq.get(key, 0):
            self.duplicates += 1  # a redelivery (QoS 1 is at least once)
            return
        self.last_seq[key] = seq
        self.handle(result)

    def start(self) -> None:
        self.client.loop_start()

    def run_forever(self) -> None:
        self.client.loop_forever()

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--group", default="results", help="the shared subscription's group: members split the load")
    ap.add_argument("--client-id", required=True, help="fixed per member, so its session survives a restart")
    ap.add_argument("--prefix", default="edged", help="the devices' mqtt.topic_prefix")
    ap.add_argument("--ca")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    args = ap.parse_args()
    tls = (args.ca, args.cert, args.key) if args.ca else None

    def show(result: dict[str, Any]) -> None:
        labels = [d["label"] for d in result.get("detections", [])]
        print(result["device"], result["camera"], result["seq"], result["captured_at"], labels)

    SharedConsumer(args.host, args.port, args.group, args.client_id, show, args.prefix, tls).run_forever()


if __name__ == "__main__":
    main()
