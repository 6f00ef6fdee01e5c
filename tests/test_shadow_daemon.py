"""Shadow evaluation on a running daemon (issue 29 items 1-2, the device side), through the shipped broker
config and ACL: `edged push --shadow` of an identical candidate (the same BlazeFace as a new version) runs it
beside the serving version on the demo video, reports agreement >= 0.99 on …/shadow and promotes it; a worse
one (the same model with a wrong `mean` in its signed manifest, 255 for 127.5: every input value shifted
by -1, which gives several times the false faces and none of the true ones) is never served: the push ends
rejected (model_rejected) with the report's figures, the version is marked bad and its files are gone.
Real mosquitto (edged.conf, edged.acl, TLS identities), a real daemon running ONNX Runtime, the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from edged.protocol.schemas import OTA_SCHEMA, SHADOW_SCHEMA, schema
from tests.conftest import REPO, DaemonProc, base_config, edged_cli, free_port, wait_until, write_config
from tests.test_health import metrics
from tests.test_ota import MODEL, build, install, store_view
from tests.test_site import (  # noqa: F401
    SiteBroker,
    backend_config,
    connect,
    shipped,
    site,
    subscribed,
)

REPORT = jsonschema.Draft202012Validator(schema(SHADOW_SCHEMA))
STATUS = jsonschema.Draft202012Validator(schema(OTA_SCHEMA))
# evidence a loaded two-core machine gathers in well under a minute on the demo video
EVIDENCE = ("--sample-fps", "4", "--min-frames", "16", "--min-detections", "8", "--min-s", "4", "--max-s", "120")


def device(b: SiteBroker, pki_dir: Path, demo: DemoAssets, tmp: Path) -> tuple[dict[str, Any], Path]:
    pki = pki_dir / "certs"
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 8}]
    doc = base_config(b, demo, tmp, cams, device_id="cam-01", state_dir=str(tmp / "cam-01"))
    doc["model"] = {"name": MODEL, "keys_dir": str(tmp / "trusted"), "probation_s": 600,
                    "probation_batches": 100000, "onnxruntime": {"threads": 1}}  # fmt: skip
    doc["detection"] = {"score_threshold": 0.5}
    doc["mqtt"]["tls"] = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "cam-01.crt"),
                          "key_file": str(pki / "cam-01.key")}  # fmt: skip
    doc["ota"] = {"chunk_kb": 64, "window": 4, "retry_s": 2}
    doc["health"] = {"enabled": True, "port": free_port()}
    return doc, write_config(tmp / "cam-01.yaml", doc)


@dataclass
class Device:
    """cam-01 serving version 1 through the shipped broker, the backend's client recording everything."""

    daemon: DaemonProc
    seen: list[mqtt.MQTTMessage]
    ops: Path
    port: int

    def on(self, suffix: str) -> list[mqtt.MQTTMessage]:
        return [m for m in list(self.seen) if m.topic == f"edged/cam-01/{suffix}" and m.payload]

    def last(self, suffix: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.on(suffix)[-1].payload)
        return doc

    def versions(self) -> list[int]:
        return [json.loads(m.payload)["model"]["version"] for m in self.on("results/lobby")]

    def push(self, tar: Path, *args: str) -> tuple[int, str]:
        argv = ("push", str(tar), "--device", "cam-01", "-c", str(self.ops), "--timeout", "240", *args)
        r = edged_cli(*argv, timeout=300)
        return r.returncode, r.stdout + r.stderr


@pytest.fixture
def cam01(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., Any],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> Device:
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/#")
    doc, cfg = device(shipped, site, demo, tmp_path)
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    install(cfg, build(demo, tmp_path, signer, 1))
    dev = Device(start_daemon(cfg), seen, ops, doc["health"]["port"])
    wait_until(lambda: len(dev.on("results/lobby")) >= 3, 90, "results\n" + dev.daemon.output())
    return dev


