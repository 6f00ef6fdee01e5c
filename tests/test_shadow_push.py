"""`edged push --shadow` (issue 29 items 1-2, the operator side): the flags made into the offer's ask and
checked on values, the ask on the wire, and the pusher following each device's shadow report to its verdict:
promoted, or rejected with the figures and a non-zero exit.

The devices here are `WireDevice`s: the device's half of the OTA and shadow contract spoken with
edged.protocol's own builders (status, reply, an ``edged.shadow/1`` report validated against the shipped
schema) over a real mosquitto, told the figures they report; they evaluate nothing. What they stand in for,
the daemon's own evaluation, is tested with real daemons in tests/test_shadow_rollout.py. The pusher under
test is the real `edged push` command."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edged.cli.push import DEFAULTS_TEXT
from edged.deploy.promote import ShadowView, defaults_text, figures_text, shadow_ask
from edged.errors import Code, EdgedError
from edged.models.demo import DemoAssets
from edged.models.package import Manifest
from edged.models.signing import SigningKey
from edged.protocol import topics
from edged.protocol.commands import reply_doc
from edged.protocol.ota import ModelRef, OfferArgs, OtaState, status_doc
from edged.protocol.schemas import SHADOW_SCHEMA, schema
from edged.protocol.shadow import DEFAULT_PROMOTE_IF, ShadowAsk, judgement, report_doc
from tests.conftest import REPO, Broker, free_port
from tests.test_ota import build

SERVING = ("blazeface-back", 1)


def figures(frames: int, serving: int, candidate: int, matched: int, latency_ratio: float = 1.1) -> dict[str, Any]:
    """A report's figures, computed from counts as the daemon defines them (protocol/shadow.py's docstring)."""
    return {
        "frames": frames,
        "serving_detections": serving,
        "candidate_detections": candidate,
        "matched": matched,
        "agreement": matched / max(serving, candidate) if max(serving, candidate) else 1.0,
        "recall": matched / serving if serving else None,
        "precision": matched / candidate if candidate else None,
        "score_shift": 0.01,
        "label_confusion": {},
        "serving_ms": 10.0,
        "candidate_ms": 10.0 * latency_ratio,
        "latency_ratio": latency_ratio,
    }


@dataclass
class WireDevice:
    """One device of group `group`: online, serving SERVING; an offer with `shadow` runs a scripted evaluation
    that reports `scene`'s figures in three steps and ends as the ask's thresholds say (or no_evidence when the
    scene's detections are under the ask's minimum). Without `shadow` it swaps at once."""

    broker: Broker
    device: str
    scene: dict[str, Any]  # the totals it reports at the end (`figures`)
    group: str = "dock"
    offers: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    step_s: float = 0.3

    def __post_init__(self) -> None:
        self.root = topics.device_root("edged", self.device)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"wire-{self.device}-{free_port()}", protocol=mqtt.MQTTv5
        )
        self.client.on_message = self._on_message
        self.ready = threading.Event()
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.connect(self.broker.host, self.broker.port)
        self.client.loop_start()
        self.client.subscribe(topics.command(self.root, "ota"), qos=1)
        if not self.ready.wait(10):
            raise AssertionError(f"{self.device}: no SUBACK")
        status = {"state": "online", "groups": [self.group], "model": f"{SERVING[0]}@{SERVING[1]}"}
        self._publish(topics.status(self.root), status, retain=True)
        self._model_state(SERVING[1], probation=None)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _publish(self, topic: str, doc: dict[str, Any], retain: bool = False) -> None:
        self.client.publish(topic, json.dumps(doc).encode(), qos=1, retain=retain)

    def _model_state(self, version: int, probation: dict[str, Any] | None) -> None:
        doc = {"name": SERVING[0], "active": version, "probation": probation, "bad": []}
        self._publish(topics.model_state(self.root), doc, retain=True)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        doc = json.loads(msg.payload)
        self.offers.append(doc)
        args = OfferArgs.model_validate(doc)
        manifest = Manifest.model_validate_json(args.decode()[0])
        reply_to = msg.properties.ResponseTopic  # type: ignore[union-attr]
        self._publish(reply_to, reply_doc("ota", {"state": OtaState.ACCEPTED}))
        threading.Thread(target=self._run, args=(args, manifest.version), daemon=True).start()

    def _status(self, transfer: str, state: OtaState, **kw: Any) -> None:
        self._publish(topics.ota_status(self.root), status_doc(transfer, state, **kw), retain=True)

    def _run(self, args: OfferArgs, version: int) -> None:
        ref = ModelRef(SERVING[0], version)
        self._status(args.transfer, OtaState.INSTALLING, model=ref)
        ask: ShadowAsk | None = args.shadow
        if ask is not None:
            final = self.scene
            started = time.time()
            state = "running"
            for share in (0.25, 0.5, 1.0):
                totals = {k: (round(v * share) if isinstance(v, int) else v) for k, v in final.items()}
                detections = max(totals["serving_detections"], totals["candidate_detections"])
                evidence = {
                    "frames": totals["frames"],
                    "detections": detections,
                    "elapsed_s": time.time() - started,
                    "min_frames": ask.min_frames,
                    "min_detections": ask.min_detections,
                    "min_s": ask.min_s,
                    "max_s": ask.max_s,
                    "skipped": 0,
                }
                reasons: list[str] = []
                if share == 1.0:
                    if detections < ask.min_detections or totals["frames"] < ask.min_frames:
                        state = "no_evidence"
                        reasons = [f"{detections} detection(s) of {ask.min_detections} needed by max_s"]
                    else:
                        state, reasons = judgement(totals, ask.promote_if)
                doc = report_doc(
                    device=self.device,
                    transfer=args.transfer,
                    state=state,
                    serving=SERVING,
                    candidate=(SERVING[0], version),
                    started=started,
                    totals=totals,
                    per_camera={"lobby": totals},
                    memory_mb={"serving": 10.0, "candidate": 10.0, "budget": 100.0},
                    ask=ask,
                    evidence=evidence,
                    reasons=reasons,
                )
                jsonschema.validate(doc, schema(SHADOW_SCHEMA))  # what the daemon publishes, checked the same way
                self.reports.append(doc)
                if share == 1.0 and state != "passed":  # the final report is published before the verdict
                    self._publish(topics.shadow(self.root), doc, retain=True)
                    code = Code.NO_EVIDENCE if state == "no_evidence" else Code.MODEL_REJECTED
                    err = EdgedError("; ".join(reasons), code=code)
                    self._status(args.transfer, OtaState.REJECTED, model=ref, error=err)
                    return
                self._publish(topics.shadow(self.root), doc, retain=True)
                self._status(args.transfer, OtaState.SHADOWING, model=ref, detail={"shadow": totals})
                time.sleep(self.step_s)
        self._status(args.transfer, OtaState.PROBATION, model=ref)
        self._model_state(version, probation={"since": time.time()})
        time.sleep(self.step_s)
        self._model_state(version, probation=None)  # committed


@pytest.fixture
def wire(broker: Broker) -> Iterator[Any]:
    """`make(device, scene)`: a WireDevice on the test's broker, closed after the test."""
    made: list[WireDevice] = []

    def make(device: str, scene: dict[str, Any], **kw: Any) -> WireDevice:
        made.append(WireDevice(broker, device, scene, **kw))
        return made[-1]

    yield make
    for d in made:
        d.close()


