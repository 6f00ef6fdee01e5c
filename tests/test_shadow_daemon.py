"""Shadow evaluation on a running daemon (issue 29 items 1-2, the device side), through the shipped broker
config and ACL: `edged push --shadow` of an identical candidate (the same BlazeFace as a new version) runs it
beside the serving version on the demo video, reports agreement >= 0.99 on …/shadow and promotes it; a worse
one (the same model with a wrong `mean` in its signed manifest, 255 for 127.5: every input value shifted
by -1, which gives several times the false faces and none of the true ones) is never served: the push ends
rejected (model_rejected) with the report's figures, the version is marked bad and its files are gone, and its
disagreement frames are kept for labelling (JPEG + COCO over the health server, uploaded to a real nginx). A
candidate that cannot fit beside the serving model within memory.budget_mb is refused (over_budget); `edged
watch` shows the report; /metrics counts the verdicts.
Real mosquitto (edged.conf, edged.acl, TLS identities), a real daemon running ONNX Runtime, the real CLI."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import paho.mqtt.client as mqtt
import pytest

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from edged.protocol.schemas import OTA_SCHEMA, SHADOW_SCHEMA, schema
from tests.conftest import REPO, DaemonProc, base_config, edged_cli, free_port, wait_until, write_config
from tests.nginx_dav import DavServer
from tests.test_faults_hostile import hungry_variant
from tests.test_health import metrics
from tests.test_labelling import check_coco, check_the_videos_frame
from tests.test_labelling_daemon import fetch
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
BUDGET_MB = 600  # the daemon serving BlazeFace fits (~250 MB), and a second BlazeFace beside it
OVER_BUDGET = re.compile(
    r"shadow evaluation needs the candidate \(([0-9.]+) MB\) loaded beside the serving model \(([0-9.]+) MB of "
    rf"the ([0-9.]+) MB in use\): over the {BUDGET_MB} MB budget"
)
LABEL_MB = 0.25  # the labelling store's byte bound: two or three demo frames (~100 KB each)
# evidence a loaded two-core machine gathers in well under a minute on the demo video
EVIDENCE = ("--sample-fps", "4", "--min-frames", "16", "--min-detections", "8", "--min-s", "4", "--max-s", "120")


def device(b: SiteBroker, pki_dir: Path, demo: DemoAssets, tmp: Path, **extra: Any) -> tuple[dict[str, Any], Path]:
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
    doc.update(extra)
    return doc, write_config(tmp / "cam-01.yaml", doc)


def fetch_json(port: int, path: str) -> dict[str, Any]:
    status, ctype, body = fetch(port, path, token=None)  # no health.token_file: loopback needs none
    assert (status, ctype) == (200, "application/json"), (status, body[:300])
    doc: dict[str, Any] = json.loads(body)
    return doc


def verdicts(port: int) -> dict[str, int]:
    """edged_shadow_verdicts_total on /metrics, by verdict."""
    got = metrics(port).items()
    return {dict(labels)["verdict"]: int(v) for (name, labels), v in got if name == "edged_shadow_verdicts_total"}


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
def cam01_with(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., Any],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> Callable[..., Device]:
    """cam-01 started, its config's top-level sections given as keywords (`labelling=…`, `upload=…`)."""

    def make(**extra: Any) -> Device:
        backend, seen = connect(shipped, "backend")
        subscribed(backend, "edged/#")
        doc, cfg = device(shipped, site, demo, tmp_path, **extra)
        ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
        install(cfg, build(demo, tmp_path, signer, 1))
        dev = Device(start_daemon(cfg), seen, ops, doc["health"]["port"])
        wait_until(lambda: len(dev.on("results/lobby")) >= 3, 90, "results\n" + dev.daemon.output())
        return dev

    return make


@pytest.fixture
def cam01(cam01_with: Callable[..., Device]) -> Device:
    return cam01_with()


