"""Results, events, status and telemetry over MQTT v5 with paho-mqtt 2.x (DESIGN.md §2, §4).

    inference ──submit()──> bounded queue ──publisher thread──> spool (SQLite WAL) ──> paho ──> broker
                                                         PUBACK deletes the row <──┘

- `submit()` never blocks: a full queue drops the result (counted).
- The publisher thread numbers results (`seq`, +1 per spooled result within a `boot_id`), refuses a
  payload over `MAX_PAYLOAD_BYTES` locally (so one message can never become a reconnect loop),
  appends to the spool, commits in groups, hands at most `max_inflight` rows to paho, and deletes a
  row when its PUBACK arrives. Rows still spooled at a restart are sent again.
- Our own network thread drives paho (`loop()`), so it is supervised: it reports progress for the
  watchdog, and connection failures (refused, TLS, DNS) are logged once with the reason and retried
  with backoff from 1 s doubling to 60 s, never in a tight loop.
- The session is persistent: `clean_start` false and a `session_expiry_s` Session Expiry Interval,
  so the broker keeps our command subscription and paho resends unacknowledged messages after a
  reconnect.
- `status` is retained, with an `offline` last will; `stopped` is published on a clean stop.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged import __version__
from edged.errors import ConfigError

from .config import MqttConfig, SpoolConfig
from .inference import Result
from .spool import Spool

logger = logging.getLogger(__name__)

RESULT_SCHEMA = "edged.result/1"
MAX_PAYLOAD_BYTES = 256 * 1024
MessageHandler = Callable[[mqtt.MQTTMessage], None]


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def result_payload(r: Result, device: str, boot_id: str, seq: int) -> dict[str, Any]:
    t = r.meta.transform
    return {
        "schema": RESULT_SCHEMA,
        "device": device,
        "camera": r.camera,
        "boot_id": boot_id,
        "seq": seq,
        "frame": r.meta.frame,
        "captured_at": iso(r.meta.captured_at),
        "latency_ms": {"capture_to_result": round(r.capture_to_result_ms, 2), "infer": round(r.infer_ms, 2)},
        "model": {"name": r.model_name, "version": r.model_version},
        "image": {"width": t.src_width, "height": t.src_height},
        "detections": [d.to_json() for d in r.detections],
    }


def make_client(cfg: MqttConfig, client_id: str) -> mqtt.Client:
    """A paho client set up from config: MQTT v5, TLS and credentials from files."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if cfg.tls is not None:
        for f in (cfg.tls.ca_file, cfg.tls.cert_file, cfg.tls.key_file):
            if f is not None and not f.is_file():
                raise ConfigError(f"mqtt.tls: {f} not found")
        try:
            client.tls_set(
                ca_certs=str(cfg.tls.ca_file),
                certfile=str(cfg.tls.cert_file) if cfg.tls.cert_file else None,
                keyfile=str(cfg.tls.key_file) if cfg.tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"mqtt.tls: cannot load the certificates: {exc}") from exc
        client.tls_insecure_set(cfg.tls.insecure_skip_hostname)
    if cfg.username is not None:
        password = None
        if cfg.password_file is not None:
            try:
                password = cfg.password_file.read_text().rstrip("\n")
            except OSError as exc:
                raise ConfigError(f"mqtt.password_file: cannot read {cfg.password_file}: {exc.strerror}") from exc
        client.username_pw_set(cfg.username, password)
    client.max_inflight_messages_set(cfg.max_inflight)
    client.max_queued_messages_set(cfg.max_inflight * 2)
    return client