def push_cli(broker: Broker, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "edged", "push", *args, "--host", broker.host, "--port", str(broker.port)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


AGREES = figures(frames=120, serving=100, candidate=101, matched=99, latency_ratio=1.05)
DISAGREES = figures(frames=120, serving=100, candidate=310, matched=60, latency_ratio=1.3)  # 3x the false faces
DARK = figures(frames=120, serving=0, candidate=0, matched=0)  # nothing to judge on
EVIDENCE = ("--min-frames", "20", "--min-detections", "10", "--min-s", "0", "--max-s", "30")


def test_the_flags_make_the_ask_on_values() -> None:
    ask = shadow_ask(2.5, "agreement>=0.9, recall>=0.98,latency<=1.2", 7, 3, 1.5, 60)
    assert ask.doc() == {
        "sample_fps": 2.5,
        "promote_if": {"agreement": 0.9, "recall": 0.98, "latency": 1.2},
        "min_frames": 7,
        "min_detections": 3,
        "min_s": 1.5,
        "max_s": 60.0,
    }
    assert shadow_ask() == ShadowAsk() and shadow_ask().promote_if == DEFAULT_PROMOTE_IF
    assert shadow_ask(min_frames=5).doc() == {**ShadowAsk().doc(), "min_frames": 5}
    assert defaults_text() == DEFAULTS_TEXT  # --help's defaults are the ask's
    bad_terms = {
        "agreement>=0.95,recal>=0.98": "'recal'",
        "latency>=1.2": "latency>=",
        "agreement>=1.5": "agreement>=1.5",
        "agreement>=0.9,agreement>=0.8": "twice",
        "agreement=0.9": "'agreement=0.9'",
    }
    for text, named in bad_terms.items():
        with pytest.raises(ValueError, match=named.replace("(", r"\(")):
            shadow_ask(promote_if=text)
    with pytest.raises(ValueError, match="--sample-fps 0"):
        shadow_ask(sample_fps=0)
    with pytest.raises(ValueError, match="--min-frames 0"):
        shadow_ask(min_frames=0)
    with pytest.raises(ValueError, match="--min-s 30 is over --max-s 10"):
        shadow_ask(min_s=30, max_s=10)
    with pytest.raises(ValueError, match=r"^--min-detections 0: 0 is under 1: a verdict needs detections"):
        shadow_ask(min_detections=0)  # a dark scene would pass on agreement 1.0, or be rejected on no figure


def test_a_bad_promote_if_is_a_usage_error_that_names_the_term(tmp_path: Path) -> None:
    tar = str(tmp_path / "none.tar")  # never read: the flags are refused first
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "edged",
            "push",
            tar,
            "--device",
            "d1",
            "--shadow",
            "--promote-if",
            "agreement>=0.95,recal>=0.98",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and "'recal'" in r.stderr and "agreement" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "edged", "push", tar, "--device", "d1", "--min-frames", "5"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and "--min-frames needs --shadow" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "edged", "push", tar, "--device", "d1", "--shadow", "--min-detections", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and "--min-detections 0: 0 is under 1" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "edged", "push", "--resume", str(tmp_path / "r.json"), "--shadow"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and "--resume takes the shadow ask the rollout recorded" in r.stderr, r.stderr


def test_a_shadow_push_promotes_the_agreeing_device_and_rejects_the_others_with_their_figures(
    broker: Broker, demo: DemoAssets, tmp_path: Path, signer: SigningKey, wire: Any
) -> None:
    good, bad, dark = wire("cam-01", AGREES), wire("cam-02", DISAGREES), wire("cam-03", DARK)
    v2 = build(demo, tmp_path, signer, 2)
    state = tmp_path / "rollout.json"
    ids = [a for d in ("cam-01", "cam-02", "cam-03") for a in ("--device", d)]
    r = push_cli(
        broker,
        str(v2),
        *ids,
        "--shadow",
        "--promote-if",
        "agreement>=0.9,recall>=0.95",
        *EVIDENCE,
        "--timeout",
        "60",
        "--state",
        str(state),
        "-v",
    )
    assert r.returncode == 1, r.stderr
    text = r.stderr
    # each device's offer carried the ask, to the value
    for d in (good, bad, dark):
        (offer,) = d.offers
        assert offer["shadow"] == {
            "sample_fps": 1.0,
            "promote_if": {"agreement": 0.9, "recall": 0.95},
            "min_frames": 20,
            "min_detections": 10,
            "min_s": 0.0,
            "max_s": 30.0,
        }
    assert "1 of 3 device(s) succeeded" in text, text
    lines = text.splitlines()

    def after(dev: str) -> str:  # a device's report line and the verdict line under it
        i = max(n for n, line in enumerate(lines) if line.strip().split()[1:2] == [dev])
        return lines[i] + "\n" + lines[i + 1]

    assert "ok   cam-01" in after("cam-01") and "promoted on shadow evidence" in after("cam-01"), text
    assert "agreement 0.980, recall 0.990, precision 0.980, latency x1.05" in after("cam-01"), text
    # 60 of 100 serving faces matched, 310 candidate faces: agreement 60/310, recall 0.6, precision 60/310
    assert "FAIL cam-02" in after("cam-02") and "model_rejected" in after("cam-02"), text
    assert "rejected on shadow evidence" in after("cam-02"), text
    assert "120 frames, 60/100 matched, agreement 0.194, recall 0.600, precision 0.194, latency x1.30" in after(
        "cam-02"
    ), text
    assert "agreement 0.194 < 0.9" in after("cam-02") and "recall 0.600 < 0.95" in after("cam-02"), text
    assert "FAIL cam-03" in after("cam-03") and "rejected: no evidence" in after("cam-03"), text
    assert "lobby" in text  # -v: each camera's figures
    doc = json.loads(state.read_text())
    assert doc["shadow"]["promote_if"] == {"agreement": 0.9, "recall": 0.95}
    out = doc["outcomes"]
    assert out["cam-01"]["state"] == "probation" and out["cam-01"]["shadow"]["state"] == "passed", out
    assert out["cam-02"]["state"] == "rejected" and out["cam-02"]["shadow"]["state"] == "failed", out
    assert out["cam-02"]["shadow"]["totals"]["agreement"] == pytest.approx(60 / 310)
    assert out["cam-02"]["shadow"]["per_camera"]["lobby"]["recall"] == pytest.approx(0.6)
    assert out["cam-03"]["shadow"]["state"] == "no_evidence" and out["cam-03"]["error"].startswith("no_evidence")


def test_a_report_in_words_on_values() -> None:
    """What the live line, the final report and `edged watch` show of an edged.shadow/1 report."""
    from edged.cli.watch import line_for

    ask = ShadowAsk(promote_if={"agreement": 0.9})
    totals = figures(frames=40, serving=20, candidate=25, matched=18, latency_ratio=0.9)
    doc = report_doc(
        device="cam-01",
        transfer="t1",
        state="running",
        serving=SERVING,
        candidate=(SERVING[0], 2),
        started=time.time(),
        totals=totals,
        per_camera={"gate": totals},
        ask=ask,
        memory_mb={"serving": 1.0, "candidate": 1.0, "budget": 10.0},
        reasons=[],
        evidence={
            "frames": 40,
            "detections": 25,
            "elapsed_s": 3.0,
            "min_frames": 100,
            "min_detections": 30,
            "min_s": 20.0,
            "max_s": 900.0,
            "skipped": 0,
        },
    )
    jsonschema.validate(doc, schema(SHADOW_SCHEMA))
    view = ShadowView()
    assert view.take_report(doc) and not view.failed
    want = "shadow running: 40 frames, 18/20 matched, agreement 0.720, recall 0.900, precision 0.720, latency x0.90"
    assert view.line() == want
    assert not view.take_report({**doc, "ts": doc["ts"] - 10, "state": "failed"})  # an older report is not taken
    assert view.summary()["totals"] == {k: totals[k] for k in view.summary()["totals"]}
    assert view.summary()["per_camera"]["gate"]["matched"] == 18
    assert figures_text({"frames": 3, "recall": None}) == "3 frames"  # a figure without a value is left out
    watch = line_for("edged/cam-01/shadow", doc)
    assert watch.startswith("shadow  blazeface-back@2 vs blazeface-back@1  shadow running: 40 frames"), watch
    assert "gate: 40 frames" in watch, watch


def test_the_fleet_table_shows_a_shadow_while_it_runs() -> None:
    from edged.deploy.fleet import Seen, render, rows

    totals = figures(frames=40, serving=20, candidate=25, matched=18)
    doc = {"state": "running", "candidate": {"name": "faces", "version": 4}, "totals": totals}
    seen = Seen(
        statuses={"a": {"state": "online"}, "b": {"state": "online"}, "c": {"state": "online"}},
        shadows={"a": doc, "b": {**doc, "state": "passed"}},
    )
    a, b, c = rows(seen)
    assert a.shadow == "faces@4 40 frames agreement 0.72"
    assert b.shadow is None and c.shadow is None  # a finished evaluation's verdict is the model state's
    assert "SHADOW" in render([a, b, c], "table").splitlines()[0]
