"""Schema ids of every JSON payload edged sends, their JSON Schemas (shipped in ``schemas/``), and the
builders of the payloads whose shape the contract fixes.

Every JSON document a device publishes carries its schema id in ``"schema"`` (the retained status
predates that and does not), so a subscriber can tell versions apart; a change that breaks a
subscriber gets a new id (``edged.result/2``), an addition does not.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import cache
from pathlib import Path
from typing import Any

RESULT_SCHEMA = "edged.result/2"  # /2: detections gain track_id and zones
RESULT_SCHEMA_V1 = "edged.result/1"  # what devices before /2 send; its file is kept
RESULT_SCHEMA_V3 = "edged.result/3"  # /2 + each detection's `stages` and `stage_versions`: a daemon with `stages:`
EVENT_SCHEMA = "edged.event/1"
TELEMETRY_SCHEMA = "edged.telemetry/1"
REPLY_SCHEMA = "edged.reply/1"
OTA_SCHEMA = "edged.ota/1"  # ota/status
STATUS_SCHEMA = "edged.status/1"  # not in the payload (it predates schema ids): the schema file's $id
MODEL_STATE_SCHEMA = "edged.model-state/1"
OTA_OFFER_SCHEMA = "edged.ota_offer/1"  # the cmd/ota arguments; likewise
OTA_CANCEL_SCHEMA = "edged.ota_cancel/1"  # the cmd/cancel arguments; likewise
OTA_REQUEST_SCHEMA = "edged.ota_request/1"  # ota/req; likewise
OTA_CHUNK_HEADER_SCHEMA = "edged.ota_chunk/1"  # an ota/data chunk's header; likewise
HA_STATE_SCHEMA = "edged.ha_state/1"  # …/ha/<camera>, Home Assistant's state topic
HA_SENSOR_SCHEMA = "homeassistant.sensor-discovery"  # Home Assistant's discovery config, as its docs define it
# the other components' discovery configs (issue 32 item 5), one schema each: by component
HA_DISCOVERY_SCHEMAS = {
    "sensor": HA_SENSOR_SCHEMA,
    "binary_sensor": "homeassistant.binary-sensor-discovery",
    "switch": "homeassistant.switch-discovery",
    "button": "homeassistant.button-discovery",
    "camera": "homeassistant.camera-discovery",
}
GROUP_OFFER_SCHEMA = "edged.group_offer/1"  # <prefix>/_groups/<group>/ota (retained)
CONFIG_DOCUMENT_SCHEMA = "edged.config_document/1"  # …/config/desired, <prefix>/_groups/<g>/config (retained)
CONFIG_SCHEMA = "edged.config/1"  # the signed document inside it (protocol/config_doc.py)
CONFIG_STATE_SCHEMA = "edged.config_state/1"  # …/config/state (retained)
DIAGNOSE_SCHEMA = "edged.diagnose/1"  # the `diagnose` verb's document, joined from its parts (protocol/commands.py)
CLIP_SCHEMA = "edged.clip/1"  # a clip's sidecar (<clips>/<camera>/<id>.json), the `clips` verb's and /clips' items
SHADOW_SCHEMA = "edged.shadow/1"  # …/shadow (retained): a candidate's shadow report (protocol/shadow.py)

SCHEMA_DIR = Path(__file__).parent / "schemas"
# schema id -> its file in SCHEMA_DIR
FILES = {
    RESULT_SCHEMA: "result2.schema.json",
    RESULT_SCHEMA_V1: "result.schema.json",
    RESULT_SCHEMA_V3: "result3.schema.json",
    EVENT_SCHEMA: "event.schema.json",
    TELEMETRY_SCHEMA: "telemetry.schema.json",
    REPLY_SCHEMA: "reply.schema.json",
    STATUS_SCHEMA: "status.schema.json",
    MODEL_STATE_SCHEMA: "model_state.schema.json",
    OTA_SCHEMA: "ota_status.schema.json",
    OTA_OFFER_SCHEMA: "ota_offer.schema.json",
    OTA_CANCEL_SCHEMA: "ota_cancel.schema.json",
    GROUP_OFFER_SCHEMA: "group_offer.schema.json",
    CONFIG_DOCUMENT_SCHEMA: "config_document.schema.json",
    CONFIG_SCHEMA: "config.schema.json",
    CONFIG_STATE_SCHEMA: "config_state.schema.json",
    OTA_REQUEST_SCHEMA: "ota_request.schema.json",
    OTA_CHUNK_HEADER_SCHEMA: "ota_chunk.schema.json",
    HA_STATE_SCHEMA: "ha_state.schema.json",
    DIAGNOSE_SCHEMA: "diagnose.schema.json",
    CLIP_SCHEMA: "clip.schema.json",
    SHADOW_SCHEMA: "shadow.schema.json",
    HA_SENSOR_SCHEMA: "homeassistant_sensor.schema.json",
    "homeassistant.binary-sensor-discovery": "homeassistant_binary_sensor.schema.json",
    "homeassistant.switch-discovery": "homeassistant_switch.schema.json",
    "homeassistant.button-discovery": "homeassistant_button.schema.json",
    "homeassistant.camera-discovery": "homeassistant_camera.schema.json",
}

STATUS_STATES = ("online", "offline", "stopped")  # offline is the last will
# why an object_ended event's track ended (its `reason`): lost (tracking.max_age frames without a detection),
# stopped (the daemon stopped), or what broke the camera's picture, which ends all of its tracks: a
# reconnect, a loop wrap of a file, a stall, a scene cut
OBJECT_END_REASONS = ("lost", "stopped", "reconnect", "loop", "stall", "scene_cut")


@cache
def schema(schema_id: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `schema_id`, as shipped."""
    try:
        name = FILES[schema_id]
    except KeyError:
        raise ValueError(f"no schema {schema_id!r}; known: {', '.join(sorted(FILES))}") from None
    doc: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text())
    return doc


