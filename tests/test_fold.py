"""Preprocessing folded into the model (models/fold.py): the folded package of each real demo model gives the
unfolded one's outputs on real frames, each through the daemon's own preprocessing; `edged run` publishes the
same detections for both; a wrong fold is refused on values at fold, pack and install time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.lifecycle.admission import check_io, golden_check
from edged.errors import Code, PackageError, SwapError
from edged.models.batchcheck import compare_rows
from edged.models.demo import DemoAssets
from edged.models.fold import (
    check_fold,
    check_folded,
    fold_graph,
    fold_package,
    folded_spec,
    normalise,
    pixels_of,
    runner,
)
from edged.models.golden import load_input
from edged.models.package import InputSpec, Package, verify_folder, write_package
from edged.models.validate import check_package

from .conftest import base_config, edged_cli, write_config
from .test_daemon import iou
from .test_model_init import ddddocr_det  # noqa: F401  (a fixture)
from .ultralytics_export import yolov8_export


def video_frames(video: Path, n: int, step: int = 37) -> list[np.ndarray]:
    """`n` frames of a real video, `step` apart, as the daemon's file camera reads them (BGR)."""
    cap = cv2.VideoCapture(str(video))
    frames: list[np.ndarray] = []
    i = 0
    while len(frames) < n:
        ok, frame = cap.read()
        assert ok, f"{video} ended after {i} frames"
        if i % step == 0:
            frames.append(np.asarray(frame))
        i += 1
    cap.release()
    return frames


