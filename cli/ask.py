"""Ask a verb of one device over MQTT and wait for its reply: the asker behind ``edged diagnose`` and ``edged clips``.

One connection subscribes to a response topic under the device's own ``…/reply/`` (what the shipped ACL lets a
device write) and sends each command with that topic, fresh correlation data and a Message Expiry Interval, so
none is run late; a reply is matched by its correlation data (a redelivered reply to an earlier ask is passed
over). Nothing of the device runtime is loaded.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.errors import CommandError, PublishError
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client


class Asker:
    """A connection that asks `device` for verbs, used as a context manager::

    with Asker(cfg, "orin-07", "clips", timeout_s=30) as asker:
        result = asker.ask(CLIPS_VERB, {"limit": 50})

    `name` goes into the response topic and the client id. Entering connects and waits for the broker to take
    the subscription (PublishError when it cannot be reached or refuses); leaving disconnects.
    """

    def __init__(self, cfg: MqttSettings, device: str, name: str, timeout_s: float) -> None:
        self.cfg = cfg
        self.device = device
        self.timeout_s = timeout_s
        self.root = topics.device_root(cfg.topic_prefix, device)
        self.reply_topic = f"{self.root}/reply/{name}-{uuid.uuid4().hex[:12]}"
        self._inbox: queue.Queue[tuple[bytes, bytes]] = queue.Queue()
        self._subscribed: queue.Queue[list[ReasonCode]] = queue.Queue()
        self._client = make_client(cfg, f"edged-{name}-{uuid.uuid4().hex[:10]}")
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = lambda c, u, mid, codes, p: self._subscribed.put(codes)
        self._client.on_message = lambda c, u, msg: self._inbox.put(
            (bytes(getattr(msg.properties, "CorrelationData", b"") or b""), bytes(msg.payload))
        )

    def _on_connect(self, c: mqtt.Client, u: Any, f: Any, rc: ReasonCode, p: Properties | None) -> None:
        if not rc.is_failure:
            c.subscribe(self.reply_topic, qos=1)

    def __enter__(self) -> Asker:
        cfg = self.cfg
        try:
            self._client.connect(cfg.host, cfg.port, keepalive=30)
        except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise PublishError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {exc}") from exc
        self._client.loop_start()
        try:
            try:
                codes = self._subscribed.get(timeout=self.timeout_s)
            except queue.Empty:
                raise PublishError(f"the broker at {cfg.host}:{cfg.port} did not take our subscription") from None
            if any(c.is_failure for c in codes):
                raise PublishError(
                    f"the broker refused our subscription to {self.reply_topic}: check its ACL for this user"
                )
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._close()

    def _close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def ask(self, verb: str, args: dict[str, Any], what: str | None = None) -> dict[str, Any]:
        """Send `verb` with `args` and wait for its reply; the reply's result. CommandError when the device
        refuses (its code and message), PublishError when no reply comes in time. `what` names the ask in
        that error (default: the verb)."""
        corr = uuid.uuid4().hex.encode()
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = corr
        props.MessageExpiryInterval = max(1, int(self.timeout_s))
        self._client.publish(topics.command(self.root, verb), json.dumps(args).encode(), qos=1, properties=props)
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            try:
                got, payload = self._inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if got != corr:  # a redelivered reply to an earlier ask
                continue
            doc = json.loads(payload)
            if not doc.get("ok"):
                err = doc.get("error") or {}
                raise CommandError(str(err.get("code", "failed")), f"{self.device}: {verb}: {err.get('message')}")
            result: dict[str, Any] = doc["result"]
            return result
        raise PublishError(
            f"{self.device}: no reply to {what or verb} in {self.timeout_s:g} s (is it online? `edged fleet` says; "
            "is this the backend's identity? the shipped ACL lets only the backend send commands)"
        )
