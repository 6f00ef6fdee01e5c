"""A group's retained offer that carries `shadow` (`edged push --group … --shadow`), taken by a device that
joins the group late (issue 29 with the group offer of issue 20): it starts after the offer was published, or
its config gains the group after the push. The late device shadows the candidate as the rollout's devices do
(nothing of the candidate's output is a result; its report retained on …/shadow), then promotes it (the same
model) or rejects it with the figures (the demo model with a wrong `mean` in its manifest), or ends no_evidence
(a scene with no face), and never serves a rejected one; once it has judged the offer, a restart (the offer
still retained: the broker sends it again at every connect) does not take it again: no second evaluation, no
status (daemon/lifecycle/ota/group_offer.py). A device back while the pusher follows the group's offline
devices is reported with its figures, and the rollout's state file keeps them. An offer that finds another
transfer running waits for it rather than being dropped (in process, the receiver behind its seam).

Real mosquitto with the shipped edged.conf and edged.acl (TLS identities: the devices, the backend), real
daemons on the demo model, a real nginx as the mirror (`--mirror`: the group's offer outlives the pusher),
the real `edged push` as the operator runs it. Default set: the late start and promotion, the followed device,
the busy offer (~35 s on a quiet two-core machine); slow: the wrong mean, no evidence, a stop mid-shadow."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml

from edged.daemon.lifecycle.ota.group_offer import GroupOffers
from edged.errors import Code, CommandError
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from edged.protocol.ota import OfferArgs, group_offer_payload, offer_args
from edged.protocol.shadow import ShadowAsk
from tests.conftest import REPO, DaemonProc, edged_cli, wait_until, write_config
from tests.fleet import current, wrong_mean_build
from tests.test_mirror import Nginx, nginx_factory  # noqa: F401  (fixture: a real nginx)
from tests.test_ota import MODEL, build, device_doc, install, store_view
from tests.test_shadow_daemon import EVIDENCE, REPORT, STATUS
from tests.test_site import (  # noqa: F401  (fixtures: a real site)
    SiteBroker,
    acked,
    backend_config,
    connect,
    shipped,
    site,
    subscribed,
)

GROUP_OFFER = "edged/_groups/dock/ota"
ASK = ShadowAsk(sample_fps=4, min_frames=16, min_detections=8, min_s=4, max_s=120).doc()  # EVIDENCE's ask


@dataclass
class Site:
    """The shipped broker, the backend's client recording everything under edged/#, the devices' configs."""

    broker: SiteBroker
    pki: Path
    demo: DemoAssets
    tmp: Path
    seen: list[mqtt.MQTTMessage]
    ops: Path | None = None

    def docs(self, dev: str, suffix: str, since: int = 0) -> list[dict[str, Any]]:
        topic = f"edged/{dev}/{suffix}"
        return [json.loads(m.payload) for m in list(self.seen)[since:] if m.topic == topic and m.payload]

    def statuses(self, dev: str, transfer: str, since: int = 0) -> list[dict[str, Any]]:
        return [s for s in self.docs(dev, "ota/status", since) if s["transfer"] == transfer]

    def versions(self, dev: str, since: int = 0) -> list[int]:
        return [r["model"]["version"] for r in self.docs(dev, "results/lobby", since)]

    def offer(self) -> dict[str, Any]:
        """The group's offer the broker holds now (the last one published; {} when withdrawn)."""
        got = [m for m in list(self.seen) if m.topic == GROUP_OFFER]
        assert got, "no group offer was published"
        doc: dict[str, Any] = json.loads(got[-1].payload) if got[-1].payload else {}
        return doc

    def config(self, dev: str, groups: list[str]) -> Path:
        """`dev` on the demo video at 8 frames/s (evidence within seconds), a short probation, its identity."""
        doc = device_doc(self.broker, self.demo, self.tmp, dev, probation_s=3, probation_batches=10,
                         probation_latency_ratio=3)  # fmt: skip
        doc["groups"] = groups
        doc["cameras"][0]["fps_max"] = 8
        doc["detection"] = {"score_threshold": 0.5}
        doc["mqtt"]["tls"] = {"ca_file": str(self.pki / "ca.crt"), "cert_file": str(self.pki / f"{dev}.crt"),
                              "key_file": str(self.pki / f"{dev}.key")}  # fmt: skip
        cfg = write_config(self.tmp / f"{dev}.yaml", doc)
        if self.ops is None:
            self.ops = backend_config(self.broker, self.pki.parent, doc, self.tmp / "backend.yaml")
        return cfg

    def push_argv(self, tar: Path, *args: str) -> list[str]:
        """`edged push --group dock --shadow` with the backend's identity and EVIDENCE's ask."""
        assert self.ops is not None
        state = str(self.tmp / "rollout.json")
        return ["push", str(tar), "--group", "dock", "-c", str(self.ops), "--shadow", *EVIDENCE, "--state", state,
                *args]  # fmt: skip

    def push(self, tar: Path, www: Path, web: Nginx, *args: str) -> subprocess.CompletedProcess[str]:
        """The push with the files on the mirror (`www`, served by `web`): the group's offer outlives it."""
        return edged_cli(*self.push_argv(tar, "--mirror", str(www), "--mirror-url", web.url + "/", *args), timeout=400)

    def went_offline(self, connect_as: Callable[..., Any], dev: str) -> None:
        """What `dev`'s last will leaves on the broker (published with its own identity): offline, in group dock."""
        c, _ = connect_as(self.broker, dev)
        will = json.dumps({"state": "offline", "groups": ["dock"]}).encode()
        assert not acked(c, f"edged/{dev}/status", will, retain=True).is_failure
        c.disconnect()


