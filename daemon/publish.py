"""Results, status and telemetry over MQTT v5 with paho-mqtt 2.x (DESIGN.md §4).

The inference thread hands results to `submit()`, which never blocks: a bounded queue, and a
full queue drops the result (counted, published in telemetry). The publisher thread numbers
each result (`seq`, +1 per published result within a `boot_id`), serialises it as
``edged.result/1`` and gives it to paho at QoS 1. While the broker is away paho keeps QoS 1
messages in its own bounded queue (``mqtt.max_queued``) and sends them after reconnecting;
beyond that bound results are dropped and counted. (A durable on-disk spool replaces this
in-memory bound in a later change.)

``status`` is retained, with an ``offline`` last will; ``stopped`` is published on a clean stop.
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

from .config import MqttConfig
from .inference import Result

logger = logging.getLogger(__name__)

RESULT_SCHEMA = "edged.result/1"
MAX_PAYLOAD_BYTES = 256 * 1024


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
        client.tls_set(
            ca_certs=str(cfg.tls.ca_file),
            certfile=str(cfg.tls.cert_file) if cfg.tls.cert_file else None,
            keyfile=str(cfg.tls.key_file) if cfg.tls.key_file else None,
            cert_reqs=ssl.CERT_REQUIRED,
        )
        client.tls_insecure_set(cfg.tls.insecure_skip_hostname)
    if cfg.username is not None:
        password = None
        if cfg.password_file is not None:
            try:
                password = cfg.password_file.read_text().rstrip("\n")
            except OSError as exc:
                raise ConfigError(f"mqtt.password_file: cannot read {cfg.password_file}: {exc.strerror}") from exc
        client.username_pw_set(cfg.username, password)
    client.max_queued_messages_set(cfg.max_queued)
    client.max_inflight_messages_set(100)
    client.reconnect_delay_set(1, 60)
    return client


class Publisher:
    def __init__(
        self,
        cfg: MqttConfig,
        device_id: str,
        topic_root: str,
        boot_id: str,
        status_extra: Callable[[], dict[str, Any]],
        queue_size: int = 1024,
    ) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.root = topic_root
        self.boot_id = boot_id
        self._status_extra = status_extra
        self.since = iso(time.time())
        self._q: queue.Queue[Result] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self.seq = 0
        self.published = 0
        self.dropped_queue_full = 0
        self.dropped_mqtt_queue = 0
        self.oversized = 0
        self.acked = 0
        self._unacked: deque[mqtt.MQTTMessageInfo] = deque()
        self._unacked_lock = threading.Lock()
        self.connected = False
        self.connects = 0
        self.last_disconnect = ""
        client_id = cfg.client_id or f"edged-{device_id}"
        self.client = make_client(cfg, client_id)
        self.client.will_set(self.topic("status"), self._status_json("offline"), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def topic(self, suffix: str) -> str:
        return f"{self.root}/{suffix}"

    def _status_json(self, state: str) -> bytes:
        doc = {"state": state, "version": __version__, "boot_id": self.boot_id, "since": self.since}
        doc.update(self._status_extra())
        return json.dumps(doc).encode()

    # --- paho callbacks (network thread); no exception may escape ----------------------------
    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Properties | None
    ) -> None:
        if rc.is_failure:
            self.connected = False
            logger.warning("mqtt: broker %s:%d refused the connection: %s", self.cfg.host, self.cfg.port, rc)
            return
        self.connected = True
        self.connects += 1
        logger.info("mqtt: connected to %s:%d", self.cfg.host, self.cfg.port)
        self._publish(self.topic("status"), self._status_json("online"), qos=1, retain=True)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Properties | None
    ) -> None:
        if self.connected and not self._stop.is_set():
            logger.warning("mqtt: disconnected (%s); reconnecting with backoff 1-60 s", rc)
        self.connected = False
        self.last_disconnect = str(rc)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background; a broker that is away at start does not stop the daemon."""
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 0
        try:
            self.client.connect_async(
                self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s, clean_start=True, properties=props
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(f"mqtt: cannot connect to {self.cfg.host}:{self.cfg.port}: {exc}") from exc
        self.client.loop_start()
        self._thread.start()

    def submit(self, result: Result) -> None:
        try:
            self._q.put_nowait(result)
        except queue.Full:
            self.dropped_queue_full += 1

    def publish_json(self, suffix: str, doc: dict[str, Any], qos: int = 1, retain: bool = False) -> bool:
        payload = json.dumps(doc, separators=(",", ":")).encode()
        return self._publish(self.topic(suffix), payload, qos, retain)

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> bool:
        if len(payload) > MAX_PAYLOAD_BYTES:
            self.oversized += 1
            logger.error("mqtt: %s payload of %d bytes is over %d; not sent", topic, len(payload), MAX_PAYLOAD_BYTES)
            return False
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        ok = info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS or (info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos > 0)
        if ok and qos > 0:
            # paho keeps a QoS 1 message it could not send yet and sends it after reconnecting, but leaves
            # rc=NO_CONN on its info, which makes is_published() raise forever: the message is queued, say so.
            info.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
            with self._unacked_lock:
                self._unacked.append(info)
                while self._unacked and self._unacked[0].is_published():  # PUBACKs come mostly in order
                    self._unacked.popleft()
                    self.acked += 1
        if ok:
            return True  # sent, or queued by paho until the broker is back
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            self.dropped_mqtt_queue += 1
        return False

    def _run(self) -> None:
        while True:
            try:
                r = self._q.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            try:
                self.seq += 1
                doc = result_payload(r, self.device_id, self.boot_id, self.seq)
                if self.publish_json(f"results/{r.camera}", doc, qos=self.cfg.qos):
                    self.published += 1
                else:
                    self.seq -= 1  # seq counts published results only: no gaps from local refusals
            except Exception:  # a loop boundary: log once, count, drop this result
                logger.exception("publisher: cannot publish a result")
                self.seq -= 1

    def pending(self) -> int:
        """Results not yet handed to paho plus QoS>0 messages paho has not had acknowledged."""
        with self._unacked_lock:
            still = deque(i for i in self._unacked if not i.is_published())
            self.acked += len(self._unacked) - len(still)
            self._unacked = still
            return self._q.qsize() + len(still)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish what is queued (up to `timeout_s`), announce `stopped`, disconnect."""
        self._stop.set()
        self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        if self.connected:
            info = self.client.publish(self.topic("status"), self._status_json("stopped"), qos=1, retain=True)
            while self.pending() and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            except (RuntimeError, ValueError):
                logger.warning("mqtt: 'stopped' status not acknowledged before disconnecting")
        left = self.pending()
        if left:
            logger.warning("mqtt: %d results not acknowledged at stop", left)
        self.client.disconnect()
        self.client.loop_stop()
