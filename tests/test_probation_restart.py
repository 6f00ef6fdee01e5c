"""Probation after a restart has an output baseline (issue 29 item 4): each serving version's output is
recorded beside the store's state.json (output.json), and a version installed while the daemon was stopped
is judged against what `previous` output, as a running swap judges against the model it replaces; so is a version
pushed over the air to a running daemon whose probation a clean restart (SIGTERM: `systemctl restart`) cuts
short before its verdict (the replaced version's window recorded at the swap), and that stop is no crash."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey

from .conftest import Broker, wait_until, write_config
from .test_ota import MODEL, build, device_doc, install, start_push, store_view, wait_results
from .test_probation_output import blind

# (the new modules are imported in the tests that use them: the end-to-end test below also runs against
# the code before output.json existed, where it must fail on its verdict, not on an import)


def test_output_json_keeps_the_versions_on_disk_and_survives_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from edged.models.store import RecordedOutput, Store
    from edged.models.store.output import OUTPUT, OUTPUT_SCHEMA

    store = Store(tmp_path)
    d = tmp_path / "models" / "faces"
    for v in (1, 2):
        (d / "versions" / str(v)).mkdir(parents=True)
    one = RecordedOutput(200, 78, 70.25, 3.5, 1_800_000_000.0)
    size = store.record_output("faces", 1, one)
    store.record_output("faces", 2, RecordedOutput(200, 80, 71.0, None, 1_800_000_060.0))
    assert store.recorded_output("faces", 1) == one and store.recorded_output("faces", None) is None
    doc = json.loads((d / OUTPUT).read_text())
    assert doc["schema"] == OUTPUT_SCHEMA and list(doc["versions"]) == ["2", "1"]
    assert 150 < size < 400, size  # one version: a couple of hundred bytes
    (d / "versions" / "1").rmdir()  # pruned: its entry goes at the next write
    store.record_output("faces", 2, RecordedOutput(200, 81, 72.0, 3.4, 1_800_000_180.0))
    assert sorted(json.loads((d / OUTPUT).read_text())["versions"]) == ["2"]
    # damaged (by the disk, by hand): no baseline, a warning naming the file, never an exception
    for bad in (b'{"schema": "edged.store.output/1", "versions": {"2": {"rows": -1}}}', b"\x00garbage", b"[]"):
        (d / OUTPUT).write_bytes(bad)
        with caplog.at_level(logging.WARNING):
            assert store.recorded_output("faces", 2) is None
        assert f"{d / OUTPUT} is unusable" in caplog.text
        caplog.clear()
    store.record_output("faces", 2, RecordedOutput(200, 81, 72.0, 3.4, 1_800_000_240.0))  # and rewritten whole
    assert store.recorded_output("faces", 2) is not None


def test_the_recorder_writes_once_a_minute_and_keeps_a_full_window(tmp_path: Path) -> None:
    from edged.daemon.inference import ActiveModel
    from edged.daemon.lifecycle.probation import RECORD_EVERY_S, OutputRecorder
    from edged.models.store import Store

    store = Store(tmp_path)
    (tmp_path / "models" / "faces" / "versions" / "1").mkdir(parents=True)
    rec = OutputRecorder(store, frames=200)
    a = ActiveModel(backend=None, decoder=None, name="faces", version=1)  # type: ignore[arg-type]
    rec.tick(0.0, a)
    assert store.recorded_output("faces", 1) is None  # nothing decoded: nothing written
    a.recent.extend([(1, 0.9)] * 300)
    a.rows = 300
    a.cost_ms.add(4.0)
    rec.record(a)
    first = store.recorded_output("faces", 1)
    assert first is not None and (first.rows, first.detections, first.median_batch_ms) == (200, 200, 4.0)
    written = rec.written
    rec.record(a)  # nothing decoded since: nothing written
    a.rows += 1
    a.recent.append((0, 0.0))
    rec.tick(time.monotonic() + RECORD_EVERY_S / 2, a)  # too soon after the last write
    assert rec.written == written
    rec.tick(time.monotonic() + RECORD_EVERY_S + 1, a)
    assert rec.written == 2 * written and store.recorded_output("faces", 1) != first
    # a restart that served a few frames does not replace a full window with a short one
    b = ActiveModel(backend=None, decoder=None, name="faces", version=1)  # type: ignore[arg-type]
    b.recent.extend([(0, 0.0)] * 30)
    b.rows = 30
    OutputRecorder(store, frames=200).record(b)
    kept = store.recorded_output("faces", 1)
    assert kept is not None and kept.rows == 200
    print(f"\noutput.json: {written} bytes a write; at most {written * 60} bytes an hour")


def events(sub: Any, kind: str, version: int) -> list[dict[str, Any]]:
    docs = [m.json() for m in sub.on("events")]
    return [e for e in docs if e["type"] == kind and (e.get("model") or {}).get("version") == version]


def v1_served(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> tuple[Path, Path, Any, Any]:
    """Version 1 installed and serving the demo video at its own 15 fps until its output window is full.
    150 frames: half the looping demo video (over 1 face per frame), so version 1's window holds well over
    the 20 detections a collapse is judged against; a commit needs 170 batches of one frame: after the output
    verdict. Returns the config, the model's store folder, the subscriber (edged/cam-01/#) and the daemon."""
    doc = device_doc(broker, demo, tmp_path, "cam-01")
    doc["cameras"][0]["fps_max"] = 15  # the video's own rate
    doc["model"].update(probation_output_frames=150, probation_s=1, probation_batches=170)
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    install(cfg, build(demo, tmp_path, signer, 1))
    sub = subscribe(broker, "edged/cam-01/#")
    d1 = start_daemon(cfg)
    wait_results(sub, 1, n=160, timeout=120)
    return cfg, tmp_path / "cam-01" / "models" / MODEL, sub, d1