@pytest.fixture
def late_site(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., Any],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
) -> Site:
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/#")
    return Site(shipped, site / "certs", demo, tmp_path, seen)


def serving(d: DaemonProc) -> DaemonProc:
    wait_until(lambda: "serving 1 camera(s)" in d.output() or d.proc.poll() is not None, 120, "the daemon to serve")
    assert d.proc.poll() is None, d.output()[-3000:]
    return d


def judged(s: Site, dev: str, transfer: str, d: DaemonProc, timeout: float = 240) -> dict[str, Any]:
    """The late device's final status for the group's transfer (probation or rejected), validated."""

    def final() -> bool:
        if d.proc.poll() is not None:
            raise AssertionError(f"{dev} exited:\n{d.output()[-3000:]}")
        return any(x["state"] in ("probation", "rejected", "failed") for x in s.statuses(dev, transfer))

    wait_until(final, timeout, f"{dev}'s verdict on transfer {transfer}\n" + d.output()[-3000:])
    for x in s.statuses(dev, transfer):
        STATUS.validate(x)
    last = s.statuses(dev, transfer)[-1]
    return last


def shadowed_without_results(s: Site, dev: str, transfer: str, serving_version: int) -> None:
    """Between the first `shadowing` status and the verdict every result of `dev` was the serving version's."""
    seen = list(s.seen)

    def state(m: mqtt.MQTTMessage) -> str:
        if m.topic != f"edged/{dev}/ota/status" or not m.payload:
            return ""
        doc = json.loads(m.payload)
        return str(doc["state"]) if doc["transfer"] == transfer else ""

    marks = [i for i, m in enumerate(seen) if state(m) in ("shadowing", "probation", "rejected")]
    shadowing = [i for i in marks if state(seen[i]) == "shadowing"]
    assert len(shadowing) >= 1, [state(seen[i]) for i in marks]
    during = [json.loads(m.payload)["model"]["version"] for m in seen[shadowing[0] : marks[-1]]
              if m.topic == f"edged/{dev}/results/lobby"]  # fmt: skip
    assert during and set(during) == {serving_version}, during


