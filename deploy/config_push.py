"""``edged config push``: a signed config document to one device or a group, and each device's outcome.

    document (edged.config/1) ──sign (edged.sig/1)──> envelope ──retained──> …/config/desired | _groups/G/config
    each device ──> …/config/state (edged.config_state/1): applied | refused (reasons) | reverted (why)

A group's devices are the online ones whose retained status lists the group (as `edged push --group`); one
offline now takes the retained document when it comes back, and is reported as such. Waiting ends when every
device awaited has answered or at the timeout (those that did not answer are named).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TextIO

import paho.mqtt.client as mqtt

from edged.errors import EdgedError
from edged.models.signing import SigningKey
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client
from edged.protocol.config_doc import CONFIG_DOC_SCHEMA, CONFIG_STATE_SCHEMA, envelope
from edged.protocol.schemas import iso

SETTLE_S = 1.0  # discovery: retained statuses stop coming for this long (bounded by DISCOVER_MAX_S)
DISCOVER_MAX_S = 6.0


def document(target: dict[str, str], version: int, overlay: dict[str, Any], comment: str = "") -> bytes:
    """The exact bytes that are signed: an ``edged.config/1`` document."""
    doc = {"schema": CONFIG_DOC_SCHEMA, "target": target, "version": version, "overlay": overlay}
    doc |= {"issued_at": iso(time.time()), "comment": comment}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def signed_payload(
    key: SigningKey, target: dict[str, str], version: int, overlay: dict[str, Any], comment: str = ""
) -> bytes:
    doc = document(target, version, overlay, comment)
    return envelope(doc, key.sign(doc)).payload()


@dataclass
class Outcome:
    device: str
    state: str = "waiting"
    reasons: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


class ConfigPusher:
    def __init__(self, mqtt_cfg: MqttSettings, out: TextIO = sys.stderr) -> None:
        self.prefix = mqtt_cfg.topic_prefix
        self.out = out
        self.client = make_client(mqtt_cfg, f"edged-config-{uuid.uuid4().hex[:12]}")
        self.host, self.port = mqtt_cfg.host, mqtt_cfg.port
        self._connected = threading.Event()
        self._lock = threading.Lock()
        self._statuses: dict[str, dict[str, Any]] = {}
        self._last_status = time.monotonic()
        self._awaited: dict[str, Outcome] = {}
        self._source = ""
        self._version = 0
        self.client.on_connect = lambda *a: self._connected.set()
        self.client.on_message = self._on_message

    def connect(self, timeout_s: float = 15.0) -> None:
        try:
            self.client.connect(self.host, self.port, keepalive=30)
        except OSError as exc:
            raise EdgedError(f"broker {self.host}:{self.port}: {exc}") from exc
        self.client.loop_start()
        if not self._connected.wait(timeout_s):
            raise EdgedError(f"broker {self.host}:{self.port}: not connected within {timeout_s:.0f} s")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        device, suffix = topics.split(self.prefix, msg.topic)
        try:
            doc = json.loads(msg.payload) if msg.payload else {}
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        with self._lock:
            if suffix == topics.STATUS:
                self._statuses[device] = doc
                self._last_status = time.monotonic()
            elif suffix == topics.CONFIG_STATE and doc.get("schema") == CONFIG_STATE_SCHEMA and not msg.retain:
                o = self._awaited.get(device)
                if o is None or doc.get("source") != self._source or doc.get("version") not in (self._version, 0):
                    return
                if doc.get("state") in ("applied", "refused", "reverted"):
                    o.state, o.reasons, o.detail = str(doc["state"]), list(doc.get("reasons") or []), doc

    def discover(self, group: str) -> tuple[list[str], list[str]]:
        """(online, offline) devices whose retained status lists `group`."""
        self.client.subscribe(topics.every_status(self.prefix), qos=1)
        start = time.monotonic()
        while time.monotonic() - start < DISCOVER_MAX_S:
            time.sleep(0.1)
            with self._lock:
                if time.monotonic() - max(self._last_status, start) >= SETTLE_S:
                    break
        with self._lock:
            members = {d: s for d, s in self._statuses.items() if group in (s.get("groups") or [])}
        online = sorted(d for d, s in members.items() if s.get("state") == "online")
        return online, sorted(set(members) - set(online))

    def push(
        self, key: SigningKey, target: dict[str, str], version: int, overlay: dict[str, Any], devices: list[str],
        timeout_s: float, comment: str = "",
    ) -> dict[str, Outcome]:  # fmt: skip
        """Publish the signed document (retained) and wait up to `timeout_s` for each of `devices`' outcome."""
        self._source = "device" if "device" in target else f"group:{target['group']}"
        self._version = version
        with self._lock:
            self._awaited = {d: Outcome(d) for d in devices}
        if devices:
            self.client.subscribe(topics.config_state(f"{self.prefix}/+"), qos=1)
            time.sleep(0.3)  # the SUBACK before our document: a fast device's outcome is not missed
        topic = (
            topics.config_desired(topics.device_root(self.prefix, target["device"]))
            if "device" in target
            else topics.config_group(self.prefix, target["group"])
        )
        info = self.client.publish(topic, signed_payload(key, target, version, overlay, comment), qos=1, retain=True)
        info.wait_for_publish(15)
        print(f"config: version {version} published on {topic} (retained)", file=self.out)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if all(o.state != "waiting" for o in self._awaited.values()):
                    break
            time.sleep(0.1)
        with self._lock:
            return dict(self._awaited)