def test_shadow_promotes_an_identical_candidate_through_the_shipped_acl(
    cam01: Device, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """The same model as version 2, promoted on its report; /metrics shows the evaluation meanwhile, and every
    result while it runs is the serving version's."""
    dev, port = cam01, cam01.port
    assert metrics(port)[("edged_shadow_running", ())] == 0.0
    args = [str(build(demo, tmp_path, signer, 2)), "--device", "cam-01", "-c", str(dev.ops), "--shadow", *EVIDENCE]
    pusher = subprocess.Popen([sys.executable, "-m", "edged", "push", *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    wait_until(lambda: metrics(port).get(("edged_shadow_frames", ()), 0.0) >= 2, 120, "shadow gauges on /metrics")
    scraped = metrics(port)
    assert scraped[("edged_shadow_running", ())] == 1.0 and scraped[("edged_shadow_agreement", ())] >= 0.99
    out, _ = pusher.communicate(timeout=300)
    assert pusher.returncode == 0, out + dev.daemon.output()[-4000:]
    assert metrics(port)[("edged_shadow_running", ())] == 0.0
    reports = [json.loads(m.payload) for m in dev.on("shadow")]
    for r in reports:
        REPORT.validate(r)
    final = reports[-1]
    assert final["state"] == "passed" and final["candidate"] == {"name": MODEL, "version": 2}, final
    assert final["serving"] == {"name": MODEL, "version": 1}
    totals = final["totals"]
    assert totals["frames"] >= 16 and max(totals["serving_detections"], totals["candidate_detections"]) >= 8
    assert totals["agreement"] >= 0.99 and totals["recall"] >= 0.99 and totals["precision"] >= 0.99, totals
    assert totals["score_shift"] < 0.01 and set(totals["label_confusion"]) <= {"face"}, totals
    assert final["per_camera"]["lobby"]["frames"] == totals["frames"]
    assert final["memory_mb"]["candidate"] > 0 and final["hold_ms"]["batches"] >= 1
    print("shadow passed:", json.dumps({k: final[k] for k in ("totals", "hold_ms", "memory_mb", "evidence")}))
    assert 0.5 < totals["latency_ratio"] < 2.0, totals  # the same model: its own CPU time per image, alike
    statuses = [json.loads(m.payload) for m in dev.on("ota/status")]
    for s in statuses:
        STATUS.validate(s)
    seen = list(dev.seen)
    shadowing = [i for i, m in enumerate(seen) if m.topic.endswith("/ota/status")
                 and json.loads(m.payload)["state"] == "shadowing"]  # fmt: skip
    assert len(shadowing) >= 2, [s["state"] for s in statuses]
    assert statuses[-1]["state"] == "probation" and statuses[-1]["detail"]["shadow"]["state"] == "passed"
    # while it shadowed every result was the serving version's: the candidate's output is never a result
    during = [json.loads(m.payload)["model"]["version"] for m in seen[shadowing[0] : shadowing[-1]]
              if m.topic.endswith("/results/lobby")]  # fmt: skip
    assert during and set(during) == {1}, during
    wait_until(lambda: dev.versions()[-3:] == [2, 2, 2], 60, "results from the promoted version")
    assert dev.daemon.stop() == 0
    assert store_view(tmp_path / "cam-01")["current"] == 2


@pytest.mark.slow
def test_shadow_rejects_a_wrong_mean_and_a_scene_without_evidence_through_the_shipped_acl(
    cam01: Device, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """A worse candidate is never served: rejected with model_rejected and the figures, marked bad, its files
    gone; a scene that cannot give the evidence asked for by max_s ends no_evidence, not marked bad. (The
    same on values, in process, by default: tests/test_shadow_runner.py.)"""
    dev = cam01
    # the same graph, its manifest's mean wrong (255 for 127.5: inputs in [-2, 0], not [-1, 1])
    src = demo.packages[MODEL].manifest.input
    wrong = build(demo, tmp_path, signer, 2, input={**src.model_dump(exclude_none=True), "mean": [255.0] * 3})
    rc, out = dev.push(wrong, "--shadow", *EVIDENCE)
    assert rc != 0 and "model_rejected" in out, out + dev.daemon.output()[-4000:]
    final = dev.last("shadow")
    REPORT.validate(final)
    assert final["state"] == "failed" and final["candidate"]["version"] == 2 and final["reasons"], final
    assert final["totals"]["agreement"] < 0.95, final["totals"]
    status = dev.last("ota/status")
    STATUS.validate(status)
    assert status["state"] == "rejected" and status["error"]["code"] == "model_rejected", status
    assert status["detail"]["shadow"]["totals"]["agreement"] == final["totals"]["agreement"]
    events = [json.loads(m.payload) for m in dev.on("events")]
    rejected = [e for e in events if e["type"] == "model_rejected"]
    assert rejected and rejected[-1]["code"] == "model_rejected" and rejected[-1]["shadow"]["frames"] >= 16
    n_before = len(dev.on("results/lobby"))
    wait_until(lambda: len(dev.on("results/lobby")) >= n_before + 5, 60, "results after the rejection")
    assert set(dev.versions()) == {1}  # never served

    # more detections asked for than the scene gives by max_s: no_evidence, never a pass
    few = ("--sample-fps", "4", "--min-frames", "4", "--min-detections", "100000", "--min-s", "1", "--max-s", "5")
    rc, out = dev.push(build(demo, tmp_path, signer, 3), "--shadow", *few)
    assert rc != 0 and "no_evidence" in out, out + dev.daemon.output()[-3000:]
    final = dev.last("shadow")
    REPORT.validate(final)
    assert final["state"] == "no_evidence" and final["candidate"]["version"] == 3, final
    assert final["reasons"] and "detections" in final["reasons"][0] and final["evidence"]["elapsed_s"] >= 5
    status = dev.last("ota/status")
    assert status["state"] == "rejected" and status["error"]["code"] == "no_evidence", status
    assert set(dev.versions()) == {1}
    assert dev.daemon.stop() == 0
    view = store_view(tmp_path / "cam-01")
    assert view["current"] == 1 and 2 in view["bad"] and 2 not in view["versions"], view
    assert 3 not in view["bad"] and 3 not in view["versions"], view
    ota = tmp_path / "cam-01" / "ota"
    assert not ota.exists() or not any(ota.iterdir())


@pytest.mark.slow
def test_a_stop_while_shadowing_keeps_the_candidate_and_the_next_start_shadows_it_again(
    cam01: Device, demo: DemoAssets, tmp_path: Path, signer: SigningKey, start_daemon: Callable[..., DaemonProc]
) -> None:
    """SIGTERM during the evaluation: a clean stop, the staged candidate kept (never current); the next start
    resumes the transfer, evaluates from nothing and promotes it."""
    dev = cam01
    slow = ("--sample-fps", "4", "--min-frames", "16", "--min-detections", "8", "--min-s", "20", "--max-s", "120")
    args = [str(build(demo, tmp_path, signer, 2)), "--device", "cam-01", "-c", str(dev.ops), "--shadow", *slow]
    pusher = subprocess.Popen([sys.executable, "-m", "edged", "push", *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: any(json.loads(m.payload)["state"] == "shadowing" for m in dev.on("ota/status")), 120,
                   "shadowing")  # fmt: skip
        first = dev.last("shadow")["started"]
        assert dev.daemon.stop() == 0
    finally:
        pusher.kill()
        pusher.communicate(timeout=30)
    state = tmp_path / "cam-01"
    assert store_view(state)["current"] == 1 and 2 not in store_view(state)["versions"]
    assert any((state / "ota").iterdir()), "the staged candidate is kept for the next start"
    n = len(dev.on("results/lobby"))
    start_daemon(tmp_path / "cam-01.yaml")
    wait_until(lambda: dev.last("shadow")["started"] > first and dev.last("shadow")["state"] == "passed", 180,
               "the resumed evaluation to pass")  # fmt: skip
    wait_until(lambda: dev.versions()[-3:] == [2, 2, 2], 60, "results from the promoted version")
    assert set(dev.versions()[n:]) <= {1, 2}
    assert dev.last("ota/status")["state"] == "probation"
