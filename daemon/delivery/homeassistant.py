"""Home Assistant MQTT discovery: the device appears in Home Assistant as one device with, per camera, a
sensor per label (objects in view), a sensor of the last object event, an occupancy binary sensor per label
and per zone, a crossing counter per line and direction, a switch that pauses the camera's inference, a
button that takes a snapshot and a camera entity showing it; and for the device, diagnostic sensors
(temperature, inference fps, spool backlog, model).

    decode thread ──Result──> HomeAssistant.observe ──(counts or last event changed)──> …/ha/<camera>
    main loop ──tick()──> at every connect (and a model swap): discovery configs, then every camera's state

- Discovery configs (retained, QoS 1) go to ``<discovery_prefix>/<component>/<device_id>/<unique_id>/config``
  (topics.ha_discovery; the node id level lets a broker ACL keep each device to its own), shaped as Home
  Assistant documents them (protocol/schemas/homeassistant_<component>.schema.json cite the pages). Each
  names the device (one ``device`` block, the same identifiers everywhere), its state topic and, for
  availability, the device's retained ``…/status`` (``online``; ``stopped`` and the ``offline`` last will
  make the entities unavailable).
- A camera's state, ``…/ha/<camera>`` (retained, QoS 1, ``edged.ha_state/1``), is published when its counts
  (per label, per zone, its lines' crossings), its last event or its pause change, never per frame. With
  tracking on (the default) a count is the camera's confirmed tracks of that label: the occupancy the object events give
  (appeared +1, ended -1), whatever the camera's ``publish`` setting; without tracking it is the detections
  of the latest frame.
- What Home Assistant sends: the switch's ``…/cmd/pause`` (``{"camera": C}`` pauses it, ``{"camera": C,
  "paused": false}`` resumes it) and the button's ``…/cmd/snapshot`` (``{"camera": C}``), through the command
  channel like any command; the shipped ACL lets the ``homeassistant`` principal write those two verbs and no
  other. The snapshot (``…/snapshot/<camera>``, a JPEG) is the camera entity's image; the diagnostic sensors
  read the retained ``…/telemetry`` and ``…/status``.
- What this daemon has published is listed in ``<state_dir>/homeassistant.json``: a camera or label that
  is gone (a new config, a model with other labels, discovery turned off) has its retained topics cleared
  (an empty retained payload removes the entity from Home Assistant).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from edged import __version__
from edged.protocol import topics
from edged.protocol.schemas import HA_STATE_SCHEMA, dumps, iso

from ..config import CameraConfig, Config
from ..inference import Result
from ..scene.lines import CROSSING_DIRECTIONS
from ..scene.scenes import Scene, Scenes

logger = logging.getLogger(__name__)

STATE_FILE = "homeassistant.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # what a discovery topic's object id may not hold


class Outlet(Protocol):
    """What discovery needs of the MQTT session (the Publisher)."""

    connected: bool
    connects: int

    def publish_direct(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool: ...


def object_id(*parts: str) -> str:
    """A unique_id (and the discovery topic's object id): only ``[A-Za-z0-9_-]``, as Home Assistant asks."""
    return _UNSAFE.sub("_", "_".join(parts))


def camera_labels(cfg: Config, camera: CameraConfig, model_labels: Sequence[str]) -> list[str]:
    """The labels a camera gets a count sensor for: homeassistant.labels, else the camera's own labels,
    else detection.labels, else the model's."""
    if cfg.homeassistant.labels is not None:
        return list(cfg.homeassistant.labels)
    own = camera.detection.labels if camera.detection is not None else None
    if own is not None:
        return list(own)
    return list(cfg.detection.labels or model_labels)


def tracking(camera: CameraConfig) -> bool:
    return camera.detection is None or camera.detection.tracking.enabled


def discovery_configs(cfg: Config, model_labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every entity's discovery config, by discovery topic."""
    ha, dev = cfg.homeassistant, cfg.device_id
    root = f"{cfg.mqtt.topic_prefix}/{dev}"
    node = object_id(dev)
    common: dict[str, Any] = {
        "availability_topic": topics.status(root),
        "availability_template": "{{ 'online' if value_json.state == 'online' else 'offline' }}",
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": {
            "identifiers": [object_id("edged", dev)],
            "name": ha.name or dev,
            "manufacturer": "edged",
            "model": "edged inference daemon",
            "sw_version": __version__,
        },
        "origin": {"name": "edged", "sw_version": __version__},
        "qos": 1,
    }
    out: dict[str, dict[str, Any]] = {}
    for cam in cfg.cameras:
        state = topics.ha_state(root, cam.name)
        for label in camera_labels(cfg, cam, model_labels):
            uid = object_id("edged", dev, cam.name, label, "count")
            key = _key(label)
            out[topics.ha_discovery(ha.discovery_prefix, "sensor", node, uid)] = {
                "name": f"{cam.name} {label} count",
                "unique_id": uid,
                "state_topic": state,
                "value_template": f"{{{{ value_json.counts['{key}'] | default(0) }}}}",
                "state_class": "measurement",
                "icon": "mdi:eye",
                **common,
            }
        out.update(_camera_entities(cfg, cam, common, model_labels))
        if tracking(cam):
            uid = object_id("edged", dev, cam.name, "last_event")
            out[topics.ha_discovery(ha.discovery_prefix, "sensor", node, uid)] = {
                "name": f"{cam.name} last event",
                "unique_id": uid,
                "state_topic": state,
                "value_template": "{{ value_json.last_event.type if value_json.last_event else 'none' }}",
                "json_attributes_topic": state,
                "json_attributes_template": "{{ (value_json.last_event or {}) | tojson }}",
                "icon": "mdi:motion-sensor",
                **common,
            }
    out.update(_diagnostics(cfg, common))
    return out


def _key(name: str) -> str:
    """`name` inside a template's single-quoted string."""
    return name.replace("\\", "\\\\").replace("'", "\\'")


def _camera_entities(
    cfg: Config, cam: CameraConfig, common: dict[str, Any], model_labels: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """A camera's occupancy binary sensors (per label, per zone), its pause switch, snapshot button and camera."""
    dev, prefix = cfg.device_id, cfg.homeassistant.discovery_prefix
    root, node = f"{cfg.mqtt.topic_prefix}/{dev}", object_id(dev)
    state = topics.ha_state(root, cam.name)
    out: dict[str, dict[str, Any]] = {}
    for line in cam.detection.lines if cam.detection is not None else ():
        for direction in CROSSING_DIRECTIONS:  # counts since the daemon started: total_increasing
            uid = object_id("edged", dev, cam.name, "line", line.name, direction)
            out[topics.ha_discovery(prefix, "sensor", node, uid)] = {
                "name": f"{cam.name} {line.name} {direction}",
                "unique_id": uid,
                "state_topic": state,
                "value_template": f"{{{{ value_json.crossings['{line.name}']['{direction}'] | default(0) }}}}",
                "state_class": "total_increasing",
                "icon": "mdi:arrow-right-bold" if direction == "in" else "mdi:arrow-left-bold",
                **common,
            }
    occupied = [(label, f"value_json.counts['{_key(label)}']") for label in camera_labels(cfg, cam, model_labels)]
    occupied += [(f"zone {z}", f"value_json.zones['{_key(z)}']") for z in zone_names(cam)]
    for what, count in occupied:
        uid = object_id("edged", dev, cam.name, what, "occupancy")
        out[topics.ha_discovery(prefix, "binary_sensor", node, uid)] = {
            "name": f"{cam.name} {what} occupancy",
            "unique_id": uid,
            "state_topic": state,
            "value_template": f"{{{{ 'ON' if ({count} | default(0)) > 0 else 'OFF' }}}}",
            "device_class": "occupancy",
            **common,
        }
    camera = json.dumps({"camera": cam.name})
    uid = object_id("edged", dev, cam.name, "paused")
    out[topics.ha_discovery(prefix, "switch", node, uid)] = {
        "name": f"{cam.name} paused",
        "unique_id": uid,
        "command_topic": topics.command(root, "pause"),
        "payload_on": camera,
        "payload_off": json.dumps({"camera": cam.name, "paused": False}),
        "state_topic": state,
        "value_template": "{{ 'ON' if value_json.paused | default(false) else 'OFF' }}",
        "state_on": "ON",
        "state_off": "OFF",
        "icon": "mdi:pause-circle",
        **common,
    }
    uid = object_id("edged", dev, cam.name, "snapshot")
    out[topics.ha_discovery(prefix, "button", node, uid)] = {
        "name": f"{cam.name} snapshot",
        "unique_id": uid,
        "command_topic": topics.command(root, "snapshot"),
        "payload_press": camera,
        "icon": "mdi:camera",
        **common,
    }
    uid = object_id("edged", dev, cam.name, "image")
    out[topics.ha_discovery(prefix, "camera", node, uid)] = {
        "name": f"{cam.name} snapshot image",
        "unique_id": uid,
        "topic": topics.snapshot(root, cam.name),
        **common,
    }
    return out


# the device's diagnostic sensors: (key, name, state topic suffix, value template, unit, device class)
_DIAGNOSTICS = (
    ("temperature", "temperature", topics.TELEMETRY,
     "{{ value_json.sensors.temps_c.values() | max if value_json.sensors.temps_c | default({}) else None }}",
     "°C", "temperature"),
    ("fps", "inference fps", topics.TELEMETRY, "{{ value_json.inference.fps }}", "fps", None),
    ("spool_rows", "spool backlog", topics.TELEMETRY, "{{ value_json.mqtt.spool_rows }}", "messages", None),
    ("model", "model version", topics.STATUS,
     "{{ value_json.model.name ~ ' ' ~ value_json.model.version if value_json.model is defined else None }}",
     None, None),
)  # fmt: skip


def _diagnostics(cfg: Config, common: dict[str, Any]) -> dict[str, dict[str, Any]]:
    dev = cfg.device_id
    root = f"{cfg.mqtt.topic_prefix}/{dev}"
    out: dict[str, dict[str, Any]] = {}
    for key, name, suffix, template, unit, device_class in _DIAGNOSTICS:
        uid = object_id("edged", dev, key)
        doc: dict[str, Any] = {
            "name": name,
            "unique_id": uid,
            "state_topic": f"{root}/{suffix}",
            "value_template": template,
            "entity_category": "diagnostic",
            **common,
        }
        if unit is not None:
            doc |= {"unit_of_measurement": unit, "state_class": "measurement"}
        if device_class is not None:
            doc["device_class"] = device_class
        out[topics.ha_discovery(cfg.homeassistant.discovery_prefix, "sensor", object_id(dev), uid)] = doc
    return out


def zone_names(camera: CameraConfig) -> list[str]:
    return [z.name for z in camera.detection.zones] if camera.detection is not None else []


def line_names(camera: CameraConfig) -> list[str]:
    return [line.name for line in camera.detection.lines] if camera.detection is not None else []


class _Camera:
    """One camera's state document and what its last frame's tracks were (decode thread)."""

    def __init__(self, name: str, labels: list[str], zones: list[str], lines: list[str]) -> None:
        self.name = name
        self.labels = labels
        self.zone_names = zones
        self.counts = dict.fromkeys(labels, 0)
        self.zones = dict.fromkeys(zones, 0)  # objects (any label) in each zone
        # crossings (any label) per line and direction since the start; None: the camera has no lines
        self.crossings = {n: dict.fromkeys(CROSSING_DIRECTIONS, 0) for n in lines} if lines else None
        self.paused = False  # by `pause {"camera": …}` (Home Assistant's switch)
        self.last_event: dict[str, Any] | None = None
        self.tracks: dict[int, tuple[str, tuple[str, ...]]] = {}  # confirmed track id -> (label, zones)

    def doc(self) -> dict[str, Any]:
        return {
            "schema": HA_STATE_SCHEMA,
            "camera": self.name,
            "counts": dict(self.counts),
            "zones": dict(self.zones),
            "paused": self.paused,
            "last_event": self.last_event,
            **({"crossings": self.crossings} if self.crossings is not None else {}),
        }


class HomeAssistant:
    """Discovery configs and per-camera states. `observe` runs on the decode thread, `tick` on the main
    loop; both publish under one lock."""

    def __init__(
        self,
        cfg: Config,
        scenes: Scenes,
        out: Outlet,
        model_labels: Callable[[], tuple[str, list[str]]],
        paused: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """`model_labels`: () -> (the serving package's ref, its labels); a swap to other labels re-announces.
        `paused`: () -> the cameras paused by command (the switches' state, read at each `tick`)."""
        self.cfg = cfg
        self.enabled = cfg.homeassistant.enabled
        self.scenes = scenes
        self.out = out
        self.model_labels = model_labels
        self.paused = paused
        self.root = f"{cfg.mqtt.topic_prefix}/{cfg.device_id}"
        self.state_file = cfg.state_dir / STATE_FILE
        self._lock = threading.Lock()
        self._cameras: dict[str, _Camera] = {}
        self._synced: tuple[int, str] | None = None  # (connects, model ref) the retained topics were sent for
        self.states_published = 0
        self._build(model_labels()[1])

    @staticmethod
    def needed(cfg: Config) -> bool:
        """Enabled, or topics of an earlier run to clear (discovery was turned off)."""
        return cfg.homeassistant.enabled or (cfg.state_dir / STATE_FILE).exists()

    def _build(self, labels: list[str]) -> None:
        if not self.enabled:
            return
        old = self._cameras
        self._cameras = {}
        for cam in self.cfg.cameras:
            c = _Camera(cam.name, camera_labels(self.cfg, cam, labels), zone_names(cam), line_names(cam))
            if cam.name in old:
                c.last_event, c.tracks = old[cam.name].last_event, old[cam.name].tracks
                c.paused = old[cam.name].paused
            self._cameras[cam.name] = c

    # --- the decode thread ---------------------------------------------------------------------
    def observe(self, r: Result) -> None:
        """After the camera's Scene has run on `r`: publish its state if a count or the last event changed."""
        cam = self._cameras.get(r.camera)
        if cam is None:
            return
        scene = self.scenes.scenes.get(r.camera)
        tracker = scene.tracker if scene is not None else None
        event: dict[str, Any] | None = None
        if tracker is not None:
            now = {t.id: (t.label, tuple(t.extra.get("zones", ()))) for t in tracker.tracks if t.confirmed and t.id > 0}
            event = self._events(cam, now, iso(r.meta.captured_at))
            cam.tracks = now
            seen = Counter(label for label, _ in now.values())
            inside = Counter(z for _, zs in now.values() for z in zs)
        else:
            seen = Counter(d.label for d in r.detections)
            inside = Counter(z for d in r.detections for z in d.zones)
        counts = {label: seen.get(label, 0) for label in cam.labels}
        zones = {z: inside.get(z, 0) for z in cam.zone_names}
        crossed = _crossed(cam, scene)
        if counts == cam.counts and zones == cam.zones and crossed == cam.crossings and event is None:
            return
        with self._lock:
            cam.counts, cam.zones, cam.crossings = counts, zones, crossed
            if event is not None:
                cam.last_event = event
            if self._synced is not None and self.out.connected:
                self._publish_state(cam)

    @staticmethod
    def _events(cam: _Camera, now: dict[int, tuple[str, tuple[str, ...]]], ts: str) -> dict[str, Any] | None:
        """The last of this frame's object events (the same transitions …/events reports), if any."""
        last: dict[str, Any] | None = None
        for tid, (label, zones) in now.items():
            before = cam.tracks.get(tid)
            if before is None:
                last = {"type": "object_appeared", "label": label, "track_id": tid, "ts": ts}
            was = before[1] if before is not None else ()
            for z in zones:
                if z not in was:
                    last = {"type": "object_entered", "label": label, "track_id": tid, "zone": z, "ts": ts}
            for z in was:
                if z not in zones:
                    last = {"type": "object_left", "label": label, "track_id": tid, "zone": z, "ts": ts}
        for tid, (label, _) in cam.tracks.items():
            if tid not in now:
                last = {"type": "object_ended", "label": label, "track_id": tid, "ts": ts}
        return last

    # --- the main loop -------------------------------------------------------------------------
    def tick(self) -> None:
        """At a new connection, or when the serving model changed: every discovery config and state again."""
        if not self.out.connected:
            return
        ref, labels = self.model_labels()
        with self._lock:
            self._follow_pauses()
            if self._synced == (self.out.connects, ref):
                return
            if self._synced is not None and self._synced[1] != ref:
                self._build(labels)
            self._sync(labels)
            self._synced = (self.out.connects, ref)

    def _follow_pauses(self) -> None:
        """A camera paused or resumed by command: its state again (the switch shows it)."""
        paused = self.paused()
        for cam in self._cameras.values():
            if cam.paused != (cam.name in paused):
                cam.paused = cam.name in paused
                if self._synced is not None:
                    self._publish_state(cam)

    def _sync(self, labels: list[str]) -> None:
        configs = discovery_configs(self.cfg, labels) if self.enabled else {}
        ours = set(configs) | {topics.ha_state(self.root, c) for c in self._cameras}
        unsent: set[str] = set()
        for topic in sorted(self._published() - ours):  # gone: an empty retained payload removes it
            if self.out.publish_direct(topic, b"", qos=1, retain=True):
                logger.info("home assistant: removed %s", topic)
            else:
                unsent.add(topic)  # cleared at the next connect
        for topic, doc in configs.items():
            self.out.publish_direct(topic, dumps(doc), qos=1, retain=True)
        for cam in self._cameras.values():
            self._publish_state(cam)
        self._remember(ours | unsent)
        if self.enabled:
            logger.info(
                "home assistant: %d discovery configs under %s/",
                len(configs),
                self.cfg.homeassistant.discovery_prefix,
            )

    def _publish_state(self, cam: _Camera) -> None:
        if self.out.publish_direct(topics.ha_state(self.root, cam.name), dumps(cam.doc()), qos=1, retain=True):
            self.states_published += 1

    def _published(self) -> set[str]:
        try:
            doc = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as exc:
            logger.warning("home assistant: %s unreadable (%s); earlier topics are not cleared", self.state_file, exc)
            return set()
        return {t for t in doc.get("topics", []) if isinstance(t, str)} if isinstance(doc, dict) else set()

    def _remember(self, ours: set[str]) -> None:
        try:
            if not ours:
                self.state_file.unlink(missing_ok=True)
                return
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"topics": sorted(ours)}, indent=1))
            tmp.replace(self.state_file)
        except OSError as exc:
            logger.warning("home assistant: cannot write %s (%s)", self.state_file, exc)


def _crossed(cam: _Camera, scene: Scene | None) -> dict[str, dict[str, int]] | None:
    """The camera's crossings per line and direction now (any label), from its scene's counters."""
    if cam.crossings is None or scene is None:
        return cam.crossings
    out = {line: dict.fromkeys(CROSSING_DIRECTIONS, 0) for line in cam.crossings}
    for (line, direction, _), n in scene.crossings.items():
        if line in out:
            out[line][direction] += n
    return out


def read_published(state_dir: Path) -> list[str]:
    """The retained topics a daemon left for Home Assistant (tests, `edged doctor`)."""
    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return []
    return list(doc.get("topics", [])) if isinstance(doc, dict) else []
