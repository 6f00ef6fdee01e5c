"""A cascade stage's version pushed over the air to a serving daemon, alone: real mosquitto, a real daemon running
BlazeFace (back camera) as the primary and the front-camera BlazeFace as a detector stage on each face's crop, both
from the model store; the real `edged push --stage`. A good version is flipped in between two stage batches (no
result mixes versions), passes its probation and becomes the store's current; a bad one (the same graph with its
scores pushed down by 100 logits: it detects nothing) is rolled back alone while the primary's results keep flowing;
a version whose batch does not fit the memory budget is refused, naming the stage and the figures."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import helper

from edged.daemon.cascade.loader import buffers_mb
from edged.daemon.lifecycle.admission import estimate_mb
from edged.models.demo import DemoAssets
from edged.models.package import open_package, pack_tar, write_package
from edged.models.rebatch import rebatch
from edged.models.signing import SigningKey
from tests.conftest import Broker, base_config, edged_cli, wait_until, write_config

PRIMARY, STAGE = "blazeface-back", "blazeface-front"


def build(
    demo: DemoAssets, tmp: Path, key: SigningKey, name: str, version: int, model: Path | None = None, **extra: Any
) -> Path:
    """A signed tar of a demo package as `version`, with another model file or manifest fields on request."""
    src = demo.packages[name]
    folder = tmp / f"{name}-{version}-{time.monotonic_ns()}"
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields.update(version=version, **extra)
    if model is not None:
        m = onnx.load(str(model))
        dims = m.graph.input[0].type.tensor_type.shape.dim
        fields["input"] = {**fields["input"], "shape": [d.dim_value for d in dims]}
    files = {"model.onnx": model or src.model_path, "labels.txt": src.root / "labels.txt"}
    pkg = write_package(folder, fields, files)
    return pack_tar(pkg, tmp / f"{folder.name}.tar", key.sign(pkg.manifest_bytes))


def blind(demo: DemoAssets, out: Path) -> Path:
    """The front BlazeFace with every score output lowered by 100 logits: the same graph, it finds no face."""
    src = demo.packages[STAGE]
    m = onnx.load(str(src.model_path))
    scores = src.manifest.decoder.params["scores"]
    for name in scores:
        for node in m.graph.node:
            node.output[:] = [f"{o}_raw" if o == name else o for o in node.output]
            node.input[:] = [f"{i}_raw" if i == name else i for i in node.input]
    hundred = helper.make_tensor("minus_100", onnx.TensorProto.FLOAT, [], [100.0])
    m.graph.initializer.append(hundred)
    for name in scores:
        m.graph.node.append(helper.make_node("Sub", [f"{name}_raw", "minus_100"], [name]))
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


def big_batch(demo: DemoAssets, out: Path, batch: int) -> Path:
    """The front BlazeFace at a fixed batch of `batch` crops: its working memory grows with it."""
    onnx.save(rebatch(onnx.load(str(demo.packages[STAGE].model_path)), batch), str(out))
    return out


def device(broker: Broker, demo: DemoAssets, tmp: Path, budget_mb: float = 4096.0) -> Path:
    cams = [
        {
            "name": "lobby",
            "uri": f"file://{demo.video}",
            "loop": True,
            "fps_max": 10,
            "detection": {"tracking": {"enabled": False}},  # every face read by the stage, every frame
        }
    ]
    doc = base_config(broker, demo, tmp, cams, device_id="cam-01", state_dir=str(tmp / "cam-01"))
    keys = str(tmp / "trusted")
    doc["model"] = {"name": PRIMARY, "keys_dir": keys, "probation_s": 600, "probation_batches": 100000,
                    "onnxruntime": {"threads": 1}}  # fmt: skip
    doc["stages"] = [
        {
            "name": "face",
            "model": {
                "name": STAGE,
                "keys_dir": keys,
                "onnxruntime": {"threads": 1},
                "probation_s": 2,
                "probation_batches": 25,
                "probation_output_frames": 30,
                "probation_latency_ratio": 20,  # the machine is shared: a cost judged loosely here
            },
            "on_labels": ["face"],
            "pad": 0.3,
            "score_threshold": 0.5,
        }
    ]
    doc["ota"] = {"chunk_kb": 64, "window": 4, "retry_s": 2}
    doc["memory"] = {"budget_mb": budget_mb}
    doc["governor"] = {"enabled": False}  # the shared machine's memory is not this daemon's
    doc["telemetry"] = {"interval_s": 2}
    return write_config(tmp / "cam-01.yaml", doc)


def install(cfg: Path, tar: Path) -> None:
    r = edged_cli("model", "install", str(tar), "-c", str(cfg))
    assert r.returncode == 0, r.stderr


def push(broker: Broker, tar: Path, *args: str) -> Any:
    return edged_cli(
        "push", str(tar), "--host", broker.host, "--port", str(broker.port), "--timeout", "120", "--device", "cam-01",
        *args, timeout=200,
    )  # fmt: skip


def current(state: Path, name: str) -> int:
    return int(os.readlink(state / "models" / name / "current").split("/")[-1])


def in_order(sub: Any) -> list[dict[str, Any]]:
    return sorted(sub.results(), key=lambda r: (r["boot_id"], r["seq"]))


def face_version(r: dict[str, Any]) -> int:
    ref = r["stage_versions"]["face"]
    name, _, version = ref.rpartition("@")
    assert name == STAGE, ref
    return int(version)


def read_faces(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [d["stages"]["face"] for d in r["detections"] if "face" in d.get("stages", {})]


def wait_stage(sub: Any, version: int, n: int = 5, timeout: float = 60) -> None:
    wait_until(
        lambda: sum(1 for r in sub.results() if face_version(r) == version and read_faces(r)) >= n,
        timeout,
        f"{n} results with faces read by stage version {version}",
    )


def test_a_stage_version_swaps_alone_commits_or_rolls_back_while_the_primary_serves(
    broker, subscribe, start_daemon, demo: DemoAssets, signer: SigningKey, tmp_path: Path
) -> None:
    cfg = device(broker, demo, tmp_path)
    state = tmp_path / "cam-01"
    install(cfg, build(demo, tmp_path, signer, PRIMARY, 1))
    install(cfg, build(demo, tmp_path, signer, STAGE, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_stage(sub, 1, n=10)

    # a good version (the same model, version 2): flipped in, judged, committed in the store
    r = push(broker, build(demo, tmp_path, signer, STAGE, 2), "--stage", "face", "--wait", "commit")
    assert r.returncode == 0, r.stderr + d.output()[-3000:]
    assert "committed" in r.stderr, r.stderr
    assert current(state, STAGE) == 2 and current(state, PRIMARY) == 1
    st = json.loads((state / "models" / STAGE / "state.json").read_text())
    assert st["pending"] is None, st
    wait_stage(sub, 2)
    versions = [face_version(r) for r in in_order(sub)]
    flipped = versions.index(2)
    assert set(versions[:flipped]) == {1} and set(versions[flipped:]) == {2}, versions  # old, then new, never back
    done = sub.wait_events("stage_committed")  # spooled; the status the push returned on went straight out
    assert done[-1]["stage"] == "face" and done[-1]["model"] == {"name": STAGE, "version": 2}, done
    assert done[-1]["figures"]["crops"] > 0 and done[-1]["figures"]["said_ratio"] > 0.5, done

    # a bad version (it detects nothing on the crops): rolled back alone; the primary serves throughout
    before = len(sub.results())
    r = push(broker, build(demo, tmp_path, signer, STAGE, 3, model=blind(demo, tmp_path / "blind.onnx")),
             "--stage", "face", "--wait", "commit")  # fmt: skip
    print(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "rolled_back" in r.stderr and "output collapse" in r.stderr and "crops with an output" in r.stderr, r.stderr
    assert current(state, STAGE) == 2 and current(state, PRIMARY) == 1
    st = json.loads((state / "models" / STAGE / "state.json").read_text())
    assert 3 in st["bad"] and st["pending"] is None, st
    wait_until(lambda: face_version(in_order(sub)[-1]) == 2 and len(sub.results()) > before + 10, 60, "v2 again")
    results = in_order(sub)
    versions = [face_version(r) for r in results]
    first3, last3 = versions.index(3), len(versions) - 1 - versions[::-1].index(3)
    assert set(versions[first3 : last3 + 1]) == {3} and set(versions[last3 + 1 :]) == {2}, versions[before:]
    blind_reads = [f for r in results[first3 : last3 + 1] for f in read_faces(r)]
    assert blind_reads and all(f["boxes"] == [] for f in blind_reads), blind_reads[:3]
    assert all(r["model"]["version"] == 1 for r in results)  # the primary never changed
    # the primary kept serving: its results came at the camera's pace across the swap and the rollback
    stamps = [dt.datetime.fromisoformat(r["captured_at"].replace("Z", "+00:00")) for r in results[before:]]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert max(gaps) < 3.0, max(gaps)
    rolled = sub.wait_events("stage_rolled_back")  # v2 serves again before the event is spooled
    assert rolled[-1]["stage"] == "face" and rolled[-1]["to"] == 2, rolled
    assert rolled[-1]["figures"]["said_ratio"] == 0.0 and rolled[-1]["figures"]["baseline_said_ratio"] > 0.5, rolled
    assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.slow  # two daemon starts and a push; the swap and its verdicts are the default test above
def test_a_stage_probation_spans_a_restart(
    broker, subscribe, start_daemon, demo: DemoAssets, signer: SigningKey, tmp_path: Path
) -> None:
    """A blind version installed while the daemon is stopped is judged at the next start against what the store
    recorded of the version it replaced (at the last swap), and rolled back: that version loaded again."""
    cfg = device(broker, demo, tmp_path)
    state = tmp_path / "cam-01"
    install(cfg, build(demo, tmp_path, signer, PRIMARY, 1))
    install(cfg, build(demo, tmp_path, signer, STAGE, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_stage(sub, 1, n=10)
    r = push(broker, build(demo, tmp_path, signer, STAGE, 2), "--stage", "face", "--wait", "commit")
    assert r.returncode == 0, r.stderr
    wait_stage(sub, 2, n=10)
    assert d.stop() == 0, d.output()[-3000:]
    install(cfg, build(demo, tmp_path, signer, STAGE, 3, model=blind(demo, tmp_path / "blind.onnx")))
    assert current(state, STAGE) == 3
    d = start_daemon(cfg)
    wait_until(lambda: current(state, STAGE) == 2, 90, "the blind version rolled back after the restart")
    rolled = sub.wait_events("stage_rolled_back")  # the store rolls back before the event is spooled
    assert rolled[-1]["model"]["version"] == 3 and "output collapse" in rolled[-1]["reason"], rolled[-1]
    assert 3 in json.loads((state / "models" / STAGE / "state.json").read_text())["bad"]
    seen = sum(1 for r in sub.results() if face_version(r) == 2 and read_faces(r))
    wait_stage(sub, 2, n=seen + 3)  # version 2 reads the faces again
    assert d.stop() == 0, d.output()[-3000:]


def test_a_stage_version_over_the_memory_budget_is_refused_naming_the_stage_and_figures(
    broker, subscribe, start_daemon, demo: DemoAssets, signer: SigningKey, tmp_path: Path
) -> None:
    """Also: a stage version installed while the daemon was stopped is on probation from the start, and
    committed; offers for a stage not configured, or of a package with another decoder, are refused at once."""
    big = build(demo, tmp_path, signer, STAGE, 3, model=big_batch(demo, tmp_path / "b256.onnx", 256))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    need = estimate_mb(p := open_package(big, scratch=scratch)) + buffers_mb(p)
    assert need > 600, need  # far over what the daemon takes with its primary and stage
    cfg = device(broker, demo, tmp_path, budget_mb=need)  # it starts; the candidate alone takes the whole budget
    state = tmp_path / "cam-01"
    install(cfg, build(demo, tmp_path, signer, PRIMARY, 1))
    install(cfg, build(demo, tmp_path, signer, STAGE, 1))
    install(cfg, build(demo, tmp_path, signer, STAGE, 2))  # on probation in the store, previous 1
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg)
    wait_stage(sub, 2)

    def committed() -> bool:
        return any(m.json()["type"] == "stage_committed" for m in sub.on("events"))

    wait_until(committed, 60, "the stage version installed before the start committed")
    assert json.loads((state / "models" / STAGE / "state.json").read_text())["pending"] is None
    r = push(broker, big, "--stage", "face")
    print(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "over_budget" in r.stderr and "stage 'face'" in r.stderr and f"{STAGE}@3" in r.stderr, r.stderr
    assert f"memory.budget_mb {need:.0f} MB" in r.stderr, r.stderr
    assert current(state, STAGE) == 2
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 5, 30, "results after the refusal")
    assert all(face_version(r) == 2 for r in sub.results())
    # an offer for a stage this daemon does not run is refused at once, naming both
    r = push(broker, build(demo, tmp_path, signer, STAGE, 4), "--stage", "plates")
    assert r.returncode == 1 and "stage 'plates' is not configured" in r.stderr and "face" in r.stderr, r.stderr
    # nor a package whose decoder is not the one the stage reads its crops with
    r = push(broker, build(demo, tmp_path, signer, STAGE, 5, decoder={"type": "classify"}), "--stage", "face")
    want = f"{STAGE}@5 (decoder classify) cannot serve stage 'face', whose {STAGE}@2 reads crops with decoder "
    want += "ssd_anchors"
    assert r.returncode == 1 and want in r.stderr, r.stderr
    assert 5 not in json.loads((state / "models" / STAGE / "state.json").read_text())["bad"]  # not the version's fault
    assert d.stop() == 0, d.output()[-3000:]


def test_push_stage_takes_devices_only(tmp_path: Path) -> None:
    """`--stage` is a direct push to named devices: a group, a canary, a mirror or a shadow ask is refused."""
    for extra in (["--group", "dock"], ["--device", "cam-01", "--canary", "1"], ["--device", "cam-01", "--shadow"]):
        r = edged_cli("push", str(tmp_path / "x.tar"), "--stage", "face", *extra)
        assert r.returncode == 2 and "--stage: not with" in r.stderr, (extra, r.stderr)
    r = edged_cli("push", str(tmp_path / "x.tar"), "--stage", "face")
    assert r.returncode == 2 and "name the devices" in r.stderr, r.stderr
