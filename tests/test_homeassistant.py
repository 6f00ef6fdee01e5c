"""Home Assistant MQTT discovery (issue 19 item 5, issue 32 item 5): discovery configs validated against the
schemas built from Home Assistant's documented keys (protocol/schemas/homeassistant_<component>.schema.json:
sensor, binary_sensor, switch, button, camera), seen by a real broker subscriber, with per-camera counts that
follow the demo video's faces; entities that go away are removed. The switch pausing a camera and availability
through the shipped broker config and ACL are in tests/test_homeassistant_site.py. No real Home Assistant
runs in these tests: the documents are checked against its documented schema, the commands against the daemon."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edged.daemon.config import Config
from edged.daemon.control import PauseArgs, SnapshotArgs
from edged.daemon.delivery.homeassistant import STATE_FILE, discovery_configs, read_published
from edged.models.demo import DemoAssets
from edged.protocol.schemas import HA_DISCOVERY_SCHEMAS, HA_SENSOR_SCHEMA, HA_STATE_SCHEMA, schema

from .conftest import base_config, wait_until, write_config

# the documented discovery topic: <discovery_prefix>/<component>/[<node_id>/]<object_id>/config
TOPIC = re.compile(r"^homeassistant/(sensor|binary_sensor|switch|button|camera)/cam-1/[A-Za-z0-9_-]+/config$")


def _validate(doc: object, schema_id: str) -> None:
    jsonschema.Draft202012Validator(schema(schema_id)).validate(doc)


def _validate_config(topic: str, doc: object) -> None:
    """A discovery config against its component's schema (the component is the topic's second level)."""
    _validate(doc, HA_DISCOVERY_SCHEMAS[topic.split("/")[-4]])


def _expected(cfg: dict[str, Any], labels: list[str]) -> set[str]:
    return set(discovery_configs(Config.model_validate(cfg), labels))


def _config(**ha: Any) -> Config:
    cams = [
        {"name": "front.door", "uri": "synthetic://"},
        {
            "name": "yard",
            "uri": "synthetic://",
            "detection": {
                "labels": ["person", "traffic light"],
                "zones": [{"name": "gate", "points": [[0, 0], [0.5, 0], [0.5, 1]], "normalized": True}],
            },
        },
        {"name": "raw", "uri": "synthetic://", "detection": {"tracking": {"enabled": False}}},
    ]
    return Config.model_validate(
        {"device_id": "cam-1", "model": {"package": "/nonexistent"}, "cameras": cams, "homeassistant": ha}
    )


def test_discovery_configs_follow_the_documented_schema() -> None:
    configs = discovery_configs(_config(enabled=True), ["face", "person"])
    assert all(TOPIC.match(t) for t in configs), list(configs)
    for topic, doc in configs.items():
        _validate_config(topic, doc)
    docs = list(configs.values())
    # one device entry: every entity names the same device; every unique_id is unique and is the object id
    assert {json.dumps(d["device"], sort_keys=True) for d in docs} == {json.dumps(docs[0]["device"], sort_keys=True)}
    assert len({d["unique_id"] for d in docs}) == len(docs)
    assert all(t.endswith(f"/cam-1/{d['unique_id']}/config") for t, d in configs.items())
    by = {c: {d["name"]: d for t, d in configs.items() if t.split("/")[1] == c} for c in HA_DISCOVERY_SCHEMAS}
    names = sorted(n for n, d in by["sensor"].items() if "entity_category" not in d)
    assert names == [
        "front.door face count",
        "front.door last event",
        "front.door person count",
        "raw face count",  # no tracker: counts of the latest frame, no last-event sensor
        "raw person count",
        "yard last event",
        "yard person count",  # the camera's own labels
        "yard traffic light count",
    ]
    assert all(d["availability_topic"] == "edged/cam-1/status" for d in docs)
    assert {d["state_topic"] for d in docs if "state_topic" in d and "entity_category" not in d} == {
        "edged/cam-1/ha/front.door",
        "edged/cam-1/ha/yard",
        "edged/cam-1/ha/raw",
    }
    # occupancy per camera and label, and per zone
    assert sorted(by["binary_sensor"]) == [
        "front.door face occupancy",
        "front.door person occupancy",
        "raw face occupancy",
        "raw person occupancy",
        "yard person occupancy",
        "yard traffic light occupancy",
        "yard zone gate occupancy",
    ]
    assert all(d["device_class"] == "occupancy" for d in by["binary_sensor"].values())
    assert "value_json.zones['gate']" in by["binary_sensor"]["yard zone gate occupancy"]["value_template"]
    # per camera: the pause switch and the snapshot button send commands the daemon's verbs take
    switch = by["switch"]["yard paused"]
    assert switch["command_topic"] == "edged/cam-1/cmd/pause" and switch["state_topic"] == "edged/cam-1/ha/yard"
    assert PauseArgs.model_validate_json(switch["payload_on"]) == PauseArgs(camera="yard", paused=True)
    assert PauseArgs.model_validate_json(switch["payload_off"]) == PauseArgs(camera="yard", paused=False)
    button = by["button"]["yard snapshot"]
    assert button["command_topic"] == "edged/cam-1/cmd/snapshot"
    assert SnapshotArgs.model_validate_json(button["payload_press"]) == SnapshotArgs(camera="yard")
    assert by["camera"]["yard snapshot image"]["topic"] == "edged/cam-1/snapshot/yard"
    assert len(by["switch"]) == len(by["button"]) == len(by["camera"]) == 3
    # the device's diagnostics, read from its telemetry and status
    diag = {n: d for n, d in by["sensor"].items() if d.get("entity_category") == "diagnostic"}
    assert {n: d["state_topic"] for n, d in diag.items()} == {
        "temperature": "edged/cam-1/telemetry",
        "inference fps": "edged/cam-1/telemetry",
        "spool backlog": "edged/cam-1/telemetry",
        "model version": "edged/cam-1/status",
    }
    # the schema refuses what Home Assistant would silently ignore: a misspelt key
    bad = {**docs[0], "state_topc": "x"}
    with pytest.raises(jsonschema.ValidationError, match="state_topc"):
        _validate(bad, HA_SENSOR_SCHEMA)
    only = discovery_configs(_config(enabled=True, labels=["car"], discovery_prefix="ha/test", name="Gate"), ["face"])
    assert all(t.startswith("ha/test/") for t in only)
    assert {d["device"]["name"] for d in only.values()} == {"Gate"}
    assert sum(d["name"].endswith("car count") for d in only.values()) == 3


def _plateaus(counts: list[int]) -> list[int]:
    """Runs of equal counts, with the steps a count passes through on its way (0 -> 1 -> 2 is 0 -> 2)."""
    runs = [k for k, _ in itertools.groupby(counts)]
    out: list[int] = []
    for i, v in enumerate(runs):
        if 0 < i < len(runs) - 1 and min(runs[i - 1], runs[i + 1]) < v < max(runs[i - 1], runs[i + 1]):
            continue
        out.append(v)
    return [k for k, _ in itertools.groupby(out)]


def _run(broker, subscribe, start_daemon, tmp: Path, cfg: dict[str, Any], name: str, *args: str) -> tuple[Any, Any]:
    ha_sub = subscribe(broker, "homeassistant/#")
    dev_sub = subscribe(broker, "edged/#")
    d = start_daemon(write_config(tmp / f"{name}.yaml", cfg), *args)
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    dev_sub.wait_stopped(10)
    return ha_sub, dev_sub


def test_home_assistant_sees_the_demo_faces_come_and_go(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    truth = json.loads(demo.ground_truth.read_text())["frames"]
    want = _plateaus([len(f["faces"]) for f in truth])  # [0, 1, 0, 2, 0, 2]
    cam = {
        "name": "lobby",
        "uri": f"file://{demo.video}",
        "realtime": False,
        "detection": {"tracking": {"min_hits": 3, "max_age": 5}},  # publish: frames (the default)
    }
    cfg = base_config(broker, demo, tmp_path, [cam], homeassistant={"enabled": True})
    ha_sub, dev_sub = _run(broker, subscribe, start_daemon, tmp_path, cfg, "first")

    configs = {m.topic: m for m in ha_sub.messages}
    assert set(configs) == _expected(cfg, ["face"])
    assert {
        "homeassistant/sensor/test-01/edged_test-01_lobby_face_count/config",
        "homeassistant/sensor/test-01/edged_test-01_lobby_last_event/config",
        "homeassistant/binary_sensor/test-01/edged_test-01_lobby_face_occupancy/config",
        "homeassistant/switch/test-01/edged_test-01_lobby_paused/config",
    } < set(configs)
    for m in configs.values():
        _validate_config(m.topic, m.json())
    count_cfg = configs["homeassistant/sensor/test-01/edged_test-01_lobby_face_count/config"].json()
    # availability: the device's retained status, online while it ran, stopped (-> offline) after
    statuses = [m.json()["state"] for m in dev_sub.on("status")]
    assert count_cfg["availability_topic"] == "edged/test-01/status" and statuses[0] == "online"

    states = [m for m in dev_sub.messages if m.topic == count_cfg["state_topic"]]
    for m in states:
        _validate(m.json(), HA_STATE_SCHEMA)
    counts = [m.json()["counts"]["face"] for m in states]
    frames = len(dev_sub.results("lobby"))
    print(f"\nhome assistant: {len(states)} state messages for {frames} frames; counts {counts}")
    print(f"plateaus {_plateaus(counts)} against the truth's {want}")
    assert frames >= 280
    assert len(states) <= frames / 5  # when the count changes, not per frame
    assert _plateaus(counts) == want
    # tracks are numbered from 1 as they are confirmed: the truth's five face appearances, one track each
    # (two tracks that appear on one frame leave one last event: the ids seen are a subset)
    ids = {m.json()["last_event"]["track_id"] for m in states if m.json()["last_event"]}
    assert max(ids) == 5, ids
    assert read_published(tmp_path / "state") == sorted([*configs, count_cfg["state_topic"]])

    # a new config without the camera's labels (a camera renamed): the old entities are removed
    cam2 = {"name": "hall", "uri": "synthetic://?fps=15"}
    cfg2 = base_config(broker, demo, tmp_path, [cam2], homeassistant={"enabled": True})
    ha2, dev2 = _run(broker, subscribe, start_daemon, tmp_path, cfg2, "second", "--duration", "3")
    cleared = {m.topic for m in ha2.messages if not m.payload} | {m.topic for m in dev2.messages if not m.payload}
    second = _expected(cfg2, ["face"])
    assert cleared == {*(set(configs) - second), "edged/test-01/ha/lobby"}  # the device's diagnostics stay
    assert {m.topic for m in ha2.messages if m.payload and not m.retain} == second
    # discovery turned off: what the last run announced is cleared, and the list of it goes
    cfg3 = base_config(broker, demo, tmp_path, [cam2])
    ha3, dev3 = _run(broker, subscribe, start_daemon, tmp_path, cfg3, "third", "--duration", "3")
    assert {m.topic for m in ha3.messages if not m.payload} == {
        m.topic for m in ha2.messages if m.payload and not m.retain
    }
    assert {m.topic for m in dev3.messages if not m.payload} == {"edged/test-01/ha/hall"}
    assert not (tmp_path / "state" / STATE_FILE).exists()
    # what the broker holds now: nothing retained under the discovery prefix
    late = subscribe(broker, "homeassistant/#")
    late.client.publish("homeassistant/_probe", b"x", qos=1)  # comes after any retained message
    wait_until(lambda: bool(late.on("_probe")), 5, "the probe message")
    assert [m.topic for m in late.messages if m.topic != "homeassistant/_probe"] == []


def test_discovery_is_sent_again_at_every_connect(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """A broker restarted without persistence has lost every retained message: the daemon's reconnect
    announces the entities and their states again (and availability comes back with the status)."""
    cams = [{"name": "lobby", "uri": "synthetic://?fps=15"}]
    cfg = base_config(broker, demo, tmp_path, cams, homeassistant={"enabled": True, "discovery_prefix": "ha"})
    d = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    sub = subscribe(broker, "ha/#")
    want = {t.replace("homeassistant/", "ha/", 1) for t in _expected(cfg, ["face"])}
    wait_until(lambda: {m.topic for m in sub.messages} == want, 60, "the discovery configs")
    broker.stop()
    broker.start()
    # a subscriber that comes after the restart sees them retained: sent again at the daemon's reconnect
    late = subscribe(broker, "#")
    wait_until(
        lambda: (
            {m.topic for m in late.messages if m.payload}
            >= {
                "ha/sensor/test-01/edged_test-01_lobby_face_count/config",
                "ha/sensor/test-01/edged_test-01_lobby_last_event/config",
                "edged/test-01/ha/lobby",
                "edged/test-01/status",
            }
        ),
        30,
        "discovery, state and status after the broker's restart",
    )
    for m in late.messages:
        if m.topic.startswith("ha/"):
            _validate_config(m.topic, m.json())
    assert d.stop() == 0, d.output()[-3000:]
