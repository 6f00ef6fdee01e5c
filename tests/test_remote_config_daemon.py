"""Remote configuration on running daemons, through the shipped broker config and ACL (issue 33): a group's
document (a zone over the whole frame, a threshold) applied live and seen in the next results and events;
refused ones (a gst:// URI, a path outside the state dir, a forged document) changing nothing; a camera URI
that does not answer reverted within the bound, with the reason, and results resuming; a device that was
down during a push taking the group's retained document when it comes back, and keeping it over a restart.
Real mosquitto (edged.conf, edged.acl, TLS identities), real daemons on the demo video, the real CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml

from edged.deploy.config_push import signed_payload
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import DaemonProc, base_config, edged_cli, free_port, wait_until, write_config
from tests.test_site import (  # noqa: F401
    SiteBroker,
    acked,
    backend_config,
    connect,
    shipped,
    site,
    subscribed,
)

ALL = {"name": "all", "normalized": True, "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


def device(b: SiteBroker, pki_dir: Path, demo: DemoAssets, tmp: Path, name: str) -> tuple[dict[str, Any], Path]:
    pki = pki_dir / "certs"
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": 8,
             "detection": {"publish": "both", "tracking": {"min_hits": 1}}}]  # fmt: skip
    doc = base_config(b, demo, tmp, cams, device_id=name, state_dir=str(tmp / name), groups=["dock"])
    doc["model"]["keys_dir"] = str(tmp / "trusted")
    doc["detection"] = {"score_threshold": 0.5}
    doc["mqtt"]["tls"] = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / f"{name}.crt"),
                          "key_file": str(pki / f"{name}.key")}  # fmt: skip
    doc["remote_config"] = {"ready_timeout_s": 12}
    return doc, write_config(tmp / f"{name}.yaml", doc)


def overlay_file(tmp: Path, name: str, overlay: dict[str, Any]) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(overlay))
    return p


def test_remote_config_through_the_shipped_acl(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., Any],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/#")
    doc, cfg = device(shipped, site, demo, tmp_path, "cam-01")
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    key = str(tmp_path / "signer" / f"{signer.key_id}.key")
    d = start_daemon(cfg)

    def on(suffix: str) -> list[mqtt.MQTTMessage]:
        return [m for m in list(seen) if m.topic == f"edged/cam-01/{suffix}"]

    def last_state() -> dict[str, Any]:
        states = on("config/state")
        return json.loads(states[-1].payload) if states else {}

    def push(*args: str) -> tuple[int, str]:
        r = edged_cli("config", "push", *args, "--signing-key", key, "-c", str(ops), "--timeout", "60", timeout=120)
        return r.returncode, r.stdout + r.stderr

    wait_until(lambda: len(on("results/lobby")) >= 3, 90, "results\n" + d.output())
    assert not any("zones" in det for m in on("results/lobby") for det in json.loads(m.payload)["detections"])

    # a valid change to the group: a zone over the whole frame, a threshold: applied live, seen in what follows
    zone = overlay_file(tmp_path, "zone", {"detection": {"score_threshold": 0.6},
                                           "cameras": {"lobby": {"detection": {"zones": [ALL]}}}})  # fmt: skip
    rc, out = push("--group", "dock", "--version", "10", str(zone))
    assert rc == 0 and "cam-01: applied" in out, out + d.output()[-3000:]
    n = len(on("results/lobby"))
    wait_until(lambda: len(on("results/lobby")) >= n + 5, 30, "results after the change")
    after = [det for m in on("results/lobby")[n:] for det in json.loads(m.payload)["detections"]]
    assert after and all(det["zones"] == ["all"] and det["score"] >= 0.6 for det in after), after[:3]
    wait_until(
        lambda: any(json.loads(m.payload).get("type") == "object_entered" and json.loads(m.payload).get("zone") == "all"
                    for m in on("events")), 30, "an object_entered event of the new zone")  # fmt: skip
    state = last_state()
    assert state["state"] == "applied" and state["source"] == "group:dock" and state["versions"] == {"group:dock": 10}
    wait_until(lambda: json.loads(on("status")[-1].payload).get("config", {}).get("versions") == {"group:dock": 10},
               10, "the applied version in the retained status")  # fmt: skip
    wait_until(lambda: json.loads(on("telemetry")[-1].payload).get("config", {}).get("versions") == {"group:dock": 10},
               10, "the applied version in telemetry")  # fmt: skip

    # refused: a gst:// pipeline, a file outside the state dir; nothing changes
    gst = overlay_file(tmp_path, "gst", {"cameras": {"lobby": {"uri": "gst://videotestsrc ! appsink"}}})
    rc, out = push("--device", "cam-01", "--version", "11", str(gst))
    assert rc == 1 and "cam-01: refused: cameras.lobby.uri: gst://" in out, out
    outside = overlay_file(tmp_path, "outside", {"cameras": {"lobby": {"uri": "file:///etc/hostname"}}})
    rc, out = push("--device", "cam-01", "--version", "12", str(outside))
    assert rc == 1 and "a file outside the state dir" in out, out
    # forged: the backend's identity may write the topic, but the document was altered after signing
    env = json.loads(signed_payload(signer, {"device": "cam-01"}, 13, {"detection": {"score_threshold": 0.9}}))
    env["document"] = env["document"].replace('"version": 13', '"version": 14')
    assert acked(backend, "edged/cam-01/config/desired", json.dumps(env).encode(), retain=True) == 0
    wait_until(lambda: "does not match" in " ".join(last_state().get("reasons", [])), 20, "the forged one refused")
    # a device may not write another's desired config (the ACL), nor a group's
    dev2, _ = connect(shipped, "cam-02")
    assert acked(dev2, "edged/cam-01/config/desired", b"{}") != 0
    assert acked(dev2, "edged/_groups/dock/config", b"{}") != 0

    # unready: a camera URI that does not answer: reverted within the bound, with the reason; results resume
    dead = overlay_file(tmp_path, "dead", {"cameras": {"lobby": {"uri": f"rtsp://127.0.0.1:{free_port()}/none"}}})
    rc, out = push("--device", "cam-01", "--version", "15", str(dead))
    assert rc == 1 and "cam-01: reverted: not ready: camera lobby: down" in out, out + d.output()[-3000:]
    n = len(on("results/lobby"))
    wait_until(lambda: len(on("results/lobby")) >= n + 3, 40, "results again after the revert")
    assert last_state()["versions"] == {"group:dock": 10}

    # down during a push: the group's retained document is taken when the device comes back, and kept
    assert d.stop() == 0
    more = overlay_file(tmp_path, "more", {"cameras": {"lobby": {"fps_max": 5, "detection": {"zones": [
        {**ALL, "name": "whole"}]}}}})  # fmt: skip
    rc, out = push("--group", "dock", "--version", "20", str(more))
    assert rc == 0 and "0 online, 1 offline" in out and "cam-01: offline: takes" in out, out
    seen.clear()
    d = start_daemon(cfg)
    wait_until(lambda: last_state().get("versions") == {"group:dock": 20}, 90, "v20 on return\n" + d.output())
    n = len(on("results/lobby"))

    def dets() -> list[dict[str, Any]]:
        return [det for m in on("results/lobby")[n:] for det in json.loads(m.payload)["detections"]]

    wait_until(lambda: len(dets()) >= 3, 30, "detections with v20")
    assert all(det["zones"] == ["whole"] for det in dets()), dets()[:3]
    shown = json.loads(edged_cli("config", "show", "-c", str(cfg)).stdout)
    assert shown["documents"]["group:dock"]["version"] == 20
    assert d.stop() == 0


@pytest.mark.slow
def test_a_group_of_three_applies_one_document(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., Any],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """Three running daemons of a group take one document, each seen in its next results and events; one
    down during the next push takes it when it comes back (the site's PKI gets cam-03 here)."""
    assert edged_cli("certs", "device", "cam-03", "--dir", str(site / "certs")).returncode == 0
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/#")
    names = ["cam-01", "cam-02", "cam-03"]
    cfgs = {n: device(shipped, site, demo, tmp_path, n) for n in names}
    daemons = {n: start_daemon(c) for n, (_, c) in cfgs.items()}
    ops = backend_config(shipped, site, cfgs["cam-01"][0], tmp_path / "backend.yaml")
    key = str(tmp_path / "signer" / f"{signer.key_id}.key")

    def messages(dev: str, suffix: str, since: int = 0) -> list[dict[str, Any]]:
        return [json.loads(m.payload) for m in list(seen)[since:] if m.topic == f"edged/{dev}/{suffix}"]

    def zoned(dev: str, zone: str, since: int) -> bool:
        dets = [det for r in messages(dev, "results/lobby", since) for det in r["detections"]]
        return len(dets) >= 3 and all(det.get("zones") == [zone] for det in dets[-3:])

    def push(version: int, zone: str) -> str:
        f = overlay_file(tmp_path, zone, {"cameras": {"lobby": {"detection": {"zones": [{**ALL, "name": zone}]}}}})
        r = edged_cli("config", "push", "--group", "dock", "--version", str(version), "--signing-key", key,
                      "-c", str(ops), "--timeout", "90", str(f), timeout=150)  # fmt: skip
        return r.stdout + r.stderr

    for n in names:
        wait_until(partial(lambda d: bool(messages(d, "results/lobby")), n), 180, f"{n} results")
    mark = len(list(seen))
    out = push(3, "all")
    assert all(f"{n}: applied" in out for n in names), out
    for n in names:
        wait_until(partial(zoned, n, "all", mark), 60, f"{n}: results in the new zone")
        wait_until(
            partial(lambda d: any(e.get("zone") == "all" for e in messages(d, "events", mark)), n), 60, f"{n}: events"
        )
    assert daemons["cam-03"].stop() == 0
    out = push(4, "whole")
    assert "cam-01: applied" in out and "cam-02: applied" in out and "cam-03: offline" in out, out
    mark = len(list(seen))
    daemons["cam-03"] = start_daemon(cfgs["cam-03"][1])
    wait_until(partial(zoned, "cam-03", "whole", mark), 120, "cam-03 takes v4 when it returns")
    for d in daemons.values():
        assert d.stop() == 0