def restart_ignores_the_offer(
    s: Site, dev: str, cfg: Path, transfer: str, d: DaemonProc, start_daemon: Callable[..., DaemonProc], version: int
) -> DaemonProc:
    """Stop `dev` and start it again: the broker sends the retained group offer at its connect; taken before,
    it is ignored: no status of the transfer, no shadow report, and it serves `version`."""
    assert s.offer(), "the group's offer is still retained"
    assert d.stop() == 0, d.output()[-3000:]
    n = len(s.seen)
    again = serving(start_daemon(cfg))
    said = f"group dock's offer {transfer} was taken before; ignored"

    def handled() -> bool:  # ignored (said so), or taken again (a status of the transfer)
        return said in again.output() or bool(s.statuses(dev, transfer, n))

    wait_until(handled, 60, "the retained offer seen again\n" + again.output()[-3000:])
    wait_until(lambda: len(s.versions(dev, n)) >= 3, 60, f"{dev}'s results after the restart")
    assert [x["state"] for x in s.statuses(dev, transfer, n)] == [], "the offer was taken again"
    assert s.docs(dev, "shadow", n) == [], "evaluated again"
    assert said in again.output()
    assert set(s.versions(dev, n)) == {version}
    assert "taking group dock's offer" not in again.output()
    return again


def v2_on_cam01_cam02_gone(
    s: Site,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    connect_as: Callable[..., Any],
    cam02: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Path, Path, DaemonProc]:
    """Where each late-device test starts: cam-01 already serves v2 (the rollout finds it done, so the test's
    CPU goes to the late device) and runs; cam-02, on v1 (its config changed by `cam02` first), has gone
    offline, its last will retained. Returns v2's package, cam-02's config and cam-01's daemon."""
    v1, v2 = build(s.demo, s.tmp, signer, 1), build(s.demo, s.tmp, signer, 2)
    cfg1, cfg2 = s.config("cam-01", ["dock"]), s.config("cam-02", ["dock"])
    if cam02 is not None:
        doc = yaml.safe_load(cfg2.read_text())
        cam02(doc)
        write_config(cfg2, doc)
    install(cfg1, v2)
    install(cfg2, v1)
    s.went_offline(connect_as, "cam-02")
    return v2, cfg2, serving(start_daemon(cfg1))


def test_a_device_that_starts_after_a_shadow_rollout_shadows_the_groups_offer_and_promotes_it(
    late_site: Site,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    connect: Callable[..., Any],  # noqa: F811
    nginx_factory: Any,  # noqa: F811
) -> None:
    """`edged push --group dock --mirror --shadow` while cam-02 is offline (its last will retained): the pusher
    leaves it offline, the group's offer (with the ask) stays retained. cam-02 starts after the pusher exited,
    takes the offer (never a directed cmd/ota), downloads from nginx, shadows the candidate (the same model as
    v2) with every result meanwhile v1's, reports `passed` with agreement >= 0.99 on its retained …/shadow and
    serves v2. Restarted, it does not take the offer again. (cam-01, which the rollout reached before, already
    serves v2: the pusher finds it done, so the test's CPU goes to the late device.)"""
    s = late_site
    v2, cfg2, d1 = v2_on_cam01_cam02_gone(s, signer, start_daemon, connect)
    www = tmp_path / "www"
    web = nginx_factory(www)
    r = s.push(v2, www, web)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out + d1.output()[-3000:]  # cam-02 stayed offline
    assert "group 'dock': 1 online, 1 offline" in out and "1 of 2 device(s) succeeded" in out, out
    outcome = json.loads((tmp_path / "rollout.json").read_text())["outcomes"]["cam-02"]
    assert outcome["state"] == "offline" and "from the mirror when it is back" in outcome["error"], outcome
    offer = s.offer()
    assert offer["shadow"] == ASK and offer["urls"], offer  # the ask travels with the retained offer
    transfer = offer["transfer"]

    gets = len(web.requests())
    d2 = serving(start_daemon(cfg2))  # after the pusher left: only the retained offer reaches it
    final = judged(s, "cam-02", transfer, d2)
    assert final["state"] == "probation", (final, d2.output()[-4000:])
    assert (final.get("detail") or {}).get("shadow", {}).get("state") == "passed", final  # judged on a shadow
    assert "taking group dock's offer" in d2.output()
    assert not [m for m in list(s.seen) if m.topic == "edged/cam-02/cmd/ota"], "a directed offer to cam-02"
    assert [q for q in web.requests()[gets:] if q[1] == "GET" and q[0] in (200, 206)], "downloaded from the mirror"
    shadowed_without_results(s, "cam-02", transfer, 1)
    reports = s.docs("cam-02", "shadow")
    for doc in reports:
        REPORT.validate(doc)
    assert {doc["transfer"] for doc in reports} == {transfer}
    last = reports[-1]
    assert last["state"] == "passed" and last["candidate"] == {"name": MODEL, "version": 2}, last
    assert last["serving"] == {"name": MODEL, "version": 1}
    totals = last["totals"]
    print("late device passed:", json.dumps(totals))
    assert totals["frames"] >= 16 and totals["agreement"] >= 0.99 and totals["recall"] >= 0.99, totals
    late_reader, got = connect(s.broker, "backend")  # a subscriber that comes later reads the verdict
    subscribed(late_reader, "edged/cam-02/shadow")
    wait_until(lambda: bool(got), 10, "the retained report")
    assert got[0].retain and json.loads(got[0].payload)["state"] == "passed", got[0].payload
    wait_until(lambda: s.versions("cam-02")[-3:] == [2, 2, 2], 60, "results from the promoted version")

    def committed() -> bool:
        state = s.docs("cam-02", "model/state")
        return bool(state) and state[-1]["active"] == 2 and state[-1]["probation"] is None

    wait_until(committed, 60, "cam-02's probation to end")
    restart_ignores_the_offer(s, "cam-02", cfg2, transfer, d2, start_daemon, 2).stop()
    assert current(tmp_path, "cam-02") == 2 and d1.stop() == 0


