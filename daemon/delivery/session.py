"""The device's MQTT session: one paho client, driven by our own supervised network thread.

- The network thread calls paho's `loop()`, so it reports progress for the watchdog
  (`network_alive`); a dead one is started again by the main loop (`restart_network`). It is the only
  thread that touches the socket (the client, daemon/delivery/client.py, queues what other threads publish
  and wakes it). Connection
  failures (refused, TLS, DNS) are logged once with the reason and retried with full-jitter backoff
  (a random wait up to 1 s doubling to `mqtt.reconnect_max_s`), so a fleet that lost its broker at the
  same instant does not knock again in step.
- The session is persistent: `clean_start` false and a `session_expiry_s` Session Expiry Interval, so
  the broker keeps our command subscription and paho resends unacknowledged messages after a reconnect.
- `status` is retained, with an `offline` last will; `stopped` is published on a clean stop. Retained
  state documents (`set_retained`: …/model/state) are published again at every connect.
- The CONNECT carries a Maximum Packet Size (`max_incoming_bytes`, the largest payload the daemon takes,
  plus `PACKET_HEADROOM`), so a conforming broker drops anything bigger before it is sent: junk on our
  topics never reaches paho, which reads every packet whole into memory.
- What comes in is the `Inbox`'s business (daemon/delivery/inbox.py): it names the subscriptions made at every
  connect and routes each message. Every subscription's SUBACK is checked: one the broker refuses (a reason
  code >= 0x80, e.g. 0x87 Not authorized by its ACL) is logged as an error naming the topic and the reason,
  and the retained status lists it (`refused_subscriptions`) until a later SUBACK grants it; a device that
  cannot hear its commands says so instead of looking healthy.
- The client is `DeviceClient` (daemon/delivery/client.py): paho with its per-PUBACK decoding and debug
  lines cut, and the publisher thread's packets written by the network thread.

`Publisher` (daemon/delivery/publisher.py) is this session plus the spool and the delivery of what goes out.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged import __version__
from edged.protocol import topics
from edged.protocol.client import MAX_PAYLOAD_BYTES, connect_properties, make_client, reconnect_backoff
from edged.protocol.schemas import dumps, iso, status_doc

from ..config import MqttConfig
from .client import DeviceClient
from .inbox import Inbox

# the MQTT log lines keep the logger name they had before the split (operators and tests grep for it)
logger = logging.getLogger("edged.daemon.delivery.publisher")


class Session:
    def __init__(
        self,
        cfg: MqttConfig,
        device_id: str,
        topic_root: str,
        boot_id: str,
        status_extra: Callable[[], dict[str, Any]],
        inbox: Inbox,
    ) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.root = topic_root
        self.boot_id = boot_id
        self._status_extra = status_extra
        self.inbox = inbox
        # the largest payload we take (commands, OTA chunks; set by the wiring before start()): sent to the
        # broker as our Maximum Packet Size, with PACKET_HEADROOM, so it never sends us a bigger one
        self.max_incoming_bytes: int | None = None
        self._retained: dict[str, bytes] = {}  # suffix -> payload, published again at every connect
        self.since = iso(time.time())
        self._stop = threading.Event()
        self._net_stop = threading.Event()
        self.oversized = 0
        self.connected = False
        self.connects = 0
        self.connect_failures = 0
        self.network_restarts = 0
        self.last_error = ""
        self.last_net_progress = time.monotonic()
        self.spool_state = "ok"  # "failing" while storage operations fail (the publisher's; status shows it)
        # topic filter -> (the broker's reason, its code) for each subscription its last SUBACK refused
        self.refused_subscriptions: dict[str, tuple[str, int]] = {}
        self._asked: dict[int, tuple[str, int]] = {}  # SUBSCRIBE message id -> (topic, QoS); network thread only
        client = make_client(
            cfg,
            cfg.client_id or f"edged-{device_id}",
            will=(topics.status(self.root), self._status_json("offline")),
            client_class=DeviceClient,
        )
        self.client = cast(DeviceClient, client)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_log = self._on_log
        self._disconnected = threading.Event()  # our DISCONNECT was written (or the connection was lost)
        self._closing = threading.Event()  # disconnect() was called: the network thread connects no more
        self._socket_error = ""
        self._net_thread = threading.Thread(target=self._network, name="mqtt-network", daemon=True)

    def topic(self, suffix: str) -> str:
        return f"{self.root}/{suffix}"

    def publish_status(self, state: str) -> mqtt.MQTTMessageInfo:
        """The retained `status` message (QoS 1): online, stopped; offline is the last will."""
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.MessageExpiryInterval = topics.STATUS_EXPIRY_S  # `edged fleet`: when the broker published it
        return self.client.publish(
            topics.status(self.root), self._status_json(state), qos=1, retain=True, properties=props
        )

    def _status_json(self, state: str) -> bytes:
        doc = status_doc(
            state,
            __version__,
            self.boot_id,
            self.since,
            self.spool_state,
            self._status_extra(),
            refused_subscriptions=dict(self.refused_subscriptions),
        )
        return json.dumps(doc).encode()

    # --- paho callbacks (network thread); no exception may escape ----------------------------
    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Properties | None
    ) -> None:
        if rc.is_failure:  # the broker closes the socket next; the network loop reports this reason once
            self.connected = False
            self._socket_error = f"the broker refused the connection: {rc}"
            return
        self.connected = True
        self._disconnected.clear()
        self.connects += 1
        self.last_error = ""
        logger.info(
            "mqtt: connected to %s:%d (session present: %s)",
            self.cfg.host,
            self.cfg.port,
            getattr(flags, "session_present", "?"),
        )
        self.publish_status("online")
        for suffix, payload in list(self._retained.items()):
            client.publish(self.topic(suffix), payload, qos=1, retain=True)
        self._asked.clear()  # a SUBACK of the last connection never comes now
        for topic, qos in self.inbox.subscriptions():
            sent, mid = client.subscribe(topic, qos=qos)
            if sent == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                self._asked[mid] = (topic, qos)  # its SUBACK comes on this thread, after this callback

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Properties | None
    ) -> None:
        if self.connected and not self._stop.is_set():
            logger.warning("mqtt: disconnected (%s); reconnecting with jittered backoff up to 60 s", rc)
        self.connected = False
        self._disconnected.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.inbox.dispatch(msg)

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, codes: list[ReasonCode], props: Properties | None
    ) -> None:
        asked = self._asked.pop(mid, None)
        if asked is None:
            return
        topic, qos = asked
        code = codes[0] if codes else None
        before = self.refused_subscriptions.get(topic)
        if code is None or code.is_failure:
            value = code.value if code is not None else 0x80
            reason = str(code) if code is not None else "a SUBACK without a reason code"
            self.refused_subscriptions[topic] = (reason, value)
            logger.error(
                "mqtt: the broker refused our subscription to %s: %s (0x%02x); messages on it do not reach this "
                "device (check the broker's ACL for this client)",
                topic,
                reason,
                value,
            )
        else:
            self.refused_subscriptions.pop(topic, None)
            if code.value < qos:
                logger.warning("mqtt: the broker granted %s at QoS %d, not %d", topic, code.value, qos)
        if self.refused_subscriptions.get(topic) != before:
            self.publish_status("online")  # the retained status says what is refused (or no longer)

    def _on_log(self, client: mqtt.Client, userdata: Any, level: int, buf: str) -> None:
        if level == mqtt.MQTT_LOG_ERR and buf.startswith("failed to receive on socket"):
            self._socket_error = buf  # e.g. "failed to receive on socket: [SSL: ...] sslv3 alert certificate revoked"

    def _connect_failed(self, reason: str) -> None:
        self.connect_failures += 1
        if reason != self.last_error:
            logger.error(
                "mqtt: cannot connect to %s:%d: %s; retrying with backoff up to 60 s",
                self.cfg.host,
                self.cfg.port,
                reason,
            )
        self.last_error = reason

    # --- the network thread ------------------------------------------------------------------------
    def _network(self) -> None:
        # full jitter: after a broker restart a fleet does not knock in step
        backoff = reconnect_backoff(self.cfg.reconnect_max_s)
        first = True
        socket_open = had_connack = False
        props = connect_properties(self.cfg.session_expiry_s, self.max_incoming_bytes)
        while not self._net_stop.is_set():
            self.last_net_progress = time.monotonic()
            if not socket_open:
                if self._closing.is_set():
                    break
                try:
                    if first:
                        self.client.connect(
                            self.cfg.host,
                            self.cfg.port,
                            keepalive=self.cfg.keepalive_s,
                            clean_start=False,
                            properties=props,
                        )
                        first = False
                    else:
                        self.client.reconnect()
                    socket_open = True
                except (OSError, ValueError) as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
                    self._connect_failed(str(exc) or type(exc).__name__)
                    self._net_stop.wait(backoff.next_s())
                    continue
            rc = self.client.loop(timeout=0.2)
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                if self.connected:
                    backoff.reset()
                    had_connack = True
                continue
            socket_open = False
            self.connected = False
            if self._net_stop.is_set() or self._closing.is_set():
                break  # (after our DISCONNECT, a reconnect would open a session whose close sends the will)
            if not had_connack:  # lost before the CONNACK: the broker refused us (a bad certificate, say)
                reason = self._socket_error or f"connection lost: {mqtt.error_string(rc)}"
                if self.cfg.tls is not None and "alert" not in reason:
                    # TLS 1.3: the broker checks our certificate after the handshake; its alert can be
                    # lost in the close, leaving only an EOF here
                    reason += (
                        f"; the broker closed the TLS session before accepting us: it probably rejected "
                        f"our client certificate {self.cfg.tls.cert_file} (expired, revoked, or not from "
                        f"its CA?)"
                    )
                self._connect_failed(reason)
            had_connack = False
            self._socket_error = ""
            self._net_stop.wait(backoff.next_s())

    def disconnect(self, timeout_s: float = 2.0) -> None:
        """Send DISCONNECT (so the broker drops our last will) and wait, up to `timeout_s`, for the network
        thread to write it; then stop that thread."""
        self._closing.set()
        was_connected = self.connected
        self.client.disconnect()
        if not self._net_thread.is_alive():
            self.client.loop_write()  # no network thread to write it: this one is the only writer
        elif was_connected:
            self._disconnected.wait(timeout_s)
        self._net_stop.set()
        self._net_thread.join(5.0)

    def network_alive(self) -> bool:
        return self._net_thread.is_alive() and time.monotonic() - self.last_net_progress < 10.0

    def restart_network(self) -> None:
        """Start a new network thread after the old one died (supervision from the main loop)."""
        if self._net_thread.is_alive():
            return
        self.network_restarts += 1
        logger.error("mqtt: the network thread died; starting a new one (%d restarts)", self.network_restarts)
        self._net_thread = threading.Thread(target=self._network, name="mqtt-network", daemon=True)
        self._net_thread.start()

    # --- what goes out without the spool ------------------------------------------------------
    def publish_direct(
        self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, properties: Properties | None = None
    ) -> bool:
        """Not spooled: telemetry, replies, snapshots. False when refused locally or not queued (no connection,
        paho's queue full); queued is not yet written: the network thread writes it (QoS 0: lost if the
        connection drops first)."""
        if len(payload) > MAX_PAYLOAD_BYTES:
            self.oversized += 1
            logger.error("mqtt: %s payload of %d bytes is over %d; not sent", topic, len(payload), MAX_PAYLOAD_BYTES)
            return False
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def route(self, suffix: str, handler: Callable[[mqtt.MQTTMessage], None]) -> None:
        """Subscribe (at every connect) to our topic `suffix` and hand its messages to `handler`, which runs
        on paho's network thread and must only queue. Call before start()."""
        self.inbox.route(suffix, handler)

    def set_retained(self, suffix: str, doc: dict[str, Any]) -> None:
        """A retained QoS 1 state document (…/model/state): published now and again at every connect."""
        payload = dumps(doc)
        self._retained[suffix] = payload
        if self.connected:
            self.client.publish(self.topic(suffix), payload, qos=1, retain=True)

    def publish_json(self, suffix: str, doc: dict[str, Any], qos: int = 0, retain: bool = False) -> bool:
        return self.publish_direct(self.topic(suffix), dumps(doc), qos, retain)