def test_a_version_installed_while_stopped_is_judged_on_the_output_recorded_before(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    """Version 1 serves the demo video and stops; a blind version 2 (the same BlazeFace, its scores lowered:
    it loads, runs as fast, and sees no face) is installed with `edged model install` while the daemon is
    stopped. At the start it is judged against version 1's recorded output and rolled back for its collapse;
    an identical version 3 installed the same way commits. Default latency ratio: the output is judged
    after the latency passed."""
    cfg, state, sub, d1 = v1_served(demo, tmp_path, signer, broker, subscribe, start_daemon)
    assert d1.stop() == 0, d1.output()

    install(cfg, build(demo, tmp_path, signer, 2, model=blind(demo.packages[MODEL].model_path, tmp_path / "b.onnx")))
    d2 = start_daemon(cfg)
    wait_until(lambda: bool(events(sub, "model_rolled_back", 2) or events(sub, "model_committed", 2)), 120, "v2's end")
    assert not events(sub, "model_committed", 2), "the blind version 2 committed:\n" + d2.output()
    ev = events(sub, "model_rolled_back", 2)[0]
    print("\n" + str(ev["reason"]))
    assert ev["to"] == 1 and ev["code"] == "probation_failed"
    reason = str(ev["reason"])
    assert re.fullmatch(
        r"output collapse: 0\.00 detections per frame, mean score 0\.00 over 1\d\d frames vs .*", reason
    )
    assert f"{MODEL}@2 on probation against {MODEL}@1's output as recorded" in d2.output()
    n1 = sum(1 for r in sub.results() if r["model"]["version"] == 1)
    wait_results(sub, 1, n=n1 + 5)  # version 1 serves again
    assert d2.stop() == 0, d2.output()
    recorded = json.loads((state / "output.json").read_text())["versions"]
    assert recorded["1"]["rows"] == 150 and recorded["1"]["detections"] >= 20, recorded  # not a short run's
    assert recorded["1"]["source"] == "served"
    one = recorded["1"]  # what version 2 was judged against
    rate, mean = one["detections"] / one["rows"], one["score_sum"] / one["detections"]
    assert reason.endswith(
        f" vs {rate:.2f} detections per frame, mean score {mean:.2f} over 150 frames before (under 1/10)"
    )

    install(cfg, build(demo, tmp_path, signer, 3))  # identical to version 1
    d3 = start_daemon(cfg)
    wait_until(lambda: bool(events(sub, "model_committed", 3) or events(sub, "model_rolled_back", 3)), 120, "v3")
    assert events(sub, "model_committed", 3), d3.output()
    assert f"{MODEL}@3 on probation against {MODEL}@1's output as recorded" in d3.output()


def store_state(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "state.json").read_text()))


