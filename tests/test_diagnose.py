"""`edged diagnose` (and `edged fleet`) through the site as shipped (mosquitto with the shipped edged.conf
and edged.acl, certificates from `edged certs`; tests/test_site.py): a real daemon whose config holds
credentials (an RTSP camera's password and token in its URI, an MQTT password file) answers with its doctor,
logs, config, spool and store, in parts; not one part's raw bytes carries a credential. Only the backend may
ask: a device's PUBLISH of the verb is refused by the broker. Plus the parts' contract and the secret rules,
without a broker."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest

from edged.cli.diagnose import show
from edged.daemon.diagnose import LogRing, known_secrets, public_config
from edged.errors import CommandError
from edged.models.demo import DemoAssets
from edged.protocol.commands import join_parts, split_parts
from edged.protocol.schemas import DIAGNOSE_SCHEMA, schema
from tests.conftest import DaemonProc, base_config, edged_cli, wait_until, write_config
from tests.test_site import SiteBroker, acked, backend_config, connect, shipped, site, subscribed  # noqa: F401

RTSP_PASSWORD = "Rtsp-S3cret-9f2c"
MQTT_PASSWORD = "Mqtt-S3cret-77ab"
QUERY_TOKEN = "tok-5e1d-secret"


@dataclass
class Addr:
    host: str
    port: int


def test_diagnose_round_trip_through_the_shipped_acl_never_carries_a_credential(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., tuple[mqtt.Client, list[mqtt.MQTTMessage]]],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    pki = site / "certs"
    password_file = tmp_path / "mqtt_password"
    password_file.write_text(MQTT_PASSWORD + "\n")
    cams: list[dict[str, Any]] = [
        {"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 10},
        # a camera that never answers (a closed port), whose URI carries a password and a token
        {"name": "gate", "uri": f"rtsp://admin:{RTSP_PASSWORD}@127.0.0.1:9/live?token={QUERY_TOKEN}"},
    ]
    doc = base_config(shipped, demo, tmp_path, cams, device_id="cam-01")
    tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "cam-01.crt"), "key_file": str(pki / "cam-01.key")}
    doc["mqtt"] = {**doc["mqtt"], "tls": tls, "username": "cam-01", "password_file": str(password_file)}
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    assert RTSP_PASSWORD in cfg.read_text() and QUERY_TOKEN in cfg.read_text()  # the grep below can fail
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/cam-01/#")
    d = start_daemon(cfg)
    try:
        wait_until(
            lambda: d.proc.poll() is not None or any(m.topic == "edged/cam-01/results/lobby" for m in list(seen)),
            90,
            "results",
        )
        assert d.proc.poll() is None, "the daemon exited"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d.output()[-3000:]}") from None
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    r = edged_cli("diagnose", "cam-01", "-c", str(ops), "--json", "--lines", "500", "--part-size", "1024", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + d.output()[-3000:]
    got: dict[str, Any] = json.loads(r.stdout)
    jsonschema.Draft202012Validator(schema(DIAGNOSE_SCHEMA)).validate(got)
    # what the operator came for: the doctor's checks, the log, the config in force, spool and store
    names = {c["name"] for c in got["doctor"]["checks"]}
    assert {"python", "broker", "model", "state_dir"} <= names, names
    assert any("lobby" in line or "serving" in line for line in got["logs"]["lines"]), got["logs"]["lines"][-20:]
    assert got["config"]["device_id"] == "cam-01" and got["config"]["mqtt"]["password_file"] == str(password_file)
    gate = got["config"]["cameras"][1]["uri"]
    assert gate.startswith("rtsp://***@127.0.0.1:9/live") and "token=***" in gate, gate
    assert got["spool"]["spool_state"] == "ok" and got["store"]["package"].startswith("blazeface")
    # every part's raw bytes, as the broker carried them to the reply topic
    parts = [m for m in list(seen) if m.topic.startswith("edged/cam-01/reply/diagnose-")]
    results = [json.loads(m.payload)["result"] for m in parts]
    assert len({p["part"] for p in results}) == results[0]["parts"] >= 3, [p["part"] for p in results]
    for m in parts:
        for secret in (RTSP_PASSWORD, MQTT_PASSWORD, QUERY_TOKEN):
            assert secret.encode() not in m.payload, (secret, m.topic)
    assert MQTT_PASSWORD not in r.stdout and RTSP_PASSWORD not in r.stdout
    # the report form: the doctor's lines, model, spool, config, the log's newest lines
    report = io.StringIO()
    show(got, out=report)
    text = report.getvalue()
    assert "doctor (" in text and "ok   broker" in text and f"log (the newest {len(got['logs']['lines'])} of" in text
    # `edged fleet` with the backend's identity through the shipped ACL: its fence comes back, cam-01 is online
    r = edged_cli("fleet", "-c", str(ops), timeout=60)
    assert r.returncode == 0 and "fence missing" not in r.stderr, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("cam-01 "))
    assert row.split()[1] == "online" and "blazeface" in row, r.stdout
    # a device may not ask another device, nor itself, nor may Home Assistant's identity (it has its own
    # pause and snapshot grants at most): the shipped ACL refuses the PUBLISH
    for name in ("cam-02", "cam-01", "homeassistant"):
        device, _ = connect(shipped, name)
        assert acked(device, "edged/cam-01/cmd/diagnose", b"{}").value == 0x87, name


def test_parts_join_back_and_refuse_what_does_not_fit() -> None:
    import hashlib

    text = json.dumps({"schema": "edged.diagnose/1", "logs": ["x" * 5000, '"quoted"' * 300]})
    slices = split_parts(text, 1024)
    digest = hashlib.sha256(text.encode()).hexdigest()
    results: list[dict[str, Any]] = [
        {"id": "a", "part": k, "parts": len(slices), "sha256": digest, "data": s} for k, s in enumerate(slices)
    ]
    assert join_parts(list(reversed(results))) == json.loads(text)
    assert all(len(json.dumps(r)) < 2 * 1024 + 200 for r in results)  # escaping at most doubles a slice
    with pytest.raises(CommandError, match="missing"):
        join_parts(results[:-1])
    with pytest.raises(CommandError, match="SHA-256"):
        join_parts([{**r, "data": r["data"].upper()} for r in results])
    with pytest.raises(CommandError, match="another document"):
        join_parts([results[0], {**results[1], "id": "b"}])


def test_secrets_are_removed_from_the_config_and_the_log_ring_scrubs(tmp_path: Path, demo: DemoAssets) -> None:
    from edged.daemon.config import load_config

    pw = tmp_path / "pw"
    pw.write_text(MQTT_PASSWORD + "\n")
    cams = [{"name": "gate", "uri": f"rtsp://admin:{RTSP_PASSWORD}@10.0.0.9/live?user=admin&password=x9y8z7w6"}]
    doc = base_config(Addr("127.0.0.1", 1883), demo, tmp_path, cams)
    doc["mqtt"] = {**doc["mqtt"], "username": "dev", "password_file": str(pw)}
    cfg = load_config(write_config(tmp_path / "c.yaml", doc))
    shown = json.dumps(public_config(cfg))
    assert RTSP_PASSWORD not in shown and "x9y8z7w6" not in shown and "password=***" in shown
    assert str(pw) in shown  # a file is shown by its path
    assert set(known_secrets(cfg)) >= {MQTT_PASSWORD, RTSP_PASSWORD, "x9y8z7w6"}
    ring = LogRing(capacity=3)
    log = logging.getLogger("edged.test.ring")
    log.addHandler(ring)
    try:
        for i in range(5):
            log.warning("camera rtsp://admin:%s@10.0.0.9/live failed (%d)", RTSP_PASSWORD, i)
    finally:
        log.removeHandler(ring)
    lines = ring.newest(10)
    assert len(lines) == 3 and ring.seen == 5 and lines[-1].endswith("failed (4)")
    assert all(RTSP_PASSWORD not in line and "rtsp://***@10.0.0.9" in line for line in lines), lines
