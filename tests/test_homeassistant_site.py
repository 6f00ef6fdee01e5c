"""Home Assistant that controls (issue 32 item 5), through the site as shipped: mosquitto with
systemd/mosquitto/edged.conf and the edged.acl made from the topic table, certificates from `edged certs`,
Home Assistant's MQTT integration played by a client with its own identity (``homeassistant``). Its pause
switch stops a camera's results on a running daemon and they resume after; its snapshot button brings the
camera entity's JPEG; it may send those two verbs and no other; availability flips on the last will.

No real Home Assistant runs here (it is not installable in the test's environment): what it would send is
taken from the daemon's own discovery documents (validated against Home Assistant's documented schema in
tests/test_homeassistant.py), and what it would read is checked at the topics its documents name."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt

from edged.models.demo import DemoAssets
from edged.protocol.schemas import HA_DISCOVERY_SCHEMAS, schema
from tests.conftest import DaemonProc, base_config, wait_until, write_config
from tests.test_site import SiteBroker, acked, connect, shipped, site, subscribed  # noqa: F401  (fixtures)

NOT_AUTHORIZED = 0x87


def _docs(got: list[mqtt.MQTTMessage]) -> dict[str, dict[str, Any]]:
    return {m.topic: json.loads(m.payload) for m in list(got) if m.topic.startswith("homeassistant/") and m.payload}


def _states(got: list[mqtt.MQTTMessage], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in list(got) if m.topic == topic and m.payload]


def test_the_switch_pauses_a_camera_and_availability_follows_the_last_will(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect,  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon,
) -> None:
    pki = site / "certs"
    backend, seen = connect(shipped, "backend")  # to count the device's results (Home Assistant may not)
    subscribed(backend, "edged/cam-01/results/+")
    ha, got = connect(shipped, "homeassistant")
    subscribed(ha, "homeassistant/#", "edged/+/status", "edged/+/ha/+", "edged/+/telemetry", "edged/+/snapshot/+")
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 10}]
    doc = base_config(shipped, demo, tmp_path, cams, device_id="cam-01", homeassistant={"enabled": True})
    tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "cam-01.crt"), "key_file": str(pki / "cam-01.key")}
    doc["mqtt"]["tls"] = tls
    d: DaemonProc = start_daemon(write_config(tmp_path / "cam-01.yaml", doc))

    def results() -> int:
        return sum(1 for m in list(seen) if m.topic == "edged/cam-01/results/lobby")

    def telemetry() -> int:
        return sum(1 for m in list(got) if m.topic == "edged/cam-01/telemetry")

    wait_until(lambda: results() >= 5, 90, "results at the backend\n" + d.output()[-2000:])
    switch_topic = "homeassistant/switch/cam-01/edged_cam-01_lobby_paused/config"
    wait_until(lambda: switch_topic in _docs(got), 20, "the switch's discovery config")
    docs = _docs(got)
    for topic, config in docs.items():  # every document Home Assistant got is one it documents
        jsonschema.Draft202012Validator(schema(HA_DISCOVERY_SCHEMAS[topic.split("/")[1]])).validate(config)
    assert {t.split("/")[1] for t in docs} == {"sensor", "binary_sensor", "switch", "button", "camera"}
    switch = docs[switch_topic]
    state_topic = switch["state_topic"]
    wait_until(lambda: bool(_states(got, state_topic)), 10, "the camera's state")
    assert _states(got, state_topic)[-1]["paused"] is False

    # the switch on: Home Assistant's command, through the ACL; the camera's results stop
    assert acked(ha, switch["command_topic"], switch["payload_on"].encode()) == 0
    wait_until(lambda: _states(got, state_topic)[-1]["paused"] is True, 20, "the state saying paused")
    t0 = telemetry()
    wait_until(lambda: telemetry() >= t0 + 1, 10, "a telemetry interval (what was in flight is delivered)")
    n_paused = results()
    wait_until(lambda: telemetry() >= t0 + 4, 20, "three more telemetry intervals")
    assert results() == n_paused, "results came while the camera was paused"
    # the switch off: they resume
    assert acked(ha, switch["command_topic"], switch["payload_off"].encode()) == 0
    wait_until(lambda: _states(got, state_topic)[-1]["paused"] is False, 20, "the state saying running")
    wait_until(lambda: results() >= n_paused + 5, 30, "results again")
    print(
        f"\nhome assistant: {n_paused} results before the pause, none during 3 telemetry intervals, {results()} after"
    )

    # the snapshot button: the camera entity's topic gets the annotated JPEG
    button = docs["homeassistant/button/cam-01/edged_cam-01_lobby_snapshot/config"]
    image = docs["homeassistant/camera/cam-01/edged_cam-01_lobby_image/config"]
    assert acked(ha, button["command_topic"], button["payload_press"].encode()) == 0
    wait_until(lambda: any(m.topic == image["topic"] for m in list(got)), 20, "the snapshot at Home Assistant")
    jpeg = next(m.payload for m in list(got) if m.topic == image["topic"])
    assert jpeg[:2] == b"\xff\xd8"
    # those two verbs and nothing broader: any other verb, another topic of the device, refused by the broker
    for topic in ("edged/cam-01/cmd/resume", "edged/cam-01/cmd/reload", "edged/cam-01/cmd/ota", "edged/cam-01/status"):
        assert acked(ha, topic, b"{}") == NOT_AUTHORIZED, topic

    # availability: online, then the last will when the daemon dies without a goodbye
    status = [json.loads(m.payload) for m in list(got) if m.topic == switch["availability_topic"]]
    assert status[-1]["state"] == "online"
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    wait_until(
        lambda: (
            [json.loads(m.payload) for m in list(got) if m.topic == switch["availability_topic"]][-1]["state"]
            == "offline"
        ),
        20,
        "the last will at Home Assistant",
    )
    # the documents' availability template maps that state to payload_not_available
    assert "value_json.state == 'online'" in switch["availability_template"]
    assert switch["payload_not_available"] == "offline"