def boot_of(sub: Any, version: int) -> str:
    """The boot id of the run that served `version` (its results say)."""
    return str(next(r["boot_id"] for r in sub.results() if r["model"]["version"] == version))


def pushed_then_stopped(
    demo: DemoAssets,
    tmp_path: Path,
    signer: SigningKey,
    broker: Broker,
    subscribe: Any,
    start_daemon: Any,
    model: Path | None,
    frames_on_probation: int = 0,
) -> tuple[Path, Any, Any, str]:
    """Version 1 serves the demo video at its own 15 fps until its output window (150 frames) is full; version 2
    (`model`, else identical) is pushed over the air to the running daemon with `edged push --wait commit`; once
    it serves (and `frames_on_probation` of its results are out) the daemon gets a SIGTERM, what `systemctl
    restart` sends, before any verdict: a commit needs 170 batches of one frame, the output verdict 150.
    Returns the config, the subscriber, the pusher still waiting for the commit, and the stopped run's boot id.
    """
    cfg, state, sub, d1 = v1_served(demo, tmp_path, signer, broker, subscribe, start_daemon)
    pusher = start_push(broker, build(demo, tmp_path, signer, 2, model=model), "--device", "cam-01",
                        "--wait", "commit", "--timeout", "240")  # fmt: skip
    wait_until(lambda: bool(events(sub, "model_activated", 2)), 120, "version 2 swapped in")
    if frames_on_probation:
        wait_results(sub, 2, n=frames_on_probation, timeout=120)
    assert d1.stop() == 0, d1.output()  # SIGTERM
    boot1 = boot_of(sub, 1)
    # the stop cut the probation short: no verdict yet, and a clean stop is no crash
    assert not events(sub, "model_committed", 2) and not events(sub, "model_rolled_back", 2), d1.output()
    st = store_state(state)
    assert (st["pending"], st["probation_crashes"], st["probation_boot"]) == (2, 0, None), st
    assert st["baseline_infer_ms"], st  # version 1's median batch cost, from the swap
    one = json.loads((state / "output.json").read_text())["versions"]["1"]  # recorded at the swap: v1's window
    assert one["rows"] == 150 and one["detections"] >= 20 and one["source"] == "served", one
    assert pusher.poll() is None, "the pusher gave up at the stop:\n" + str(pusher.communicate()[0])
    return cfg, sub, pusher, boot1


