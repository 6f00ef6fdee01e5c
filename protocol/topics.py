"""Every MQTT topic edged uses, one builder each (DESIGN §4, §6).

A device's topics live under its root, ``<topic_prefix>/<device_id>`` (default ``edged/<device_id>``):

    topic                               dir  QoS  retained  payload (schema id)
    …/status                            out  1    yes       edged.status/1; ``offline`` is the last will
    …/results/<camera>                  out  1*   no        edged.result/2 (*mqtt.qos)
    …/events                            out  1    no        edged.event/1 (object events too)
    …/telemetry                         out  0    yes       edged.telemetry/1
    …/model/state                       out  1    yes       edged.model-state/1
    …/snapshot/<camera>                 out  0    no        a JPEG
    …/cmd/<verb>                        in   1    no        the verb's arguments (a JSON object)
    …/cmd/<verb>/reply                  out  1    no        edged.reply/1, when no response topic was given
    …/reply/<anything>                  out  1    no        edged.reply/1, to a subscriber's response topic
    …/reply/_push/<transfer>            out  1    no        edged.reply/1, to an ``edged push`` offer
    …/ota/req                           out  0    no        edged.ota_request/1: a chunk the device asks for
    …/ota/data                          in   0    no        a chunk: [2-byte header length][header JSON][bytes]
    …/ota/status                        out  1    yes       edged.ota/1
    …/ha/<camera>                       out  1    yes       counts per label and the last object event
                                                            (Home Assistant's state topic; optional)
    <discovery_prefix>/sensor/<device_id>/<unique_id>/config
                                        out  1    yes       a Home Assistant MQTT discovery config
                                                            (schemas/homeassistant_sensor.schema.json)

A fleet's topics live beside the devices' roots, under levels no device may take as its id (``_…``):

    <prefix>/_groups/<group>/ota        in   1    yes       edged.group_offer/1: a rollout's signed offer
                                                            to every device of the group (`edged push`)
    <prefix>/_push/<transfer>/sync      -    1    no        discovery's fence: an `edged push` reads its own
"""

from __future__ import annotations

# a device topic's suffix under its root (what `Publisher.topic(suffix)` and `route(suffix)` take)
STATUS = "status"
EVENTS = "events"
TELEMETRY = "telemetry"
MODEL_STATE = "model/state"
OTA_REQUEST = "ota/req"
OTA_DATA = "ota/data"
OTA_STATUS = "ota/status"
GROUPS = "_groups"  # a group's retained offer: <prefix>/_groups/<group>/ota
PUSH = "_push"  # an ``edged push``'s replies under each device's own reply namespace: …/reply/_push/<transfer>
MAX_TOPIC_BYTES = 1024  # the longest response topic a device replies on


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