@pytest.mark.slow
def test_a_device_whose_config_gains_the_group_rejects_a_wrong_mean_candidate_from_its_retained_offer(
    late_site: Site,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    nginx_factory: Any,  # noqa: F811
) -> None:
    """A rollout of a worse v2 (the demo model, its manifest's `mean` wrong) to group dock with --max-failures 1:
    cam-01 rejects it on its figures, within the threshold, so the group's offer stays. cam-02 served all along
    outside the group (never offered); its config gains the group and it restarts: it takes the retained offer,
    shadows v2 and rejects it (model_rejected) with the figures in its report, status and event, never serving
    v2 (marked bad, its files gone). Restarted again, it does not evaluate the offer again."""
    s = late_site
    v1, bad = build(demo, tmp_path, signer, 1), wrong_mean_build(demo, tmp_path, signer, 2)
    cfg1, cfg2 = s.config("cam-01", ["dock"]), s.config("cam-02", [])
    install(cfg1, v1)
    install(cfg2, v1)
    d1, d2 = serving(start_daemon(cfg1)), serving(start_daemon(cfg2))
    www = tmp_path / "www"
    web = nginx_factory(www)
    r = s.push(bad, www, web, "--max-failures", "1")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out + d1.output()[-3000:]
    assert "group 'dock': 1 online, 0 offline" in out and "FAIL cam-01" in out and "model_rejected" in out, out
    offer = s.offer()
    assert offer and offer["shadow"] == ASK, "within --max-failures: the group's offer stays"
    transfer = offer["transfer"]
    assert s.docs("cam-02", "ota/status") == [] and set(s.versions("cam-02")) == {1}  # outside the group

    assert d2.stop() == 0
    doc = yaml.safe_load(cfg2.read_text())
    doc["groups"] = ["dock"]  # the operator adds cam-02 to the group: it applies at the next start
    write_config(cfg2, doc)
    n = len(s.seen)
    d2 = serving(start_daemon(cfg2))
    final = judged(s, "cam-02", transfer, d2)
    assert final["state"] == "rejected" and final["error"]["code"] == "model_rejected", (final, d2.output()[-4000:])
    assert "taking group dock's offer" in d2.output()
    shadowed_without_results(s, "cam-02", transfer, 1)
    report = s.docs("cam-02", "shadow")[-1]
    REPORT.validate(report)
    assert report["state"] == "failed" and report["transfer"] == transfer, report
    assert report["candidate"] == {"name": MODEL, "version": 2} and report["reasons"], report
    totals = report["totals"]
    print("late device rejected:", json.dumps(totals))
    assert totals["serving_detections"] >= 4 and totals["candidate_detections"] >= 3 * totals["serving_detections"]
    assert totals["agreement"] < 0.2 and totals["recall"] < 0.2, totals
    assert any(re.match(r"agreement 0\.\d+ < 0\.95", x) for x in report["reasons"]), report["reasons"]
    assert final["detail"]["shadow"]["totals"]["agreement"] == totals["agreement"], final

    def rejected_events() -> list[dict[str, Any]]:
        return [e for e in s.docs("cam-02", "events", n) if e["type"] == "model_rejected"]

    # the event is spooled (a committed write, then paho); the status `judged` saw went straight out
    wait_until(lambda: bool(rejected_events()), 30, "cam-02's model_rejected event")
    rejected = rejected_events()
    assert rejected[-1]["shadow"]["candidate_detections"] == totals["candidate_detections"], rejected
    wait_until(lambda: len(s.versions("cam-02", n)) >= 10, 60, "results after the rejection")
    assert set(s.versions("cam-02", n)) == {1}, "the worse candidate served"

    d2 = restart_ignores_the_offer(s, "cam-02", cfg2, transfer, d2, start_daemon, 1)
    assert d2.stop() == 0 and d1.stop() == 0
    view = store_view(tmp_path / "cam-02")
    assert view["current"] == 1 and 2 in view["bad"] and 2 not in view["versions"], view


