"""A package with several fixed batches (manifest ``extra_batches``), end to end.

`edged model init --batch 1,4` on the real BlazeFace export writes the model at batch 4 and at batch 1;
a real daemon (mosquitto on 127.0.0.1, ONNX Runtime) with one camera runs every batch at 1 (no padding
rows), with four cameras at 4, and publishes, frame for frame, what the single-batch package does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.backends.base import BatchSet, fixed_batches
from edged.daemon.inference import warm_up
from edged.daemon.lifecycle.manager import check_io, estimate_mb, golden_check
from edged.errors import EngineLoadError, InferenceError, PackageError, SwapError
from edged.models.demo import DemoAssets
from edged.models.golden import load_input
from edged.models.package import Package, parse_manifest, verify_folder, write_package

from .conftest import base_config, edged_cli, write_config
from .ultralytics_export import yolov8_export

RAW = "face_detection_back_256x256_barracuda.onnx"
START, FRAMES = 120, 48  # of the demo video: one face, none, then two; short enough for three daemon runs


@pytest.fixture(scope="module")
def built(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The single-batch (4) and the multi-batch (1,4) packages from the export, and a short clip of the video."""
    root = tmp_path_factory.mktemp("multibatch")
    image = root / "frame.png"
    cap = cv2.VideoCapture(str(demo.video))
    clip = root / "clip.mp4"
    out: cv2.VideoWriter | None = None
    for i in range(START + FRAMES):
        ok, frame = cap.read()
        assert ok, f"the demo video ended at frame {i}"
        if i < START:
            continue
        if out is None:
            h, w = frame.shape[:2]
            out = cv2.VideoWriter(str(clip), cv2.VideoWriter.fourcc(*"mp4v"), 30.0, (w, h))
        if i == START + FRAMES - 1:
            cv2.imwrite(str(image), frame)  # two faces: the golden pair's frame
        out.write(frame)
    assert out is not None
    out.release()
    cap.release()
    pkgs = {}
    for key, batch in (("single", "4"), ("multi", "1,4")):
        dest = root / key
        done = edged_cli(
            "model", "init", str(demo.root / "raw" / RAW), "--batch", batch, "--out", str(dest), "--name", "faces",
            "--image", str(image),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        pkgs[key] = verify_folder(dest)
    return {"clip": clip, **pkgs}


def test_init_writes_every_batch_and_the_old_format_is_unchanged(built: dict[str, Any], demo: DemoAssets) -> None:
    single, multi = built["single"], built["multi"]
    assert multi.manifest.batch_files == {1: "model.b1.onnx", 4: "model.onnx"}
    assert multi.manifest.input.shape == single.manifest.input.shape == [4, 256, 256, 3]
    assert set(multi.manifest.files) == {"model.onnx", "model.b1.onnx", "golden_input.npz", "golden_output.npz"}
    # a single-batch manifest has no extra_batches key at all: it reads (and is written) as before
    assert single.manifest.batch_files == {4: "model.onnx"} and b"extra_batches" not in single.manifest_bytes
    old = demo.packages["blazeface-back"]
    assert parse_manifest(old.manifest_bytes, "old").to_json() == old.manifest_bytes
    # the memory budget counts both models (admission refuses on this estimate before anything loads)
    b1_mb = (multi.root / "model.b1.onnx").stat().st_size / 2**20
    assert estimate_mb(multi) > estimate_mb(single) + b1_mb


def test_manifest_refuses_inconsistent_batches(built: dict[str, Any], tmp_path: Path) -> None:
    multi: Package = built["multi"]
    doc = json.loads(multi.manifest_bytes)
    for extra, why in (
        ([{"batch": 4, "file": "model.b1.onnx"}], "must be smaller than input.shape"),
        ([{"batch": 1, "file": "model.b1.onnx"}, {"batch": 1, "file": "model.onnx"}], "each batch and file once"),
        ([{"batch": 2, "file": "model.b2.onnx"}], "'model.b2.onnx' is not listed in files"),
    ):
        with pytest.raises(PackageError, match=why):
            parse_manifest(json.dumps({**doc, "extra_batches": extra}).encode(), "m")
    # a smaller batch's file that is another model is refused by the I/O check, naming the file
    fields = {k: v for k, v in doc.items() if k != "files"}
    files = {name: multi.root / name for name in multi.manifest.files}
    files["model.b1.onnx"] = multi.root / "model.onnx"  # batch 4 where batch 1 is declared
    bad = write_package(tmp_path / "bad", fields, files)
    members = {b: OnnxRuntimeBackend(p, threads=1) for b, p in bad.batch_paths.items()}
    with BatchSet(members) as backend, pytest.raises(EngineLoadError, match=r"model.b1.onnx: input 'input:0' is \[4,"):
        check_io(bad, backend)


def test_batch_set_runs_each_batch_and_checks_each_golden(built: dict[str, Any], tmp_path: Path) -> None:
    multi: Package = built["multi"]
    spec = multi.manifest.input
    with BatchSet({b: OnnxRuntimeBackend(p, threads=1) for b, p in multi.batch_paths.items()}) as backend:
        assert fixed_batches(backend, spec.batch) == (1, 4)
        check_io(multi, backend)
        warm_up(backend, spec, 1)
        checked = golden_check(multi, backend)
        assert checked == "golden check passed (4 outputs, at batches [1, 4])"
        x = load_input(multi.root / "golden_input.npz")
        four, one = backend.infer({spec.name: x}), backend.infer({spec.name: x[:1]})
        for name, value in one.items():  # row for row the same numbers at either batch
            assert value.shape[0] == 1 and np.array_equal(value[0], four[name][0]), name
        with pytest.raises(InferenceError, match=r"no model at batch 2 \(this package carries \[1, 4\]\)"):
            backend.infer({spec.name: x[:2]})
    # one backend at the largest batch alone (a single-batch backend) is checked and warmed up at that batch
    with OnnxRuntimeBackend(multi.model_path, threads=1) as largest:
        check_io(multi, largest)
        assert golden_check(multi, largest) == "golden check passed (4 outputs)"
    # a golden output that batch 1 does not reproduce is refused at that batch
    bad_out = tmp_path / "golden_output.npz"
    expected = dict(np.load(multi.root / "golden_output.npz"))
    name = sorted(expected)[0]
    expected[name] = expected[name].copy()
    expected[name][0] += 1.0  # row 0: the only row batch 1 runs (batch 4 runs it too, and fails first)
    np.savez(bad_out, **expected)
    fields = {k: v for k, v in json.loads(multi.manifest_bytes).items() if k != "files"}
    files = {n: multi.root / n for n in multi.manifest.files} | {"golden_output.npz": bad_out}
    bad = write_package(tmp_path / "bad", fields, files)
    members = {b: OnnxRuntimeBackend(p, threads=1) for b, p in bad.batch_paths.items()}
    with BatchSet(members) as backend, pytest.raises(SwapError, match="golden check failed at batch 1"):
        golden_check(bad, backend)


def _run(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp: Path, pkg: Package, clip: Path, n: int
) -> tuple[dict[tuple[str, int], Any], dict[str, Any]]:
    """The daemon on `pkg` with `n` cameras reading `clip`: every result's detections by (camera, frame), and
    the last telemetry's inference figures."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    sub = subscribe(broker, "edged/#")
    cams = [{"name": f"cam{i}", "uri": f"file://{clip}", "realtime": False} for i in range(n)]
    doc = base_config(broker, demo, tmp, cams)
    doc["model"]["package"] = str(pkg.root)
    doc["inference"]["max_wait_ms"] = 200  # four cameras read one file each: a batch waits for all four
    d = start_daemon(write_config(tmp / "c.yaml", doc))
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    results = sub.results()
    assert len(results) == n * FRAMES, d.output()[-2000:]
    tel = [m.json()["inference"] for m in sub.on("telemetry")]
    assert tel and tel[-1]["rows"] == n * FRAMES
    sub.close()
    return {(r["camera"], r["frame"]): r["detections"] for r in results}, tel[-1]


def test_daemon_runs_the_smallest_batch_that_covers_the_cameras(
    built: dict[str, Any], broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    clip = built["clip"]
    ref, ref_tel = _run(broker, subscribe, start_daemon, demo, tmp_path / "a", built["single"], clip, 1)
    # the single-batch package pads every one-camera batch to 4
    assert ref_tel["batch_runs"] == {"4": FRAMES} and ref_tel["padded_rows"] == 3 * FRAMES

    one, one_tel = _run(broker, subscribe, start_daemon, demo, tmp_path / "b", built["multi"], clip, 1)
    assert one_tel["batch_runs"] == {"1": FRAMES} and one_tel["padded_rows"] == 0
    assert one == ref, "the batch-1 model's results differ from the batch-4 package's"
    assert sum(len(v) for v in ref.values()) > FRAMES / 2, "the clip shows faces"

    four, four_tel = _run(broker, subscribe, start_daemon, demo, tmp_path / "c", built["multi"], clip, 4)
    runs = {int(b): k for b, k in four_tel["batch_runs"].items()}
    assert set(runs) <= {1, 4} and sum(runs.values()) == four_tel["batches"]
    # four cameras fill batches of 4 (the odd batch 1 when a camera lags behind the wait is fine)
    assert 4 * runs.get(4, 0) >= 0.75 * 4 * FRAMES, runs
    for cam in range(4):
        assert {f: dets for (c, f), dets in four.items() if c == f"cam{cam}"} == {
            f: dets for (_, f), dets in ref.items()
        }, f"cam{cam}'s results differ from the single-batch package's"


def test_quantize_carries_every_batch(built: dict[str, Any], tmp_path: Path) -> None:
    """`edged quantize --batch 1,4` on the single-batch float package: the int8 model at 4 and, rebatched
    (the same scales), at 1; the package loads and each batch's rows agree."""
    out = tmp_path / "int8"
    done = edged_cli(
        "quantize", str(built["single"].root), "--calib", str(built["clip"]), "--calib-frames", "8",
        "--eval", str(built["clip"]), "--eval-frames", "16", "--no-search", "--score-threshold", "0.7",
        "--threads", "1", "--batch", "1,4", "--out", str(out), "--force",
        timeout=600,
    )  # fmt: skip
    assert done.returncode in (0, 4) and "quantize: wrote" in done.stdout, done.stderr[-2000:]
    assert "model.b1.onnx (the quantized model rebatched" in done.stderr
    pkg = verify_folder(out)
    assert pkg.manifest.precision == "int8" and pkg.manifest.batch_files == {1: "model.b1.onnx", 4: "model.onnx"}
    spec = pkg.manifest.input
    x = load_input(built["single"].root / "golden_input.npz")
    with BatchSet({b: OnnxRuntimeBackend(p, threads=1) for b, p in pkg.batch_paths.items()}) as backend:
        check_io(pkg, backend)
        four, one = backend.infer({spec.name: x}), backend.infer({spec.name: x[:1]})
    for name, value in one.items():
        assert np.allclose(value[0], four[name][0], rtol=1e-3, atol=1e-4), name
    # the largest batch must stay the model's own
    bad = edged_cli(
        "quantize", str(built["single"].root), "--precision", "fp16", "--eval", str(built["clip"]),
        "--batch", "1,8", "--out", str(tmp_path / "bad"),
    )  # fmt: skip
    assert bad.returncode == 1 and "the largest must be the model's own batch 4" in bad.stderr, bad.stderr[-1000:]


def test_an_ultralytics_shaped_export_gives_the_same_detections_at_every_batch(
    built: dict[str, Any], broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """A static (batch 1) export shaped like a real Ultralytics YOLOv8 one, anchors computed in the graph with a
    `[1, -1]` Reshape that is not the batch (tests/ultralytics_export.py), through `edged model init --batch 1,4`
    and `edged run`: one camera (batch 1, the export itself) and four (batch 4, rebatched) publish the same
    detections frame for frame. Before the value check, batch 4 published every box elsewhere."""
    src = yolov8_export(tmp_path / "yolov8n.onnx", ["person", "car", "dog"], 320, class_bias=0.0)
    done = edged_cli(
        "model", "init", str(src), "--batch", "1,4", "--out", str(tmp_path / "yolo"),
        "--image", str(built["clip"].parent / "frame.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    pkg = verify_folder(tmp_path / "yolo")
    one, one_tel = _run(broker, subscribe, start_daemon, demo, tmp_path / "a", pkg, built["clip"], 1)
    assert one_tel["batch_runs"] == {"1": FRAMES}
    assert sum(len(v) for v in one.values()) >= FRAMES / 4, "the stand-in finds things in the clip"
    four, four_tel = _run(broker, subscribe, start_daemon, demo, tmp_path / "b", pkg, built["clip"], 4)
    assert int(four_tel["batch_runs"].get("4", 0)) >= 0.75 * FRAMES, four_tel["batch_runs"]
    for cam in range(4):
        mine = {f: dets for (c, f), dets in four.items() if c == f"cam{cam}"}
        assert mine == {f: dets for (_, f), dets in one.items()}, f"cam{cam} (batch 4) differs from batch 1"
