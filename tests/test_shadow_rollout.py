"""Rollouts that promote on shadow evidence (issue 29 item 2): a wave's devices shadow the candidate; a shadow
failure (rejected on the figures, or no evidence) counts toward the wave's abort threshold; the rollout stops
before the next wave, names each failed device with its figures and keeps them in its state file.

Two fleets: twelve `WireDevice`s (tests/test_shadow_push.py: the device's half of the contract spoken with
edged.protocol's builders over a real mosquitto, told their figures) for the rollout's own logic at the size
the issue names, cheaply; and real daemons on the demo model, each evaluating the candidate on its own
camera, for the whole path: in the default set a first wave where one device fails on its figures (it serves a
version with a wrong `mean`, so the correct candidate disagrees with it) and one finds no evidence."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests.conftest import REPO, Broker, DaemonProc, Subscriber
from tests.fleet import PUSH_TIMEOUT_S, current, fleet, offers, push_cmd, wait_fleet_serving
from tests.test_ota import build
from tests.test_shadow_push import AGREES, DARK, DISAGREES, EVIDENCE, push_cli, wire  # noqa: F401  (fixture)


def test_a_rollout_to_twelve_devices_aborts_after_a_first_wave_that_fails_shadow(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    wire: Any,  # noqa: F811
) -> None:
    """Wave 1 (3 of 12 devices, --waves 25,100): cam-02 disagrees, cam-03 sees nothing; two failures over
    --max-failures 1: the nine devices of wave 2 are never offered the package, exit 3, the reason and the
    report name both devices with their figures, the state file keeps them."""
    scenes = {f"cam-{i:02}": AGREES for i in range(1, 13)}
    scenes["cam-02"], scenes["cam-03"] = DISAGREES, DARK
    devices = {dev: wire(dev, scene) for dev, scene in scenes.items()}
    v2 = build(demo, tmp_path, signer, 2)
    state = tmp_path / "rollout.json"
    r = push_cli(
        broker,
        str(v2),
        "--group",
        "dock",
        "--waves",
        "25,100",
        "--max-failures",
        "1",
        "--shadow",
        "--promote-if",
        "agreement>=0.9,recall>=0.95",
        *EVIDENCE,
        "--timeout",
        "60",
        "--state",
        str(state),
    )
    text = r.stderr
    assert r.returncode == 3, text
    assert "group 'dock': 12 online" in text, text
    offered = sorted(dev for dev, d in devices.items() if d.offers)
    assert offered == ["cam-01", "cam-02", "cam-03"], offered
    (abort,) = [line for line in text.splitlines() if "ABORTED after wave 1/2" in line]
    assert "2 failure(s)" in abort and "9 device(s) left untouched" in abort, abort
    assert "cam-02: shadow failed: 120 frames, 60/100 matched, agreement 0.194, recall 0.600" in abort, abort
    assert "(agreement 0.194 < 0.9; recall 0.600 < 0.95)" in abort, abort
    assert "cam-03: shadow no evidence: 120 frames, 0/0 matched" in abort, abort
    assert "promoted on shadow evidence: shadow passed: 120 frames, 99/100 matched" in text, text
    doc = json.loads(state.read_text())
    assert doc["status"] == "aborted" and doc["shadow"]["min_frames"] == 20, doc
    out = doc["outcomes"]
    assert out["cam-01"]["state"] == "committed" and out["cam-01"]["shadow"]["totals"]["matched"] == 99, out
    assert out["cam-02"]["state"] == "rejected" and out["cam-02"]["shadow"]["totals"]["candidate_detections"] == 310
    assert out["cam-03"]["state"] == "rejected" and out["cam-03"]["shadow"]["state"] == "no_evidence", out
    assert all(out[f"cam-{i:02}"]["state"] == "skipped" for i in range(4, 13)), out
    # the same command again does not resume an abort, and offers nothing
    again = push_cli(
        broker,
        str(v2),
        "--group",
        "dock",
        "--waves",
        "25,100",
        "--max-failures",
        "1",
        "--shadow",
        "--promote-if",
        "agreement>=0.9,recall>=0.95",
        *EVIDENCE,
        "--state",
        str(state),
    )
    assert again.returncode == 2 and "aborted" in again.stderr, again.stderr
    assert sum(len(d.offers) for d in devices.values()) == 3


def test_a_rollout_that_shadows_is_resumed_with_its_ask_and_refuses_other_flags(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    wire: Any,  # noqa: F811
) -> None:
    """The state file keeps the ask: the same command without --shadow (or with another ask) is told how to
    resume instead of mixing asks in one rollout; --resume offers what the file recorded."""
    from edged.deploy.rollout import new_rollout
    from edged.protocol.shadow import ShadowAsk

    devices = [wire(f"cam-{i:02}", AGREES) for i in (1, 2)]
    v2 = build(demo, tmp_path, signer, 2)
    state = tmp_path / "rollout.json"
    _, _, r = new_rollout(v2, None, ["cam-01", "cam-02"], [100.0], 0, "0", "swap")
    r.path, r.status, r.plan = state, "stopped", [["cam-01", "cam-02"]]
    r.shadow = ShadowAsk(promote_if={"agreement": 0.9}, min_frames=20, min_detections=10, min_s=0, max_s=30).doc()
    r.save()
    args = (str(v2), "--device", "cam-01", "--device", "cam-02", "--state", str(state))
    plain = push_cli(broker, *args)
    assert plain.returncode == 2 and "started with --shadow" in plain.stderr and "--resume" in plain.stderr
    other = push_cli(broker, *args, "--shadow", *EVIDENCE)  # the default thresholds: another ask
    assert other.returncode == 2 and "started with --shadow" in other.stderr, other.stderr
    assert not any(d.offers for d in devices)
    resumed = push_cli(broker, "--resume", str(state), "--timeout", "60")
    assert resumed.returncode == 0, resumed.stderr
    assert "2 of 2 device(s) succeeded" in resumed.stderr, resumed.stderr
    for d in devices:
        (offer,) = d.offers
        assert offer["shadow"] == r.shadow, offer
    doc = json.loads(state.read_text())
    assert doc["status"] == "done" and doc["outcomes"]["cam-02"]["shadow"]["totals"]["recall"] == 0.99, doc


# ---- real daemons --------------------------------------------------------------------------------------------


# the evidence a wave waits for: a few seconds of faces at 2 frames/s; an empty scene gives up at --max-s
REAL_EVIDENCE = ("--sample-fps", "2", "--min-frames", "6", "--min-detections", "5", "--min-s", "3")


def shadow_rollout_aborts(
    scenes: dict[str, str],
    waves: str,
    max_failures: int,
    broker: Broker,
    demo: DemoAssets,
    tmp: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
    max_s: int = 30,
) -> None:
    """v2 (the same model: it agrees wherever there are faces) rolled out with --shadow, a scene per device:
    ``video`` (the demo video), ``empty`` (no face) or ``wrong`` (the demo video, served by a v1 with a wrong
    `mean`). The first wave's ``empty`` devices end no_evidence and its ``wrong`` ones failed on their figures
    (model_rejected: the correct candidate disagrees with what serves), over `max_failures`: the rollout aborts
    before the next wave, names them with their figures; the ``video`` devices of the first wave were promoted
    (agreement >= 0.99)."""
    names = list(scenes)
    of = {kind: frozenset(d for d, s in scenes.items() if s == kind) for kind in ("empty", "wrong")}
    cfgs = fleet(broker, demo, tmp, signer, names, empty=of["empty"], wrong_mean=of["wrong"])
    sub = subscribe(broker, "edged/#")
    daemons = {dev: start_daemon(cfgs[dev]) for dev in names}
    wait_fleet_serving(list(daemons.values()))
    v2 = build(demo, tmp, signer, 2)
    state = tmp / "rollout.json"
    args = ["--group", "dock", "--waves", waves, "--max-failures", str(max_failures), "--shadow", *REAL_EVIDENCE]
    args += ["--max-s", str(max_s)]
    r = subprocess.run(
        push_cmd(broker, str(v2), *args, "--state", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=PUSH_TIMEOUT_S + 120,
    )
    text = r.stderr
    logs = "".join(f"\n--- {dev}\n{d.output()[-2000:]}" for dev, d in daemons.items())
    assert r.returncode == 3, text + logs
    doc = json.loads(state.read_text())
    first, rest = doc["plan"][0], [d for w in doc["plan"][1:] for d in w]
    empty = [d for d in first if scenes[d] == "empty"]
    wrong = [d for d in first if scenes[d] == "wrong"]
    video = [d for d in first if scenes[d] == "video"]
    assert len(empty) + len(wrong) > max_failures and video and rest, doc["plan"]
    assert [d for d in rest if scenes[d] != "video"] == [], doc["plan"]  # the failures are all in the first wave
    (abort,) = [line for line in text.splitlines() if "ABORTED after wave 1/" in line]
    assert f"{len(rest)} device(s) left untouched" in abort, abort
    out = doc["outcomes"]
    for dev in empty:  # named, with the figures it was judged on: frames seen, no face in them
        assert f"{dev}: shadow no evidence: " in abort, abort
        assert out[dev]["state"] == "rejected" and out[dev]["error"].startswith("no_evidence"), out[dev]
        shadow = out[dev]["shadow"]
        assert shadow["state"] == "no_evidence" and shadow["reasons"], shadow  # frames may be 0: a starved candidate
        assert shadow["totals"]["serving_detections"] == 0 and shadow["totals"]["candidate_detections"] == 0, shadow
        assert current(tmp, dev) == 1, dev  # never served
    for dev in wrong:  # named, with the figures it failed on: the faces v1 (wrong mean) sees, v2 does not
        shadow = out[dev]["shadow"]
        assert out[dev]["state"] == "rejected" and out[dev]["error"].startswith("model_rejected"), out[dev]
        assert shadow["state"] == "failed", shadow
        totals = shadow["totals"]
        assert totals["serving_detections"] >= 5 and totals["agreement"] < 0.5, shadow
        assert any(r.startswith("agreement 0.") and r.endswith(" < 0.95") for r in shadow["reasons"]), shadow
        assert f"{dev}: shadow failed: {totals['frames']} frames, {totals['matched']}/" in abort, abort
        assert f"agreement {totals['agreement']:.3f}" in abort, abort
        assert current(tmp, dev) == 1, dev  # never served
    for dev in video:  # promoted on its evidence, then probation and commit (the wave waits for commits)
        shadow = out[dev]["shadow"]
        assert out[dev]["state"] == "committed" and shadow["state"] == "passed", text
        assert shadow["totals"]["agreement"] >= 0.99 and shadow["totals"]["serving_detections"] >= 5, shadow
        assert current(tmp, dev) == 2, dev
    assert "promoted on shadow evidence" in text, text
    sent = offers(sub)
    assert sorted(sent) == sorted(first), sent  # the next wave was never offered the package
    for dev in rest:
        assert out[dev]["state"] == "skipped" and current(tmp, dev) == 1, out[dev]
    for d in daemons.values():
        assert d.stop() == 0
    print(f"\n{text}")  # the push's report, with -s: each device's verdict and figures


def test_a_rollout_to_real_daemons_stops_before_the_next_wave_when_shadow_fails_on_figures_or_finds_no_evidence(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    """Four daemons, the first wave three of them (--waves 75,100): cam-01 sees faces, cam-02 an empty scene,
    cam-03 faces served by a wrong-mean v1 (fails on agreement)."""
    scenes = {"cam-01": "video", "cam-02": "empty", "cam-03": "wrong", "cam-04": "video"}
    shadow_rollout_aborts(scenes, "75,100", 0, broker, demo, tmp_path, signer, start_daemon, subscribe)


@pytest.mark.slow
@pytest.mark.start_early(170)
@pytest.mark.timeout(1200)  # ten daemons starting on a 2-core machine
def test_a_rollout_to_ten_daemons_whose_first_wave_fails_shadow_aborts_before_the_second(
    broker: Broker,
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    start_daemon: Callable[..., DaemonProc],
    subscribe: Callable[..., Subscriber],
) -> None:
    """Ten daemons, the first wave three of them (--waves 30,100), two with an empty scene: over
    --max-failures 1."""
    scenes = {f"cam-{i:02}": "video" for i in range(1, 11)}
    scenes["cam-02"] = scenes["cam-03"] = "empty"
    # ten daemons on two cores: a candidate runs only between serving batches, so it gets its frames slowly
    shadow_rollout_aborts(scenes, "30,100", 1, broker, demo, tmp_path, signer, start_daemon, subscribe, max_s=90)