@pytest.mark.slow
def test_a_late_device_whose_scene_gives_no_evidence_is_not_evaluated_again_at_its_next_start(
    late_site: Site,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    connect: Callable[..., Any],  # noqa: F811
    nginx_factory: Any,  # noqa: F811
) -> None:
    """cam-02 comes back after the mirrored rollout with a camera that shows no face: its shadow of v2 ends
    `no_evidence` (rejected, not marked bad, so nothing but the record of the offer taken stops a second
    evaluation), and it keeps serving v1. Restarted, the retained offer is ignored: no second evaluation."""
    s = late_site

    def no_face(doc: dict[str, Any]) -> None:
        doc["cameras"][0].pop("loop", None)
        doc["cameras"][0]["uri"] = "synthetic://?width=640&height=360"  # a test pattern: no face

    v2, cfg2, d1 = v2_on_cam01_cam02_gone(s, signer, start_daemon, connect, no_face)
    www = tmp_path / "www"
    web = nginx_factory(www)
    r = s.push(v2, www, web, "--min-s", "1", "--max-s", "6")
    assert r.returncode == 1 and "1 of 2 device(s) succeeded" in r.stderr, r.stdout + r.stderr
    transfer = s.offer()["transfer"]
    d2 = serving(start_daemon(cfg2))
    final = judged(s, "cam-02", transfer, d2)
    assert final["state"] == "rejected" and final["error"]["code"] == "no_evidence", (final, d2.output()[-4000:])
    report = s.docs("cam-02", "shadow")[-1]
    REPORT.validate(report)
    assert report["state"] == "no_evidence" and report["evidence"]["elapsed_s"] >= 6, report
    assert set(s.versions("cam-02")) == {1}
    d2 = restart_ignores_the_offer(s, "cam-02", cfg2, transfer, d2, start_daemon, 1)
    assert d2.stop() == 0 and d1.stop() == 0
    view = store_view(tmp_path / "cam-02")
    assert view["current"] == 1 and 2 not in view["bad"] and 2 not in view["versions"], view