class Publisher:
    def __init__(
        self,
        cfg: MqttConfig,
        spool_cfg: SpoolConfig,
        spool: Spool,
        device_id: str,
        topic_root: str,
        boot_id: str,
        status_extra: Callable[[], dict[str, Any]],
        on_command: MessageHandler | None = None,
        queue_size: int = 1024,
    ) -> None:
        self.cfg = cfg
        self.spool_cfg = spool_cfg
        self.spool = spool
        self.device_id = device_id
        self.root = topic_root
        self.boot_id = boot_id
        self._status_extra = status_extra
        self._on_command = on_command
        self._routes: dict[str, MessageHandler] = {}  # full topic -> handler, for topics other than cmd/+
        self._retained: dict[str, bytes] = {}  # suffix -> payload, published again at every connect
        self.since = iso(time.time())
        self._q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._net_stop = threading.Event()
        self.seq = 0
        self.spooled = 0
        self.published = 0
        self.acked = 0
        self.dropped_queue_full = 0
        self.oversized = 0
        self.connected = False
        self.connects = 0
        self.connect_failures = 0
        self.network_restarts = 0
        self.last_error = ""
        self.last_net_progress = time.monotonic()
        # paho mid -> spool row id; touched by the publisher thread only. PUBACKs arrive on the network
        # thread as mids in `_acked_mids` (deque appends are atomic), matched on the publisher thread
        # after the mid is recorded, so no lock is held around paho's own (lock order: no deadlock).
        self._inflight: dict[int, int] = {}
        self._acked_mids: deque[int] = deque()
        self._wake = threading.Event()  # set by submit() and by PUBACKs: the publisher thread has work
        self._ack_batch = max(1, cfg.max_inflight // 4)
        self._last_sent = 0
        self._maybe_unsent = True  # committed rows past _last_sent may exist (after a commit, or at start)
        self.client = make_client(cfg, cfg.client_id or f"edged-{device_id}")
        self.client.will_set(self.topic("status"), self._status_json("offline"), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.on_log = self._on_log
        self._socket_error = ""
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._net_thread = threading.Thread(target=self._network, name="mqtt-network", daemon=True)

    def topic(self, suffix: str) -> str:
        return f"{self.root}/{suffix}"

    def publish_status(self, state: str) -> mqtt.MQTTMessageInfo:
        """The retained `status` message (QoS 1): online, stopped; offline is the last will."""
        return self.client.publish(self.topic("status"), self._status_json(state), qos=1, retain=True)

    def _status_json(self, state: str) -> bytes:
        doc = {"state": state, "version": __version__, "boot_id": self.boot_id, "since": self.since}
        doc.update(self._status_extra())
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
        if self._on_command is not None:
            client.subscribe(self.topic("cmd/+"), qos=1)
        for topic in self._routes:
            client.subscribe(topic, qos=0)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Properties | None
    ) -> None:
        if self.connected and not self._stop.is_set():
            logger.warning("mqtt: disconnected (%s); reconnecting with backoff 1-60 s", rc)
        self.connected = False

    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, rc: ReasonCode, props: Properties | None
    ) -> None:
        self._acked_mids.append(mid)  # matched to a spool row by the publisher thread
        if len(self._acked_mids) >= self._ack_batch:  # wake the publisher for a batch, not for each PUBACK
            self._wake.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        handler = self._routes.get(msg.topic, self._on_command)
        if handler is None:
            return
        try:
            handler(msg)
        except Exception:  # the handler must not raise; if it does, it must not reach paho
            logger.exception("mqtt: command handler failed on %s", msg.topic)

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
        backoff = 1.0
        first = True
        socket_open = had_connack = False
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.cfg.session_expiry_s
        while not self._net_stop.is_set():
            self.last_net_progress = time.monotonic()
            if not socket_open:
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
                    self._net_stop.wait(backoff)
                    backoff = min(backoff * 2, 60.0)
                    continue
            rc = self.client.loop(timeout=0.2)
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                if self.connected:
                    backoff = 1.0
                    had_connack = True
                continue
            socket_open = False
            self.connected = False
            if self._net_stop.is_set():
                break
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
            self._net_stop.wait(backoff)
            backoff = min(backoff * 2, 60.0)

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

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background; a broker that is away at start does not stop the daemon."""
        self._net_thread.start()
        self._thread.start()

    def submit(self, result: Result) -> None:
        try:
            self._q.put_nowait(("result", result))
            self._wake.set()
        except queue.Full:
            self.dropped_queue_full += 1

    def submit_event(self, doc: dict[str, Any]) -> None:
        """Events are spooled like results (QoS 1, nothing lost)."""
        try:
            self._q.put_nowait(("event", doc))
            self._wake.set()
        except queue.Full:
            self.dropped_queue_full += 1

    def publish_direct(
        self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, properties: Properties | None = None
    ) -> bool:
        """Not spooled: telemetry, replies, snapshots. False when refused locally or not sent."""
        if len(payload) > MAX_PAYLOAD_BYTES:
            self.oversized += 1
            logger.error("mqtt: %s payload of %d bytes is over %d; not sent", topic, len(payload), MAX_PAYLOAD_BYTES)
            return False
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def route(self, suffix: str, handler: MessageHandler) -> None:
        """Subscribe (at every connect) to our topic `suffix` and hand its messages to `handler`, which runs
        on paho's network thread and must only queue. Call before start()."""
        self._routes[self.topic(suffix)] = handler

    def set_retained(self, suffix: str, doc: dict[str, Any]) -> None:
        """A retained QoS 1 state document (…/model/state): published now and again at every connect."""
        payload = json.dumps(doc, separators=(",", ":")).encode()
        self._retained[suffix] = payload
        if self.connected:
            self.client.publish(self.topic(suffix), payload, qos=1, retain=True)

    def publish_json(self, suffix: str, doc: dict[str, Any], qos: int = 0, retain: bool = False) -> bool:
        return self.publish_direct(self.topic(suffix), json.dumps(doc, separators=(",", ":")).encode(), qos, retain)

    # --- the publisher thread ----------------------------------------------------------------------
    def _spool_one(self, kind: str, item: Any) -> None:
        if kind == "result":
            self.seq += 1
            doc = result_payload(item, self.device_id, self.boot_id, self.seq)
            topic, qos = self.topic(f"results/{item.camera}"), self.cfg.qos
        else:
            doc, topic, qos = item, self.topic("events"), 1
        payload = json.dumps(doc, separators=(",", ":")).encode()
        if len(payload) > MAX_PAYLOAD_BYTES:
            self.oversized += 1
            if kind == "result":
                self.seq -= 1  # refused locally: seq counts spooled results, so no gap
            logger.error("mqtt: %s payload of %d bytes is over %d; refused", topic, len(payload), MAX_PAYLOAD_BYTES)
            return
        self.spool.append(topic, payload, qos)
        self.spooled += 1

    def _deliver(self) -> None:
        acked = []
        while self._acked_mids:
            row_id = self._inflight.pop(self._acked_mids.popleft(), None)
            if row_id is not None:  # else: the PUBACK of a message that was not spooled (status, a reply)
                acked.append(row_id)
        if acked:
            self.spool.delete(acked)
            self.acked += len(acked)
        if not self.connected:
            return
        room = self.cfg.max_inflight - len(self._inflight)
        if room <= 0 or not self._maybe_unsent:
            return
        rows = self.spool.after(self._last_sent, room)
        if len(rows) < room:
            self._maybe_unsent = False
        for row in rows:
            info = self.client.publish(row.topic, row.payload, qos=row.qos)
            if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                self._maybe_unsent = True
                break  # paho's queue is full: try again on the next turn
            if row.qos > 0:
                self._inflight[info.mid] = row.id
            else:
                self.spool.delete([row.id])
            self._last_sent = row.id
            self.published += 1

    def _run(self) -> None:
        last_commit = time.monotonic()
        interval = self.spool_cfg.commit_interval_ms / 1000.0
        while True:
            self._wake.wait(min(0.05, interval))
            self._wake.clear()
            try:
                while True:  # take what is waiting, without blocking
                    kind, item = self._q.get_nowait()
                    self._spool_one(kind, item)
            except queue.Empty:
                pass
            except Exception:  # a loop boundary: log once, count, keep going
                logger.exception("publisher: cannot spool a message")
            now = time.monotonic()
            # Commit as soon as the queue is drained (low latency at camera rates), and at least every
            # commit_interval_ms under load (group commit): the loss window is at most that interval.
            pending = self.spool.pending_commit
            if pending and (self._q.empty() or now - last_commit >= interval or pending >= 1000):
                self.spool.commit()
                last_commit = now
                self._maybe_unsent = True
            elif now - last_commit >= interval:
                self.spool.commit()  # enforces the age bound even when nothing new comes
                last_commit = now
            try:
                self._deliver()
            except Exception:
                logger.exception("publisher: delivery failed; retrying")
            if self._stop.is_set() and self._q.empty():
                self.spool.commit()
                self._maybe_unsent = True
                return

    def stats(self) -> dict[str, Any]:
        inflight = len(self._inflight)
        return {
            "connected": self.connected,
            "spooled": self.spooled,
            "published": self.published,
            "acked": self.acked,
            "inflight": inflight,
            "spool_rows": self.spool.rows,
            "spool_mb": round(self.spool.bytes / 2**20, 3),
            "spool_dropped": self.spool.dropped,
            "dropped_queue_full": self.dropped_queue_full,
            "oversized": self.oversized,
            "connects": self.connects,
            "connect_failures": self.connect_failures,
            "network_alive": self.network_alive(),
            "network_restarts": self.network_restarts,
            "last_error": self.last_error,
        }

    def stop(self, timeout_s: float = 5.0) -> None:
        """Spool what is queued, wait (up to `timeout_s`) for the broker to acknowledge the spool,
        announce `stopped`, disconnect. What is left stays in the spool for the next start."""
        self._stop.set()
        self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.connected and self.spool.rows and time.monotonic() < deadline:
            self._deliver()
            time.sleep(0.02)
        self._deliver()
        if self.connected:
            info = self.publish_status("stopped")
            try:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            except (RuntimeError, ValueError):
                logger.warning("mqtt: 'stopped' status not acknowledged before disconnecting")
        if self.spool.rows:
            logger.warning("mqtt: %d messages not acknowledged at stop; they stay in the spool", self.spool.rows)
        self.client.disconnect()
        self._net_stop.set()
        self._net_thread.join(5.0)
        # paho opens a wake-up socket pair in reconnect() and closes it only in loop_stop() (which we do
        # not use: our own thread drives loop()) or when the client is garbage-collected; close it now.
        self.client._reset_sockets()
        self.spool.close()