def test_a_pushed_version_whose_probation_a_restart_cuts_short_is_judged_on_output_after_it(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    """A blind version 2 (it loads, runs as fast as version 1, and sees no face) is pushed over the air to the
    running daemon, and a clean restart cuts its probation short before the verdict. The restarted daemon has
    no replaced model in memory: it judges version 2 against version 1's output as recorded at the swap, rolls
    it back for its collapse (marked bad, the figures in the event's reason) and serves version 1 again; the
    stop counted no crash; the pusher, waiting for the commit across the restart, reports the rollback."""
    blind_model = blind(demo.packages[MODEL].model_path, tmp_path / "b.onnx")
    cfg, sub, pusher, boot1 = pushed_then_stopped(demo, tmp_path, signer, broker, subscribe, start_daemon, blind_model)
    state = tmp_path / "cam-01" / "models" / MODEL
    one = json.loads((state / "output.json").read_text())["versions"]["1"]  # what version 2 is judged against

    d2 = start_daemon(cfg)
    wait_until(lambda: bool(events(sub, "model_rolled_back", 2) or events(sub, "model_committed", 2)), 120, "v2's end")
    assert not events(sub, "model_committed", 2), "the blind version 2 committed after the restart:\n" + d2.output()
    ev = events(sub, "model_rolled_back", 2)[0]
    print("\n" + str(ev["reason"]))
    assert ev["boot_id"] != boot1 and ev["to"] == 1 and ev["code"] == "probation_failed", ev
    rate, mean = one["detections"] / one["rows"], one["score_sum"] / one["detections"]
    assert re.fullmatch(
        r"output collapse: 0\.00 detections per frame, mean score 0\.00 over 1\d\d frames vs "
        + re.escape(f"{rate:.2f} detections per frame, mean score {mean:.2f} over 150 frames before (under 1/10)"),
        str(ev["reason"]),
    ), ev["reason"]
    log = d2.output()
    assert f"{MODEL}@2 on probation against {MODEL}@1's output as recorded" in log, log
    assert "crash(es) on probation" not in log, log
    out, _ = pusher.communicate(timeout=60)
    print(out)
    assert pusher.returncode == 1 and "rolled_back" in out and "output collapse" in out, out
    n1 = sum(1 for r in sub.results() if r["model"]["version"] == 1)
    wait_results(sub, 1, n=n1 + 5)  # version 1 serves again
    assert d2.stop() == 0, d2.output()
    view = store_view(tmp_path / "cam-01")
    assert (view["current"], view["bad"]) == (1, [2]), view


@pytest.mark.slow
def test_an_identical_pushed_version_whose_probation_spans_a_restart_commits_after_a_full_window(
    demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe: Any, start_daemon: Any
) -> None:
    """Version 2, identical to version 1, is pushed over the air and serves 80 frames of its probation
    (short of the 150 of the output verdict and the 170 batches of a commit) when a clean restart cuts it
    short. The restarted daemon judges it against version 1's recorded output and commits it; the probation
    starts over with the run (its `probation_s`, batches and output window count from the start: the frames
    before the stop are not carried over); the pusher waiting across the restart reports the commit."""
    cfg, sub, pusher, boot1 = pushed_then_stopped(
        demo, tmp_path, signer, broker, subscribe, start_daemon, None, frames_on_probation=80
    )
    state = tmp_path / "cam-01" / "models" / MODEL
    stopped, seen = time.monotonic(), len(sub.on("model/state"))
    d2 = start_daemon(cfg)

    def new_runs_probation() -> dict[str, Any] | None:  # the restarted run's first retained model state on probation
        docs = [m.json() for m in sub.on("model/state")[seen:] if m.payload]
        return next((s["probation"] for s in docs if s.get("probation")), None)

    wait_until(lambda: new_runs_probation() is not None, 60, "the new run's model state")
    p = new_runs_probation()
    assert p is not None and p["version"] == 2, p
    assert p["elapsed_s"] <= time.monotonic() - stopped, p  # counted from the new run's start, not the swap
    wait_until(lambda: bool(events(sub, "model_committed", 2) or events(sub, "model_rolled_back", 2)), 120, "v2")
    assert events(sub, "model_committed", 2), d2.output()
    assert events(sub, "model_committed", 2)[0]["boot_id"] != boot1
    log = d2.output()
    assert f"{MODEL}@2 on probation against {MODEL}@1's output as recorded" in log, log
    passed = re.search(rf"model {MODEL}@2 passed probation \((\d+) batches, (\d+) s", log)
    assert passed is not None, log
    assert int(passed.group(1)) >= 170, log  # the whole count in the new run: the 80 before the stop are not in it
    out, _ = pusher.communicate(timeout=60)
    print(out)
    assert pusher.returncode == 0 and "committed" in out, out
    assert d2.stop() == 0, d2.output()
    st = store_state(state)
    assert (st["pending"], st["probation_crashes"], st["bad"]) == (None, 0, []), st
    recorded = json.loads((state / "output.json").read_text())["versions"]
    assert recorded["2"]["rows"] == 150 and recorded["2"]["source"] == "served", recorded