@pytest.mark.slow
def test_a_late_device_stopped_while_it_shadows_the_groups_offer_evaluates_it_again_from_nothing_once(
    late_site: Site,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    connect: Callable[..., Any],  # noqa: F811
    nginx_factory: Any,  # noqa: F811
) -> None:
    """SIGTERM while the late device shadows the group's candidate: no verdict yet, so nothing is judged. At the
    next start the transfer resumes and the evaluation starts from nothing (a later `started`) and passes; the
    retained offer, seen again at that connect, is the running transfer's: ignored, not taken a second time."""
    s = late_site
    v2, cfg2, d1 = v2_on_cam01_cam02_gone(s, signer, start_daemon, connect)
    www = tmp_path / "www"
    web = nginx_factory(www)
    r = s.push(v2, www, web, "--min-s", "20")  # time enough to stop it in the middle
    assert r.returncode == 1 and "1 of 2 device(s) succeeded" in r.stderr, r.stdout + r.stderr
    transfer = s.offer()["transfer"]
    d2 = serving(start_daemon(cfg2))
    wait_until(lambda: any(x["state"] == "shadowing" for x in s.statuses("cam-02", transfer)), 120, "shadowing")
    first = s.docs("cam-02", "shadow")[-1]["started"]
    assert d2.stop() == 0, d2.output()[-3000:]
    assert current(tmp_path, "cam-02") == 1 and any((tmp_path / "cam-02" / "ota").iterdir()), "the candidate kept"
    n = len(s.seen)
    again = serving(start_daemon(cfg2))
    final = judged(s, "cam-02", transfer, again)
    assert final["state"] == "probation", (final, again.output()[-4000:])
    reports = s.docs("cam-02", "shadow", n)
    assert reports[-1]["state"] == "passed" and reports[-1]["started"] > first, reports[-1]
    assert f"group dock's offer {transfer} was taken before; ignored" in again.output()
    assert "taking group dock's offer" not in again.output()
    wait_until(lambda: s.versions("cam-02")[-3:] == [2, 2, 2], 60, "results from the promoted version")
    assert again.stop() == 0 and d1.stop() == 0


def test_the_pusher_follows_a_device_back_during_the_rollout_through_its_shadow_and_records_its_figures(
    late_site: Site,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    connect: Callable[..., Any],  # noqa: F811
) -> None:
    """Without a mirror the pusher serves the group's offer itself while it follows the group's offline devices
    (--wait-offline). cam-02 comes back during that wait: it takes the retained offer, is served its chunks over
    MQTT, shadows v2 and is promoted; the push names cam-02 promoted with its figures, and the rollout's state
    file keeps cam-02's report as it does for a device it offered to. The offer is withdrawn at the end."""
    s = late_site
    v2, cfg2, d1 = v2_on_cam01_cam02_gone(s, signer, start_daemon, connect)
    argv = [sys.executable, "-m", "edged", *s.push_argv(v2, "--wait-offline", "200", "-v")]
    pusher = subprocess.Popen(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:

        def published() -> bool:
            return any(m.topic == GROUP_OFFER and m.payload for m in list(s.seen)) or pusher.poll() is not None

        wait_until(published, 120, "the group's offer")
        assert pusher.poll() is None, pusher.communicate()[0]
        transfer = s.offer()["transfer"]
        d2 = serving(start_daemon(cfg2))
        out, _ = pusher.communicate(timeout=400)
    finally:
        pusher.kill()
    assert pusher.returncode == 0, out + d2.output()[-3000:]
    assert "group 'dock': 1 online, 1 offline" in out and "2 of 2 device(s) succeeded" in out, out
    assert "taking group dock's offer" in d2.output()
    assert not [m for m in list(s.seen) if m.topic == "edged/cam-02/cmd/ota"], "a directed offer to cam-02"
    shadowed_without_results(s, "cam-02", transfer, 1)
    report = s.docs("cam-02", "shadow")[-1]
    REPORT.validate(report)
    assert report["state"] == "passed" and report["transfer"] == transfer, report
    totals = report["totals"]
    assert totals["agreement"] >= 0.99, totals
    lines = out.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.strip().startswith("ok   cam-02")]
    matched = f"{totals['matched']}/{totals['serving_detections']} matched"
    said = f"shadow passed: {totals['frames']} frames, {matched}, agreement {totals['agreement']:.3f}"
    assert "promoted on shadow evidence: " + said in lines[i + 1], (said, lines[i : i + 2])
    outcome = json.loads((tmp_path / "rollout.json").read_text())["outcomes"]["cam-02"]
    assert outcome["state"] == "probation", outcome
    assert outcome.get("shadow", {}).get("state") == "passed", outcome  # its figures, as a wave's device's
    assert outcome["shadow"]["totals"]["agreement"] == totals["agreement"], outcome
    wait_until(lambda: s.offer() == {}, 10, "the group's offer withdrawn when the pusher left")
    assert d2.stop() == 0 and d1.stop() == 0