def outputs(pkg: Package, frames: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The package's model on the frames, each preprocessed by the daemon's Preprocessor for its own input
    spec (the unfolded one normalises on the CPU, the folded one only letterboxes), `batch` rows a run."""
    spec = pkg.manifest.input
    pre = Preprocessor(spec)
    rows = np.empty((len(frames), *pre.row_shape), pre.dtype)
    for row, frame in zip(rows, frames, strict=True):
        pre.run(frame, row)
    got: dict[str, list[np.ndarray]] = {}
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as backend:
        for start in range(0, len(rows), spec.batch):
            chunk = rows[start : start + spec.batch]
            n = len(chunk)
            if n < spec.batch:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], spec.batch - n, axis=0)])
            for name, value in backend.infer({spec.name: np.ascontiguousarray(chunk)}).items():
                got.setdefault(name, []).append(value[:n])
    return {k: np.concatenate(v) for k, v in got.items()}


@pytest.mark.parametrize(
    ("name", "video"),
    [
        ("blazeface-back", "video"),
        ("blazeface-front", "video"),
        pytest.param("picodet-layout", "documents", marks=pytest.mark.slow),
    ],  # 800x608 at batch 4: ~15-40 s here
)
def test_folded_demo_model_gives_the_unfolded_outputs_on_real_frames(
    name: str, video: str, demo: DemoAssets, tmp_path: Path
) -> None:
    src = demo.packages[name]
    frames = video_frames(getattr(demo, video), 5, step=37 if video == "video" else 2)
    folded = verify_folder(fold_package(src.root, tmp_path / "folded"))
    spec = folded.manifest.input
    assert (spec.dtype, spec.layout, spec.color, spec.name) == ("uint8", "NHWC", "BGR", "pixels")
    assert spec.folded is not None and spec.folded.name == src.manifest.input.name
    assert spec.unfolded() == src.manifest.input
    assert (spec.height, spec.width, spec.batch) == (src.manifest.input.height, src.manifest.input.width, 4)
    # the daemon's own preprocessing each way: OpenCV's float normalisation against the graph's nodes
    compare_rows(outputs(folded, frames), outputs(src, frames), f"{name} folded", 1e-3, 1e-2)
    with OnnxRuntimeBackend(folded.model_path, threads=1) as backend:  # what a device checks at install
        check_io(folded, backend)
        assert golden_check(folded, backend) == f"golden check passed ({len(backend.outputs)} outputs)"
    # a quarter of the bytes to the engine per frame
    assert Preprocessor(src.manifest.input).new_row().nbytes == 4 * Preprocessor(spec).new_row().nbytes


def test_multibatch_package_folds_at_every_batch_and_keeps_its_golden_pair(demo: DemoAssets, tmp_path: Path) -> None:
    """`model init --batch 1,2 --image`: two model files and a float golden pair; the fold turns the pair's input
    back into its pixels, keeps its output, and checks both files against it (pack's check too)."""
    (tmp_path / "labels.txt").write_text("face\n")
    raw = demo.root / "raw"
    r = edged_cli("model", "init", str(raw / "face_detection_front_128x128_barracuda.onnx"), "--out",
                  str(tmp_path / "pkg"), "--batch", "1,2", "--labels", str(tmp_path / "labels.txt"),
                  "--image", str(raw / "grace_hopper.jpg"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    src = verify_folder(tmp_path / "pkg")
    assert src.manifest.golden is not None and list(src.batch_paths) == [1, 2]
    folded = verify_folder(fold_package(src.root, tmp_path / "folded", version=2))
    m = folded.manifest
    assert m.version == 2 and list(folded.batch_paths) == [1, 2] and m.input.shape == [2, 128, 128, 3]
    assert (
        m.golden is not None
        and (folded.root / m.golden.output).read_bytes() == (src.root / src.manifest.golden.output).read_bytes()
    )
    px = load_input(folded.root / m.golden.input)
    assert px.dtype == np.uint8 and np.allclose(
        normalise(px, src.manifest.input), load_input(src.root / src.manifest.golden.input), rtol=1e-5, atol=1e-5
    )
    assert check_folded(folded) is not None
    assert m.source["folded_from"]["ref"] == src.ref
    for path in folded.batch_paths.values():
        assert [i.name for i in onnx.load(str(path)).graph.input] == ["pixels"]
    r = edged_cli("model", "pack", str(folded.root), "--out", str(tmp_path / "p.tar"))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("export", [pytest.param("ddddocr-yolox", marks=pytest.mark.slow), "ultralytics-yolov8"])
def test_init_fold_yolo_exports_give_the_unfolded_outputs(export: str, demo: DemoAssets, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:  # fmt: skip
    """`edged model init --fold` on a YOLOX-style export as published (ddddocr: raw 0-255 BGR, NCHW: a Transpose
    and a Cast) and an Ultralytics-shaped YOLOv8 (RGB / 255, NCHW, batch 2): the folded package against an
    unfolded init of the same export on real frames, each through the daemon's own preprocessing."""
    (tmp_path / "labels.txt").write_text("text\n" if export.startswith("ddddocr") else "")
    if export.startswith("ddddocr"):
        model, args = request.getfixturevalue("ddddocr_det"), ["--labels", str(tmp_path / "labels.txt")]
    else:
        model, args = yolov8_export(tmp_path / "yolov8.onnx", ["person", "car"], imgsz=320), ["--batch", "2"]
    image = demo.root / "raw" / "page.png"
    made = {}
    for variant, fold in (("plain", []), ("folded", ["--fold"])):
        out = tmp_path / variant
        r = edged_cli("model", "init", str(model), "--out", str(out), *args, "--image", str(image), *fold)
        assert r.returncode == 0, r.stderr
        made[variant] = verify_folder(tmp_path / variant)
    assert "fold:" in r.stdout and not (tmp_path / "folded.partial").exists()
    spec = made["folded"].manifest.input
    assert spec.folded is not None and spec.unfolded() == made["plain"].manifest.input
    frames = video_frames(demo.documents, 3, step=3) + video_frames(demo.video, 3)
    compare_rows(outputs(made["folded"], frames), outputs(made["plain"], frames), export, 1e-3, 1e-2)


def wrong_mean(src: Package, good: Package, into: Path) -> Package:
    """`good` (src folded) with its graphs folded from src's with a wrong mean on green: the manifest still
    says the right one and every hash is right; only the values can tell."""
    spec = src.manifest.input
    bad = spec.model_copy(update={"mean": [spec.mean[0], spec.mean[1] + 8, spec.mean[2]]})
    shutil.copytree(good.root, into)
    for path in src.batch_paths.values():
        onnx.save(fold_graph(onnx.load(str(path)), bad), str(into / path.name))
    m = good.manifest
    write_package(into, m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True),
                  {name: into / name for name in m.files})  # fmt: skip
    return verify_folder(into)


def test_a_wrong_fold_is_refused_on_values(demo: DemoAssets, tmp_path: Path) -> None:
    src = demo.packages["blazeface-back"]
    good = verify_folder(fold_package(src.root, tmp_path / "good"))
    bad = wrong_mean(src, good, tmp_path / "bad")
    assert bad.manifest.model_copy(update={"files": good.manifest.files}) == good.manifest
    # fold_package's own check, as it runs on each model file it folds
    spec = src.manifest.input
    probe = np.stack([Preprocessor(good.manifest.input).new_row() * 0 + 90, *video_frames_pixels(good, demo)])
    with pytest.raises(PackageError, match="the folded model against the unfolded one") as info:
        check_fold(runner(src.model_path, spec.name), runner(bad.model_path, "pixels"), 4, spec, probe, 1e-3, 1e-2,
                   "wrong mean")  # fmt: skip
    assert info.value.code == Code.FOLD_MISMATCH
    check_fold(runner(src.model_path, spec.name), runner(good.model_path, "pixels"), 4, spec, probe, 1e-3, 1e-2, "ok")
    with pytest.raises(PackageError, match="golden pair") as info:  # pack's and verify's check
        check_folded(bad)
    assert info.value.code == Code.GOLDEN_MISMATCH
    r = edged_cli("model", "pack", str(bad.root), "--out", str(tmp_path / "bad.tar"))
    assert r.returncode == 1 and "golden" in r.stderr and not (tmp_path / "bad.tar").exists(), r.stderr
    with OnnxRuntimeBackend(bad.model_path, threads=1) as backend, pytest.raises(SwapError, match="golden check"):
        golden_check(bad, backend)  # what a device runs before it activates a version


def video_frames_pixels(pkg: Package, demo: DemoAssets) -> list[np.ndarray]:
    pre = Preprocessor(pkg.manifest.input)
    rows = []
    for frame in video_frames(demo.video, 3):
        row = pre.new_row()
        pre.run(frame, row)
        rows.append(row)
    return rows


def test_a_manifest_that_claims_a_fold_its_graph_lacks_is_refused(demo: DemoAssets, tmp_path: Path) -> None:
    good = verify_folder(fold_package(demo.packages["blazeface-front"].root, tmp_path / "good"))
    shutil.copytree(good.root, tmp_path / "bad")
    fields = good.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["input"]["folded"]["name"] = "not-in-the-graph"
    bad = write_package(tmp_path / "bad", fields, {n: tmp_path / "bad" / n for n in good.manifest.files})
    with pytest.raises(PackageError, match="no node computes the model's own input 'not-in-the-graph'"):
        check_package(bad)
    assert check_package(good) is not None


def test_manifest_records_the_fold_and_refuses_a_contradiction() -> None:
    base: dict[str, Any] = {"name": "x", "shape": [1, 3, 8, 8], "layout": "NCHW", "mean": [1, 2, 3], "std": [2, 2, 2]}
    spec = InputSpec.model_validate(base)
    f = folded_spec(spec)
    assert f.shape == [1, 8, 8, 3] and f.folded is not None and f.unfolded() == spec
    doc = f.model_dump(exclude_none=True)
    with pytest.raises(ValueError, match="a folded input takes uint8 BGR pixels"):
        InputSpec.model_validate({**doc, "dtype": "float32"})
    with pytest.raises(PackageError, match="folded already"):
        folded_spec(f)
    assert "folded" not in spec.model_dump(exclude_none=True)  # an unfolded manifest reads as it always did
    # a golden input that no pixels give is refused, naming the fix
    x = np.full((1, 3, 8, 8), 0.3, np.float32)
    with pytest.raises(PackageError, match="edged model golden"):
        pixels_of(x, spec)


def detections_by_frame(results: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    return {r["frame"]: r["detections"] for r in results}


def same_detections(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Same count, each box of `a` matched one to one in `b` within 0.1 px (the payload's rounding) per
    coordinate, the same label, the score within the golden tolerance (plus the payload's 4 decimals)."""
    if len(a) != len(b):
        return False
    left = list(b)
    for d in a:
        best = max(left, key=lambda e: iou(d["box"], e["box"]), default=None)
        if best is None or best["label"] != d["label"]:
            return False
        if max(abs(p - q) for p, q in zip(d["box"], best["box"], strict=True)) > 0.1 + 1e-6:
            return False
        if abs(d["score"] - best["score"]) > 1e-3 + 1e-2 * abs(best["score"]) + 1e-4:
            return False
        left.remove(best)
    return True


def start_video(broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp: Path, pkg: Path,
                video: Path, threshold: float) -> tuple[Any, Any]:  # fmt: skip
    sub = subscribe(broker, f"edged/{tmp.name}/#")
    cams = [{"name": "cam", "uri": f"file://{video}", "realtime": False}]
    doc = base_config(broker, demo, tmp, cams, device_id=tmp.name, detection={"score_threshold": threshold})
    doc["model"] = {"package": str(pkg), "onnxruntime": {"threads": 1}}
    return start_daemon(write_config(tmp / "c.yaml", doc)), sub


def some_frames(video: Path, n: int, step: int, out: Path) -> Path:
    """`n` frames of `video`, `step` apart, in a lossless FFV1 file: both daemons read the same pixels."""
    cap = cv2.VideoCapture(str(video))
    fps = cap.get(cv2.CAP_PROP_FPS) or 15
    writer = None
    for i in range(n * step):
        ok, frame = cap.read()
        assert ok
        if i % step:
            continue
        if writer is None:
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"FFV1"), fps, frame.shape[1::-1])
        writer.write(frame)
    cap.release()
    assert writer is not None
    writer.release()
    return out


def end_to_end(name: str, video: Path, frames: int, threshold: float, broker: Any, subscribe: Any,
               start_daemon: Any, demo: DemoAssets, tmp_path: Path) -> None:  # fmt: skip
    """`edged run` on the package and on its fold over the same frames: the same detections on every frame."""
    src = demo.packages[name]
    folded = fold_package(src.root, tmp_path / "folded-pkg")
    started = {}
    for label, pkg in (("unfolded", src.root), ("folded", folded)):  # side by side: one start's wait for both
        (tmp_path / label).mkdir()
        started[label] = start_video(broker, subscribe, start_daemon, demo, tmp_path / label, pkg, video, threshold)
    runs = {}
    for label, (d, sub) in started.items():
        assert d.proc.wait(300) == 0, d.output()[-3000:]
        sub.wait_stopped(10)
        runs[label] = detections_by_frame(sub.results())
    plain, fold = runs["unfolded"], runs["folded"]
    assert sorted(plain) == sorted(fold) == list(range(frames))
    found = sum(len(v) for v in plain.values())
    differ = [f for f in plain if not same_detections(plain[f], fold[f])]
    print(f"\n{name}: {found} detections over {len(plain)} frames unfolded; frames that differ folded: {differ}")
    assert found >= len(plain) // 3, "the video shows the model something to find"
    assert not differ, (differ[:3], [plain[f] for f in differ[:1]], [fold[f] for f in differ[:1]])


def test_edged_run_publishes_the_same_detections_folded_and_unfolded(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    video = some_frames(demo.video, 60, 5, tmp_path / "some.mkv")
    end_to_end("blazeface-back", video, 60, 0.7, broker, subscribe, start_daemon, demo, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "video", "threshold"), [("blazeface-back", "video", 0.7),
                                                          ("blazeface-front", "video", 0.5),
                                                          ("picodet-layout", "documents", 0.5)])  # fmt: skip
def test_edged_run_same_detections_folded_whole_demo_videos(
    name: str, video: str, threshold: float, broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    path = getattr(demo, video)
    truth = demo.ground_truth if video == "video" else demo.documents_truth
    frames = len(json.loads(truth.read_text())["frames"])
    end_to_end(name, path, frames, threshold, broker, subscribe, start_daemon, demo, tmp_path)
