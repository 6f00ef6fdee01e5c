"""Every MQTT topic edged uses: the table `TOPICS`, and one builder each (docs/architecture.md, "Contracts").

A device's topics live under its root, ``<topic_prefix>/<device_id>`` (default ``edged/<device_id>``); a
fleet's beside the devices' roots, under levels no device may take as its id (``_…``). `TOPICS` is the
table of them all, one row each (suffix, direction, QoS, retained, who writes and reads): the topic
reference (docs/reference/topics.md) and the shipped broker ACLs (deploy/acl.py:
systemd/mosquitto/edged.acl and central.acl) are made from it, and a test fails when either drifts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# a device topic's suffix under its root (what `Publisher.topic(suffix)` and `route(suffix)` take)
STATUS = "status"
EVENTS = "events"
TELEMETRY = "telemetry"
MODEL_STATE = "model/state"
OTA_REQUEST = "ota/req"
OTA_DATA = "ota/data"
OTA_STATUS = "ota/status"
SHADOW = "shadow"  # a candidate's shadow report (retained; protocol/shadow.py)
CONFIG_DESIRED = "config/desired"  # a device's signed config document (retained); groups': <prefix>/_groups/<g>/config
CONFIG_STATE = "config/state"  # the outcome of the last config document (retained)
GROUPS = "_groups"  # a group's retained offer: <prefix>/_groups/<group>/ota
PUSH = "_push"  # an ``edged push``'s replies under each device's own reply namespace: …/reply/_push/<transfer>
MAX_TOPIC_BYTES = 1024  # the longest response topic a device replies on
# The MQTT v5 Message Expiry Interval of a device's retained status and its last will (about 136 years: never
# expires): a subscriber gets the interval left, so STATUS_EXPIRY_S - left is how many seconds ago the broker
# published it (`edged fleet`: when a device went offline).
STATUS_EXPIRY_S = 0xFFFFFFFE

Who = Literal["device", "backend", "homeassistant", "bridge"]


@dataclass(frozen=True)
class Topic:
    """One row of the topic table. `filter` is the MQTT filter of every topic of the row, with ``{p}`` for
    the topic prefix and ``{d}`` for the device id (a ``+`` per level a topic names: camera, verb, group)."""

    key: str  # how the ACL layouts (deploy/acl.py) name the row
    shown: str  # as the reference shows it: ``…/status`` is under the device's root
    filter: str
    direction: Literal["out", "in", "-"]  # out: a device publishes it; in: a device reads it; -: neither
    qos: str  # the QoS it is published with (``1*``: mqtt.qos)
    retained: bool
    writer: Who  # the one principal the broker lets publish it
    readers: tuple[Who, ...]  # who reads it by a grant of its own (the backend reads all under the prefix too)
    payload: str  # what it carries (schema id)
    bridged: bool = False  # crosses a site bridge (systemd/mosquitto/bridge.conf, central.acl)

    @property
    def scope(self) -> Literal["device", "fleet", "other"]:
        """device: under a device's root; fleet: under the prefix, beside the roots; other: not under it."""
        if self.filter.startswith("{p}/{d}/") or "/{d}/" in self.filter:
            return "device"
        return "fleet" if self.filter.startswith("{p}/") else "other"