def iso(ts: float) -> str:
    """A wall-clock time as the wire writes it: ISO-8601 UTC with milliseconds, ``2026-11-29T16:03:11.120Z``."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dumps(doc: dict[str, Any]) -> bytes:
    """Compact JSON, as results, events, telemetry and the model state go out."""
    return json.dumps(doc, separators=(",", ":")).encode()


def result_doc(
    *,
    device: str,
    camera: str,
    boot_id: str,
    seq: int,
    frame: int,
    captured_at: float,
    capture_to_result_ms: float,
    infer_ms: float,
    model: tuple[str, int],
    image: tuple[int, int],
    detections: list[dict[str, Any]],
) -> dict[str, Any]:
    """An ``edged.result/2`` document: every detection of one frame of one camera (`image` is (width, height))."""
    return {
        "schema": RESULT_SCHEMA,
        "device": device,
        "camera": camera,
        "boot_id": boot_id,
        "seq": seq,
        "frame": frame,
        "captured_at": iso(captured_at),
        "latency_ms": {"capture_to_result": round(capture_to_result_ms, 2), "infer": round(infer_ms, 2)},
        "model": {"name": model[0], "version": model[1]},
        "image": {"width": image[0], "height": image[1]},
        "detections": detections,
    }


def status_doc(
    state: str,
    version: str,
    boot_id: str,
    since: str,
    spool: str,
    extra: dict[str, Any] | None = None,
    *,
    refused_subscriptions: dict[str, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """The retained ``…/status`` document; `extra` is what the daemon adds (model, groups).
    `refused_subscriptions`: topic filter -> (reason, code) of each subscription the broker refused in its
    SUBACK; listed (``refused_subscriptions``) only when there is one."""
    if state not in STATUS_STATES:
        raise ValueError(f"status state {state!r}; one of {', '.join(STATUS_STATES)}")
    doc: dict[str, Any] = {"state": state, "version": version, "boot_id": boot_id, "since": since, "spool": spool}
    doc.update(extra or {})
    if refused_subscriptions:
        doc["refused_subscriptions"] = [
            {"topic": topic, "reason": reason, "code": code}
            for topic, (reason, code) in sorted(refused_subscriptions.items())
        ]
    return doc
