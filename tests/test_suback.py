"""A subscription the broker refuses is logged and shown in the retained status, not silently deaf.

mosquitto 2.0.11 grants what its acl_file denies (SUBACK 0), so the broker here loads a plugin of ours
(tests/mosq_deny_plugin.c, built with cc against Debian's mosquitto-dev) that refuses SUBSCRIBE to one
device's ``cmd/+``: the real broker answers 0x87 "Not authorized". A second device on the same broker, whose
subscription is granted, answers the same command: the refused one's silence is measured against it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from edged.protocol import STATUS_SCHEMA, schema

from .conftest import Broker, base_config, wait_until, write_config
from .test_ota import build, push

HEADERS = [Path("/usr/include/mosquitto_broker.h"), Path("/usr/include/mosquitto_plugin.h")]
DENIED = "edged/deaf-01/cmd/+"


def start_refusing(tmp_path: Path, denied: str) -> Broker:
    """mosquitto with the plugin refusing SUBSCRIBE to `denied` (and allowing everything else)."""
    cc = shutil.which("cc")
    if cc is None or not all(h.exists() for h in HEADERS):
        pytest.skip("no cc or no mosquitto-dev headers (apt-get install mosquitto-dev) to build the refusing plugin")
    plugin = tmp_path / "mosq_deny_plugin.so"
    src = Path(__file__).with_name("mosq_deny_plugin.c")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(plugin), str(src)], check=True, timeout=120)
    b = Broker(tmp_path, extra=f"allow_anonymous true\nplugin {plugin}\nplugin_opt_deny_subscribe {denied}")
    b.start()
    return b


@pytest.fixture
def refusing_broker(tmp_path: Path) -> Any:
    b = start_refusing(tmp_path, DENIED)
    yield b
    b.stop()


def camera() -> list[dict[str, Any]]:
    return [{"name": "pattern", "uri": "synthetic://?width=160&height=120&fps=2", "fps_max": 2}]


def test_a_refused_command_subscription_is_logged_and_shown_in_status(
    refusing_broker: Broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """On the code before the check: the status never listed the refusal and nothing was logged."""
    b = refusing_broker
    sub = subscribe(b, "edged/#")
    deaf_dir, ok_dir = tmp_path / "deaf", tmp_path / "ok"
    deaf_dir.mkdir()
    ok_dir.mkdir()
    deaf_cfg = write_config(tmp_path / "deaf.yaml", base_config(b, demo, deaf_dir, camera(), device_id="deaf-01"))
    ok_cfg = write_config(tmp_path / "ok.yaml", base_config(b, demo, ok_dir, camera(), device_id="ok-01"))
    deaf, hearing = start_daemon(deaf_cfg), start_daemon(ok_cfg)

    def status(dev: str) -> dict[str, Any]:
        docs = [m.json() for m in sub.on(f"edged/{dev}/status")]
        return docs[-1] if docs else {}

    wait_until(lambda: "refused_subscriptions" in status("deaf-01"), 90, f"the refusal in status:\n{deaf.output()}")
    doc = status("deaf-01")
    jsonschema.validate(doc, schema(STATUS_SCHEMA))
    assert doc["state"] == "online"
    assert doc["refused_subscriptions"] == [{"topic": DENIED, "reason": "Not authorized", "code": 0x87}], doc
    # a late subscriber (an operator's `mosquitto_sub`, `edged watch`) gets it from the retained status
    late = subscribe(b, "edged/deaf-01/status")
    wait_until(lambda: bool(late.messages), 10, "the retained status")
    assert late.messages[-1].json().get("refused_subscriptions"), late.messages[-1].json()
    assert f"refused our subscription to {DENIED}: Not authorized (0x87)" in deaf.output()

    wait_until(lambda: status("ok-01").get("state") == "online", 90, f"the other device online:\n{hearing.output()}")
    assert "refused_subscriptions" not in status("ok-01")
    sender = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    sender.connect(b.host, b.port)
    sender.loop_start()
    try:

        def ask() -> bool:  # again until the hearing device answers: its subscription may be a moment behind
            for dev in ("deaf-01", "ok-01"):
                sender.publish(f"edged/{dev}/cmd/status", json.dumps({}).encode(), qos=1)
            return bool(sub.on("edged/ok-01/cmd/status/reply"))

        wait_until(ask, 60, "the device whose subscription was granted to answer", step=1.0)
    finally:
        sender.disconnect()
        sender.loop_stop()
    assert json.loads(sub.on("edged/ok-01/cmd/status/reply")[0].payload)["ok"] is True
    assert not sub.on("edged/deaf-01/cmd/status/reply"), "the refused device answered a command"
    assert deaf.stop() == 0 and hearing.stop() == 0


def test_a_pusher_whose_subscription_is_refused_says_so_at_once(
    tmp_path: Path, demo: DemoAssets, signer: SigningKey
) -> None:
    """`edged push` listens on each device's ota/status before it offers; a refused SUBSCRIBE there means no
    answer could reach it. On the code before the check it offered anyway and waited out its --timeout with
    no word of why ("no answer")."""
    b = start_refusing(tmp_path, "edged/cam-07/ota/status")
    try:
        tar = build(demo, tmp_path, signer, 2)
        t0 = time.monotonic()
        r = push(b, tar, "--device", "cam-07", timeout=150)
        took = time.monotonic() - t0
    finally:
        b.stop()
    assert r.returncode != 0, r.stderr
    assert "refused our subscription to edged/cam-07/ota/status (Not authorized)" in r.stderr, r.stderr
    assert "check the broker's ACL" in r.stderr
    assert took < 60, f"{took:.0f} s: the refusal should end the push at its SUBACK, not at --timeout"