_B: Who = "backend"
_HA: Who = "homeassistant"
TOPICS: tuple[Topic, ...] = (
    Topic("status", "…/status", "{p}/{d}/status", "out", "1", True, "device", (_HA,),
          "edged.status/1; ``offline`` is the last will", bridged=True),
    Topic("results", "…/results/<camera>", "{p}/{d}/results/+", "out", "1*", False, "device", (),
          "edged.result/2 (*mqtt.qos)", bridged=True),
    Topic("events", "…/events", "{p}/{d}/events", "out", "1", False, "device", (),
          "edged.event/1 (object events too)", bridged=True),
    Topic("telemetry", "…/telemetry", "{p}/{d}/telemetry", "out", "0", True, "device", (_HA,),
          "edged.telemetry/1", bridged=True),
    Topic("model_state", "…/model/state", "{p}/{d}/model/state", "out", "1", True, "device", (),
          "edged.model-state/1", bridged=True),
    Topic("snapshot", "…/snapshot/<camera>", "{p}/{d}/snapshot/+", "out", "0", False, "device", (_HA,),
          "a JPEG", bridged=True),
    Topic("command", "…/cmd/<verb>", "{p}/{d}/cmd/+", "in", "1", False, "backend", ("device",),
          "the verb's arguments (a JSON object)", bridged=True),
    Topic("command_reply", "…/cmd/<verb>/reply", "{p}/{d}/cmd/+/reply", "out", "1", False, "device", (),
          "edged.reply/1, when no response topic was given", bridged=True),
    Topic("reply", "…/reply/<anything>", "{p}/{d}/reply/#", "out", "1", False, "device", (),
          "edged.reply/1, to a subscriber's response topic", bridged=True),
    Topic("push_reply", "…/reply/_push/<transfer>", "{p}/{d}/reply/_push/+", "out", "1", False, "device", (),
          "edged.reply/1, to an ``edged push`` offer (within …/reply/#)", bridged=True),
    Topic("ota_request", "…/ota/req", "{p}/{d}/ota/req", "out", "0", False, "device", (),
          "edged.ota_request/1: a chunk the device asks for", bridged=True),
    Topic("ota_data", "…/ota/data", "{p}/{d}/ota/data", "in", "0", False, "backend", ("device",),
          "a chunk: [2-byte header length][header JSON][bytes]", bridged=True),
    Topic("ota_status", "…/ota/status", "{p}/{d}/ota/status", "out", "1", True, "device", (),
          "edged.ota/1", bridged=True),
    Topic("shadow", "…/shadow", "{p}/{d}/shadow", "out", "1", True, "device", (),
          "edged.shadow/1: a candidate evaluated beside the serving model (an offer with `shadow`)", bridged=True),
    Topic("ha_state", "…/ha/<camera>", "{p}/{d}/ha/+", "out", "1", True, "device", (_HA,),
          "counts per label and the last object event (Home Assistant's state topic; optional)"),
    Topic("ha_discovery", "<discovery_prefix>/<component>/<device_id>/<unique_id>/config",
          "homeassistant/+/{d}/+/config", "out", "1", True, "device", (_HA,),
          "a Home Assistant MQTT discovery config (schemas/homeassistant_<component>.schema.json)"),
    Topic("ha_pause", "…/cmd/pause (Home Assistant)", "{p}/{d}/cmd/pause", "in", "1", False, "homeassistant",
          ("device",), "a camera's pause switch: {\"camera\": C} pauses it, {\"camera\": C, \"paused\": false} "
          "resumes it (within …/cmd/<verb>)"),
    Topic("ha_snapshot", "…/cmd/snapshot (Home Assistant)", "{p}/{d}/cmd/snapshot", "in", "1", False,
          "homeassistant", ("device",), "a camera's snapshot button: {\"camera\": C} (within …/cmd/<verb>)"),
    Topic("group_offer", "<prefix>/_groups/<group>/ota", "{p}/_groups/+/ota", "in", "1", True, "backend",
          ("device",), "edged.group_offer/1: a rollout's signed offer to every device of the group "
          "(`edged push`)", bridged=True),
    Topic("config_desired", "…/config/desired", "{p}/{d}/config/desired", "in", "1", True, "backend",
          ("device",), "edged.config_document/1: a signed config document for one device (`edged config push`)",
          bridged=True),
    Topic("config_group", "<prefix>/_groups/<group>/config", "{p}/_groups/+/config", "in", "1", True, "backend",
          ("device",), "edged.config_document/1: a signed config document for every device of the group "
          "(`edged config push --group`)", bridged=True),
    Topic("config_state", "…/config/state", "{p}/{d}/config/state", "out", "1", True, "device", (),
          "edged.config_state/1: the outcome of the last config document (applied, refused, reverted)",
          bridged=True),
    Topic("push_sync", "<prefix>/_push/<transfer>/sync", "{p}/_push/+/sync", "-", "1", False, "backend", (_B,),
          "discovery's fence: an `edged push` reads its own message back once every retained status "
          "queued before it has arrived"),
    Topic("ha_birth", "homeassistant/status", "homeassistant/status", "-", "1", True, "homeassistant", (),
          "Home Assistant's own birth and last will (edged does not read it)"),
    Topic("backend", "backend/<anything>", "backend/#", "-", "-", False, "backend", (_B,),
          "the site's backend's own topics: no device may read or write them"),
    Topic("bridge_state", "bridges/<site>/state", "bridges/{site}/state", "-", "1", True, "bridge", ("bridge", _B),
          "on a central broker: a site bridge's state (``1`` up, ``0`` down: its retained last will)"),
)  # fmt: skip
BY_KEY = {t.key: t for t in TOPICS}


def device_root(prefix: str, device: str) -> str:
    """``<prefix>/<device>``: every topic of one device is under it."""
    return f"{prefix}/{device}"


def status(root: str) -> str:
    return f"{root}/{STATUS}"


def results_suffix(camera: str) -> str:
    return f"results/{camera}"


def results(root: str, camera: str) -> str:
    return f"{root}/{results_suffix(camera)}"


def events(root: str) -> str:
    return f"{root}/{EVENTS}"


def telemetry(root: str) -> str:
    return f"{root}/{TELEMETRY}"


def model_state(root: str) -> str:
    return f"{root}/{MODEL_STATE}"