def test_shadow_promotes_an_identical_candidate_through_the_shipped_acl(
    cam01_with: Callable[..., Device], demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """A candidate that cannot fit beside the serving model within memory.budget_mb is refused (over_budget, the
    sentence with both models' figures), the serving model untouched and the version not marked bad. Then the
    same model as version 3, promoted on its report; /metrics shows the evaluation meanwhile, `edged watch`
    prints its report line with the figures, and every result while it runs is the serving version's."""
    dev = cam01_with(memory={"budget_mb": BUDGET_MB})
    port = dev.port
    assert metrics(port)[("edged_shadow_running", ())] == 0.0
    assert verdicts(port) == {"passed": 0, "failed": 0, "no_evidence": 0, "refused": 0}  # each, from the start

    # over the budget: a real model whose working memory is ~800 MB (BlazeFace with a 384 MiB side branch)
    hungry = hungry_variant(demo.packages[MODEL].model_path, tmp_path / "hungry.onnx", 128)
    rc, out = dev.push(build(demo, tmp_path, signer, 2, model=hungry), "--shadow", *EVIDENCE)
    assert rc != 0 and "over_budget" in out, out + dev.daemon.output()[-4000:]
    status = dev.last("ota/status")
    STATUS.validate(status)
    assert status["state"] == "rejected" and status["error"]["code"] == "over_budget", status
    said = OVER_BUDGET.search(status["error"]["message"])
    assert said, status["error"]["message"]
    candidate_mb, serving_mb, in_use_mb = (float(g) for g in said.groups())
    assert candidate_mb > BUDGET_MB and 0 < serving_mb < in_use_mb < BUDGET_MB, said.group(0)
    assert in_use_mb + candidate_mb > BUDGET_MB
    assert said.group(0) in out  # the pusher says it too
    print("refused:", said.group(0))
    assert not dev.on("shadow"), "no evaluation began"
    n = len(dev.on("results/lobby"))
    wait_until(lambda: len(dev.on("results/lobby")) >= n + 3, 60, "results after the refusal")
    assert set(dev.versions()) == {1} and metrics(port)[("edged_shadow_running", ())] == 0.0
    assert verdicts(port)["refused"] == 1

    watcher = subprocess.Popen([sys.executable, "-m", "edged", "watch", "-c", str(dev.ops), "--device", "cam-01",
                                "--duration", "400"], cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    args = [str(build(demo, tmp_path, signer, 3)), "--device", "cam-01", "-c", str(dev.ops), "--shadow", *EVIDENCE]
    pusher = subprocess.Popen([sys.executable, "-m", "edged", "push", *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: metrics(port).get(("edged_shadow_frames", ()), 0.0) >= 2, 120, "shadow gauges on /metrics")
        scraped = metrics(port)
        assert scraped[("edged_shadow_running", ())] == 1.0 and scraped[("edged_shadow_agreement", ())] >= 0.99
        out, _ = pusher.communicate(timeout=300)
        assert pusher.returncode == 0, out + dev.daemon.output()[-4000:]
    finally:
        pusher.kill()
        watcher.send_signal(signal.SIGINT)
        watched, _ = watcher.communicate(timeout=30)
    scraped = metrics(port)
    assert scraped[("edged_shadow_running", ())] == 0.0
    assert verdicts(port) == {"passed": 1, "failed": 0, "no_evidence": 0, "refused": 1}
    reports = [json.loads(m.payload) for m in dev.on("shadow")]
    for r in reports:
        REPORT.validate(r)
    final = reports[-1]
    assert final["state"] == "passed" and final["candidate"] == {"name": MODEL, "version": 3}, final
    assert final["serving"] == {"name": MODEL, "version": 1}
    totals = final["totals"]
    assert totals["frames"] >= 16 and max(totals["serving_detections"], totals["candidate_detections"]) >= 8
    assert totals["agreement"] >= 0.99 and totals["recall"] >= 0.99 and totals["precision"] >= 0.99, totals
    assert totals["score_shift"] < 0.01 and set(totals["label_confusion"]) <= {"face"}, totals
    assert final["per_camera"]["lobby"]["frames"] == totals["frames"]
    assert final["memory_mb"]["candidate"] > 0 and final["hold_ms"]["batches"] >= 1
    print("shadow passed:", json.dumps({k: final[k] for k in ("totals", "hold_ms", "memory_mb", "evidence")}))
    assert 0.5 < totals["latency_ratio"] < 2.0, totals  # the same model: its own CPU time per image, alike

    # `edged watch` through the shipped ACL as the backend: the report's line, live and final, on values
    lines = [ln for ln in watched.splitlines() if ln.startswith("shadow  ")]
    ref = f"shadow  {MODEL}@3 vs {MODEL}@1  "
    assert any(ln.startswith(ref + "shadow running: ") for ln in lines), watched[-3000:]
    figures = (f"{totals['frames']} frames, {totals['matched']}/{totals['serving_detections']} matched, "
               f"agreement {totals['agreement']:.3f}, recall {totals['recall']:.3f}, "
               f"precision {totals['precision']:.3f}")  # fmt: skip
    passed = [ln for ln in lines if ln.startswith(ref + "shadow passed: ")]
    assert passed and passed[-1].startswith(ref + "shadow passed: " + figures), (figures, lines[-3:])
    assert f"[lobby: {totals['frames']} frames, " in passed[-1], passed[-1]

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
    wait_until(lambda: dev.versions()[-3:] == [3, 3, 3], 60, "results from the promoted version")
    assert dev.daemon.stop() == 0
    view = store_view(tmp_path / "cam-01")
    assert view["current"] == 3 and 2 not in view["bad"], view  # over the budget is no fault of the model's


def test_shadow_rejects_a_wrong_mean_and_keeps_its_disagreement_frames_through_the_shipped_acl(
    cam01_with: Callable[..., Device], demo: DemoAssets, tmp_path: Path, signer: SigningKey, dav: DavServer
) -> None:
    """A worse candidate is never served: rejected with model_rejected and the figures (several times the
    serving model's detections, next to none matched) in the push output, the report, the status and the
    event; marked bad, its files gone. Its disagreement frames (labelling.enabled) are kept as JPEGs with
    both models' detections in a COCO file that validates, within the byte bound, fetched over the daemon's
    HTTP server, and uploaded to a real nginx across a stop and start of nginx. (The same on values, in
    process: tests/test_shadow_runner.py.)"""
    labelling = {"enabled": True, "upload": True, "max_mb": LABEL_MB, "max_frames": 100}
    upload = {"url": dav.url + "/dav/cam-01", "retry_min_s": 0.1, "retry_max_s": 1.0, "timeout_s": 10}
    dev = cam01_with(labelling=labelling, upload=upload)
    assert fetch_json(dev.port, "/labelling")["frames"] == []  # on, and nothing kept before a shadow
    dav.stop()  # every upload of the evaluation is refused until nginx is back
    # the same graph, its manifest's mean wrong (255 for 127.5: inputs in [-2, 0], not [-1, 1])
    src = demo.packages[MODEL].manifest.input
    wrong = build(demo, tmp_path, signer, 2, input={**src.model_dump(exclude_none=True), "mean": [255.0] * 3})
    rc, out = dev.push(wrong, "--shadow", *EVIDENCE)
    assert rc != 0 and "model_rejected" in out, out + dev.daemon.output()[-4000:]
    final = dev.last("shadow")
    REPORT.validate(final)
    assert final["state"] == "failed" and final["candidate"]["version"] == 2 and final["reasons"], final
    totals = final["totals"]
    print("shadow failed:", json.dumps(totals))
    # several times the false faces, next to none of the true ones (60 frames measured: 187 against 37, 0 matched)
    assert totals["serving_detections"] >= 4 and totals["candidate_detections"] >= 3 * totals["serving_detections"]
    assert totals["matched"] <= totals["serving_detections"] // 10, totals
    assert totals["agreement"] < 0.2 and totals["recall"] < 0.2 and totals["precision"] < 0.1, totals
    assert any(r.startswith("agreement ") and "< 0.95" in r for r in final["reasons"]), final["reasons"]
    # the push says so with the figures
    assert "rejected on shadow evidence" in out, out
    assert f"agreement {totals['agreement']:.3f}" in out and f"/{totals['serving_detections']} matched" in out, out
    status = dev.last("ota/status")
    STATUS.validate(status)
    assert status["state"] == "rejected" and status["error"]["code"] == "model_rejected", status
    shadow_status = status["detail"]["shadow"]["totals"]
    assert shadow_status["agreement"] == totals["agreement"]
    assert shadow_status["candidate_detections"] == totals["candidate_detections"], shadow_status

    def rejected_events() -> list[dict[str, Any]]:
        return [e for e in (json.loads(m.payload) for m in dev.on("events")) if e["type"] == "model_rejected"]

    # the event is spooled (a committed write, then paho); the status the push returned on went straight out
    wait_until(lambda: bool(rejected_events()), 30, "the model_rejected event")
    rejected = rejected_events()
    assert rejected[-1]["code"] == "model_rejected" and rejected[-1]["shadow"]["frames"] >= 16
    assert rejected[-1]["shadow"]["candidate_detections"] == totals["candidate_detections"], rejected[-1]
    assert rejected[-1]["shadow"]["agreement"] == totals["agreement"], rejected[-1]
    n_before = len(dev.on("results/lobby"))
    wait_until(lambda: len(dev.on("results/lobby")) >= n_before + 5, 60, "results after the rejection")
    assert set(dev.versions()) == {1}  # never served
    assert verdicts(dev.port) == {"passed": 0, "failed": 1, "no_evidence": 0, "refused": 0}

    # the disagreement frames: over the daemon's HTTP server, within the byte bound
    state = tmp_path / "cam-01" / "labelling"
    index = fetch_json(dev.port, "/labelling")
    frames, stats = index["frames"], index["stats"]
    assert frames and {f["reason"] for f in frames} == {"shadow"}, frames
    assert {(f["serving"], f["candidate"]) for f in frames} == {(f"{MODEL}@1", f"{MODEL}@2")}
    assert stats["bytes"] <= LABEL_MB * 2**20, stats
    # the byte bound bit: frames offered were turned away (or evicted), the count bound (100) far off
    assert stats["frames"] < min(stats["offered"], 100) and stats["not_kept"] + stats["evicted"] >= 1, stats
    on_disk = sum(p.stat().st_size for p in (state / "images").iterdir())
    assert on_disk == stats["bytes"] and len(list((state / "images").iterdir())) == len(frames) == stats["frames"]
    coco = fetch_json(dev.port, "/labelling/coco.json")
    check_coco(coco)
    assert {c["name"] for c in coco["categories"]} == {"face"}
    for image in coco["images"]:
        status_code, ctype, jpg = fetch(dev.port, f"/labelling/{image['file_name']}")
        assert (status_code, ctype) == (200, "image/jpeg")
        img = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape[:2] == (image["height"], image["width"]) == (540, 960)
        assert image["edged"]["disagreement"] > 0.5, image
        check_the_videos_frame(jpg, image, demo.video)  # the frame both models' boxes were found in
        assert any(a["image_id"] == image["id"] for a in coco["annotations"]), image
    # both models' boxes, each named by its model: the candidate's false faces outnumber the serving model's
    by = {m: [a for a in coco["annotations"] if a["attributes"]["model"] == m] for m in ("serving", "candidate")}
    assert len(by["candidate"]) > len(by["serving"]), {m: len(v) for m, v in by.items()}
    assert {a["attributes"]["ref"] for a in by["candidate"]} == {f"{MODEL}@2"}
    assert {a["attributes"]["ref"] for a in by["serving"]} <= {f"{MODEL}@1"}  # (a kept frame may have no true face)
    # the upload: refused while nginx is down, then every kept file arrives byte for byte once it is back
    wait_until(lambda: metrics(dev.port).get(("edged_uploads_failed_attempts_total", ()), 0) >= 1, 30,
               "uploads refused while nginx is down")  # fmt: skip
    dav.start()
    wait_until(lambda: metrics(dev.port)[("edged_uploads_queued", ())] == 0, 90, "the uploads to drain")
    remote = dav.root / "dav/cam-01/labelling"
    for image in coco["images"]:
        local = state / "images" / image["file_name"]
        assert (remote / "images" / image["file_name"]).read_bytes() == local.read_bytes()
    assert json.loads((remote / "coco.json").read_text())["images"] == coco["images"]

    assert dev.daemon.stop() == 0
    view = store_view(tmp_path / "cam-01")
    assert view["current"] == 1 and 2 in view["bad"] and 2 not in view["versions"], view
    ota = tmp_path / "cam-01" / "ota"
    assert not ota.exists() or not any(ota.iterdir())


@pytest.mark.slow
def test_the_labelling_byte_bound_holds_over_a_long_shadow_of_the_wrong_mean(
    cam01_with: Callable[..., Device], demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """A minute of the wrong-mean candidate's disagreement frames, competing with near-threshold frames of normal
    service for a store of 0.25 MiB: polled throughout, the index never holds more than the bound and the disk
    never more than the bound plus the one frame being written; the shadow frames evict the less disagreeing
    near-threshold ones, and what is left validates."""
    labelling = {"enabled": True, "max_mb": LABEL_MB, "max_frames": 100, "near_threshold": 0.3, "sample_s": 0.3}
    dev = cam01_with(labelling=labelling)
    wait_until(lambda: len(fetch_json(dev.port, "/labelling")["frames"]) >= 2, 90, "near-threshold frames kept")
    src = demo.packages[MODEL].manifest.input
    wrong = build(demo, tmp_path, signer, 2, input={**src.model_dump(exclude_none=True), "mean": [255.0] * 3})
    long = ("--sample-fps", "4", "--min-frames", "16", "--min-detections", "8", "--min-s", "60", "--max-s", "180")
    args = [str(wrong), "--device", "cam-01", "-c", str(dev.ops), "--shadow", *long]
    pusher = subprocess.Popen([sys.executable, "-m", "edged", "push", *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    images = tmp_path / "cam-01" / "labelling" / "images"
    cap, polls, largest = LABEL_MB * 2**20, 0, 0
    try:
        while pusher.poll() is None:
            index = fetch_json(dev.port, "/labelling")
            assert index["stats"]["bytes"] <= cap, index["stats"]
            largest = max([largest] + [f["bytes"] for f in index["frames"]])
            on_disk = 0
            for p in list(images.iterdir()):
                with contextlib.suppress(FileNotFoundError):  # evicted between the listing and the look
                    on_disk += p.stat().st_size
            assert on_disk <= cap + largest + 256 * 1024, (on_disk, index["stats"])  # (a frame is ~100 KB)
            polls += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                pusher.wait(timeout=0.5)  # the poll's pace: the loop ends as soon as the push does
        out, _ = pusher.communicate(timeout=30)
    finally:
        pusher.kill()
    assert pusher.returncode != 0 and "model_rejected" in out, out[-3000:]
    final = dev.last("shadow")
    assert final["state"] == "failed" and final["evidence"]["elapsed_s"] >= 60, final["evidence"]
    index = fetch_json(dev.port, "/labelling")
    stats, frames = index["stats"], index["frames"]
    print("labelling after a long shadow:", json.dumps(stats), f"{polls} polls")
    assert polls >= 60 and stats["offered"] >= 100 and stats["evicted"] >= 1, stats
    assert stats["bytes"] == sum(p.stat().st_size for p in images.iterdir()) <= cap
    assert {f["reason"] for f in frames} == {"shadow"}, frames  # the near-threshold frames gave way
    check_coco(fetch_json(dev.port, "/labelling/coco.json"))


@pytest.mark.slow
def test_a_scene_without_the_evidence_asked_for_ends_no_evidence_through_the_shipped_acl(
    cam01: Device, demo: DemoAssets, tmp_path: Path, signer: SigningKey
) -> None:
    """More detections asked for than the scene gives by max_s: no_evidence, never a pass, and not marked bad.
    (By default: tests/test_shadow_runner.py's dark scene, and test_shadow_rollout.py's real daemons.)"""
    dev = cam01
    few = ("--sample-fps", "4", "--min-frames", "4", "--min-detections", "100000", "--min-s", "1", "--max-s", "5")
    rc, out = dev.push(build(demo, tmp_path, signer, 2), "--shadow", *few)
    assert rc != 0 and "no_evidence" in out, out + dev.daemon.output()[-3000:]
    final = dev.last("shadow")
    REPORT.validate(final)
    assert final["state"] == "no_evidence" and final["candidate"]["version"] == 2, final
    assert final["reasons"] and "detections" in final["reasons"][0] and final["evidence"]["elapsed_s"] >= 5
    status = dev.last("ota/status")
    assert status["state"] == "rejected" and status["error"]["code"] == "no_evidence", status
    assert set(dev.versions()) == {1}
    assert verdicts(dev.port) == {"passed": 0, "failed": 0, "no_evidence": 1, "refused": 0}
    assert dev.daemon.stop() == 0
    view = store_view(tmp_path / "cam-01")
    assert view["current"] == 1 and 2 not in view["bad"] and 2 not in view["versions"], view
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
