"""Probation looks at what a new version outputs: a version that suddenly detects nothing (or everything)
on the same cameras is rolled back, with the figures in the event."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edged.daemon.inference import OutputFigures
from edged.daemon.lifecycle.manager import output_verdict
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey

from .conftest import Broker, wait_until, write_config
from .test_ota import MODEL, build, device_doc, install, push, wait_results


def test_output_verdict() -> None:
    faces = OutputFigures(rows=300, detections=310, score_sum=280.0)
    assert output_verdict(faces, OutputFigures(300, 290, 250.0), 10, 200) == ""
    assert output_verdict(faces, OutputFigures(100, 0, 0.0), 10, 200) == ""  # not enough frames yet
    collapse = output_verdict(faces, OutputFigures(300, 6, 3.3), 10, 200)
    assert collapse == (
        "output collapse: 0.02 detections per frame, mean score 0.55 over 300 frames vs 1.03 detections per "
        "frame, mean score 0.90 over 300 frames before (under 1/10)"
    )
    assert output_verdict(faces, OutputFigures(300, 3300, 1700.0), 10, 200).startswith("output explosion: 11.00")
    quiet = OutputFigures(300, 3, 2.0)  # a camera that rarely sees anything: 0.01 per frame counts as 0.1
    assert output_verdict(quiet, OutputFigures(300, 60, 40.0), 10, 200) == ""
    assert output_verdict(quiet, OutputFigures(300, 310, 200.0), 10, 200).startswith("output explosion")
    # a swap at night: the old version's last frames saw 19 faces, the new one none: nothing to judge by
    night = OutputFigures(300, 19, 17.0)
    assert output_verdict(night, OutputFigures(300, 0, 0.0), 10, 200) == ""
    assert output_verdict(OutputFigures(300, 20, 18.0), OutputFigures(300, 0, 0.0), 10, 200).startswith(
        "output collapse"
    )


def test_the_baseline_is_the_old_versions_newest_frames() -> None:
    """A week of busy daytime frames, then an empty night: the baseline for a swap now is the night."""
    from edged.daemon.inference import ActiveModel

    m = ActiveModel(backend=None, decoder=None, name="faces", version=1)  # type: ignore[arg-type]
    m.recent.extend([(2, 1.8)] * 4000 + [(0, 0.0)] * 300)
    assert m.recent_output(200) == OutputFigures(200, 0, 0.0)
    assert m.recent_output(400).detections == 200


def blind(src: Path, out: Path, shift: float = -40.0) -> Path:
    """The same BlazeFace with every score logit lowered by `shift`: it loads, runs as fast, and sees no face."""
    m = onnx.load(str(src))
    g = m.graph
    for name in ("Identity:0", "Identity_1:0"):
        producer = next(n for n in g.node if name in n.output)
        producer.output[list(producer.output).index(name)] = f"{name}__raw"
        g.initializer.append(numpy_helper.from_array(np.array(shift, np.float32), f"{name}__shift"))
        g.node.append(helper.make_node("Add", [f"{name}__raw", f"{name}__shift"], [name]))
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


def test_a_version_that_detects_nothing_is_rolled_back_with_the_figures(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    # 150 frames at the camera's 10 fps: most of the looping demo video, so the old version's window holds
    # well over the 20 detections a collapse is judged against (0.39 per frame on this video)
    doc["model"].update(probation_output_frames=150, probation_latency_ratio=0)
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_results(sub, 1, n=160, timeout=120)  # the old version's figures: 150 frames at least
    v2 = build(demo, tmp_path, signer, 2, model=blind(demo.packages[MODEL].model_path, tmp_path / "blind.onnx"))
    r = push(broker, v2, "--device", "cam-01")
    assert r.returncode == 0, r.stdout + r.stderr + d.output()

    def rolled() -> list[dict[str, object]]:
        return [m.json() for m in sub.on("events") if m.json()["type"] == "model_rolled_back"]

    wait_until(lambda: bool(rolled()), 120, "the rollback")
    ev = rolled()[0]
    assert ev["model"] == {"name": MODEL, "version": 2} and ev["to"] == 1 and ev["code"] == "probation_failed"
    reason = str(ev["reason"])
    print("\n" + reason)
    assert reason.startswith("output collapse: 0.00 detections per frame") and "before (under 1/10)" in reason
    assert [x for x in sub.results() if x["model"]["version"] == 2 and x["detections"]] == []
    wait_results(sub, 1, n=len([x for x in sub.results() if x["model"]["version"] == 1]) + 5)  # v1 serves again


def test_the_output_is_judged_after_the_latency_passed() -> None:
    """With a latency baseline (every swap has one, and a restart that recorded one), a version as fast as
    the old one that sees nothing is still rolled back: the output is judged once its window is full."""
    from edged.daemon.config import ModelConfig
    from edged.daemon.inference import ActiveModel
    from edged.daemon.lifecycle.probation import Probation, probation_verdict

    cfg = ModelConfig(name="faces", probation_output_frames=200)  # probation_latency_ratio 2, output ratio 10
    cpu = SimpleNamespace(cpu_bound=True)
    a = ActiveModel(backend=cpu, decoder=None, name="faces", version=2)  # type: ignore[arg-type]
    for _ in range(100):  # as fast as the old one: the latency passes
        a.cost_ms.add(4.0)
        a.batches += 1
    a.rows, a.detections, a.score_sum = 150, 0, 0.0
    p = Probation(2, 0.0, 4.0, 0, OutputFigures(200, 210, 190.0))
    assert probation_verdict(p, a, cfg) == ""  # 150 frames: its window is not full yet
    a.rows = 200
    assert probation_verdict(p, a, cfg).startswith("output collapse: 0.00 detections per frame")
    a.detections, a.score_sum = 190, 170.0
    assert probation_verdict(p, a, cfg) == ""
    for _ in range(300):  # twice as slow and more: the latency verdict comes first
        a.cost_ms.add(9.0)
    assert probation_verdict(p, a, cfg).startswith("latency regression: median batch 9.0 ms vs 4.0 ms")