def snapshot(root: str, camera: str) -> str:
    return f"{root}/snapshot/{camera}"


def command(root: str, verb: str) -> str:
    return f"{root}/cmd/{verb}"


def commands(root: str) -> str:
    """The filter a device subscribes to for its commands."""
    return f"{root}/cmd/+"


def command_reply(root: str, verb: str) -> str:
    """Where a reply goes when the command named no (allowed) response topic."""
    return f"{root}/cmd/{verb or 'unknown'}/reply"


def verb_of(root: str, topic: str) -> str:
    """The verb of a command topic of this device (``''`` for any other topic)."""
    prefix = f"{root}/cmd/"
    return topic[len(prefix) :] if topic.startswith(prefix) else ""


def push_reply(root: str, transfer: str) -> str:
    """An ``edged push``'s reply topic for one device (its offer's MQTT v5 response topic): under the device's
    own ``…/reply/``, so the ACL lets a device answer only for itself (older devices accept it too)."""
    return f"{root}/reply/{PUSH}/{transfer}"


def push_replies(prefix: str, transfer: str) -> str:
    """The filter an ``edged push`` subscribes to for every device's reply to its offers."""
    return f"{prefix}/+/reply/{PUSH}/{transfer}"


def ota_request(root: str) -> str:
    return f"{root}/{OTA_REQUEST}"


def ota_data(root: str) -> str:
    return f"{root}/{OTA_DATA}"


def ota_status(root: str) -> str:
    return f"{root}/{OTA_STATUS}"


def shadow(root: str) -> str:
    """A device's retained shadow report (``edged.shadow/1``): the candidate of the last offer with ``shadow``."""
    return f"{root}/{SHADOW}"


def ha_state(root: str, camera: str) -> str:
    """A camera's Home Assistant state document (retained): ``{"counts": {label: n}, "last_event": …}``."""
    return f"{root}/ha/{camera}"


def ha_discovery(discovery_prefix: str, component: str, node_id: str, object_id: str) -> str:
    """Home Assistant's discovery topic of one entity: ``<discovery_prefix>/<component>/<node_id>/<object_id>/config``
    (https://www.home-assistant.io/integrations/mqtt/#discovery-topic). The node id is the device's id, so a
    broker ACL can confine a device to its own configs (``pattern write homeassistant/+/%u/+/config``)."""
    return f"{discovery_prefix}/{component}/{node_id}/{object_id}/config"


def group_offer(prefix: str, group: str) -> str:
    """A group's retained, signed offer (``edged push --group G`` publishes it when the rollout reaches its
    last wave): a device of the group that was offline takes it when it connects again."""
    return f"{prefix}/{GROUPS}/{group}/ota"


def config_desired(root: str) -> str:
    """One device's retained, signed config document (``edged config push --device``)."""
    return f"{root}/{CONFIG_DESIRED}"


def config_group(prefix: str, group: str) -> str:
    """A group's retained, signed config document (``edged config push --group``)."""
    return f"{prefix}/{GROUPS}/{group}/config"


def config_state(root: str) -> str:
    """A device's retained outcome of the last config document."""
    return f"{root}/{CONFIG_STATE}"


def push_sync(prefix: str, transfer: str) -> str:
    """Discovery's fence: an ``edged push`` publishes here once subscribed to every status; its own message
    coming back means every retained status queued before it has arrived (the broker keeps the order)."""
    return f"{prefix}/{PUSH}/{transfer}/sync"


def every_status(prefix: str) -> str:
    """Discovery: the filter for every device's retained status (``edged push --group``)."""
    return f"{prefix}/+/status"


def everything(root: str) -> str:
    """The filter for every topic of one device (``edged watch``)."""
    return f"{root}/#"


def split(prefix: str, topic: str) -> tuple[str, str]:
    """(device, suffix) of a device topic under `prefix`: ``edged/cam-1/ota/req`` -> (``cam-1``, ``ota/req``)."""
    device, _, suffix = topic[len(prefix) + 1 :].partition("/")
    return device, suffix


def response_topic_allowed(topic: str, root: str) -> bool:
    """Whether a device whose topics are under `root` may reply on `topic`: its own ``…/reply/<anything>``
    (an ``edged push`` offer's too: ``…/reply/_push/<transfer>``), what the shipped ACL,
    systemd/mosquitto/edged.acl, lets a device publish; never wildcards, ``$SYS/…`` or another device's
    topics (nor ``<prefix>/_push/<id>/reply``, the shared reply topic older pushers named: any device could
    write it)."""
    if not topic or len(topic.encode()) > MAX_TOPIC_BYTES or any(c in topic for c in "+#\x00") or topic.startswith("$"):
        return False
    return topic.startswith(root + "/reply/") and "//" not in topic