class Receiver:
    """The OTA receiver's side GroupOffers speaks to (its `Offerable` seam): busy while `busy` is set (another
    transfer runs: `OtaReceiver.offer` raises busy before it checks anything), else it accepts."""

    def __init__(self) -> None:
        self.busy = threading.Event()
        self.busy.set()
        self.lock = threading.Lock()
        self.offered: list[str] = []

    def offer(self, args: OfferArgs) -> dict[str, object]:
        with self.lock:
            self.offered.append(args.transfer)
        if self.busy.is_set():
            raise CommandError(Code.BUSY, "a transfer of blazeface-back@7 runs")
        return {"state": "accepted"}

    def unfinished(self, args: OfferArgs) -> bool:
        return False

    def count(self, transfer: str) -> int:
        with self.lock:
            return self.offered.count(transfer)


def group_message(group: str, transfer: str | None) -> mqtt.MQTTMessage:
    """A group's retained offer as paho hands it over (`transfer` None: the offer withdrawn)."""
    msg = mqtt.MQTTMessage(topic=f"edged/_groups/{group}/ota".encode())
    ask = ShadowAsk(min_frames=16)
    args = offer_args(transfer, b'{"name": "blazeface-back"}', b"sig", shadow=ask) if transfer else None
    msg.payload = group_offer_payload(group, args) if args is not None else b""
    return msg


def test_a_group_offer_that_finds_another_transfer_running_waits_for_it_instead_of_being_dropped(
    tmp_path: Path,
) -> None:
    """A device joining late may be busy with a transfer a previous run left (resumed at its start) when its
    group's offer arrives. The offer is not kept as taken (it was never checked): offered again until the
    receiver takes it, then taken once; an offer withdrawn meanwhile (an empty retained message) is not
    offered again."""
    receiver, stop = Receiver(), threading.Event()
    offers = GroupOffers(receiver, tmp_path, stop, retry_busy_s=0.05)
    offers.start()
    seen = tmp_path / "ota-groups.json"

    def taken() -> list[str]:
        return json.loads(seen.read_text()) if seen.exists() else []

    try:
        offers.on_message(group_message("dock", "rollout-a"))
        wait_until(lambda: receiver.count("rollout-a") >= 3, 10, "the busy offer offered again")
        assert "rollout-a" not in taken()  # not taken while the receiver was busy
        receiver.busy.clear()  # the other transfer ended
        wait_until(lambda: "rollout-a" in taken(), 10, "the offer taken once the receiver is free")
        n = receiver.count("rollout-a")
        offers.on_message(group_message("dock", "rollout-a"))  # seen again (a reconnect): taken before
        offers.on_message(group_message("yard", "rollout-b"))  # handled after it (one thread, in order)
        wait_until(lambda: receiver.count("rollout-b") == 1, 10, "the next offer")
        assert receiver.count("rollout-a") == n

        receiver.busy.set()
        offers.on_message(group_message("gate", "rollout-c"))
        wait_until(lambda: receiver.count("rollout-c") >= 2, 10, "the busy offer offered again")
        offers.on_message(group_message("gate", None))  # withdrawn by its pusher
        offers.on_message(group_message("dock", "rollout-d"))  # busy too: offered again from now on
        wait_until(lambda: receiver.count("rollout-d") >= 1, 10, "the next offer")
        c = receiver.count("rollout-c")
        wait_until(lambda: receiver.count("rollout-d") >= 4, 10, "rounds of offers again")
        assert receiver.count("rollout-c") == c, "a withdrawn offer offered again"
        assert "rollout-c" not in taken() and "rollout-d" not in taken()
    finally:
        stop.set()
