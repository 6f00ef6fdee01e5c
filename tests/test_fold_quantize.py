"""`edged quantize --fold`: the preprocessing folded into the float model before it is quantized, so the INT8
package takes uint8 pixels; calibration and the gate feed the folded graph uint8 rows.

Real: the demo's BlazeFace front, the demo video, ONNX Runtime's quantizer, the
daemon's preprocessing and decoders. Judged on values and detections: the fold check's numbers against the
unfolded float model, the folded INT8 model's detections against the unfolded INT8 model's within the gate,
and the folded INT8 model's graph (its preprocessing in float, the first Q/DQ pair where the unfolded model's
input had it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edged.daemon.decoders import DecodeOptions
from edged.models.demo import DemoAssets
from edged.models.fold import fold_package, normalise, runner
from edged.models.package import Package, verify_folder
from edged.quantize.frames import read_frames
from edged.quantize.report import Gate, compare, match, run_model
from edged.quantize.tool import Outcome, quantize
from tests.conftest import edged_cli
from tests.test_fold import detections_by_frame, some_frames, start_video

CALIB, EVAL = 16, 24


def _quantize(src: Path, calib: Path, out: Path, fold: bool = False, target: str = "cpu") -> Outcome:
    outcome = quantize(src, calib, calib, out, fold=fold, calib_frames=CALIB, eval_frames=EVAL, target=target)  # type: ignore[arg-type]
    assert outcome.package is not None, outcome.report.format()
    return outcome


def _first_compute_input(model: onnx.ModelProto) -> list[str]:
    """The op types from the graph input up to the first Conv, following the first input of each node."""
    consumers = {i: n for n in model.graph.node for i in n.input[:1]}
    x, ops = model.graph.input[0].name, []
    while x in consumers and consumers[x].op_type != "Conv":
        ops.append(consumers[x].op_type)
        x = consumers[x].output[0]
    return ops


def _same_detections(unfolded: Package, folded: Package, demo: DemoAssets, target: str = "cpu") -> None:
    """The folded INT8 model's detections against the unfolded INT8 model's on the evaluation frames: within
    the accuracy gate (the quantizations differ only in where their scales came from), and its raw outputs
    close to the unfolded one's on the same pixels."""
    frames = read_frames(demo.video, EVAL)
    opts = DecodeOptions(score_threshold=0.5)
    sim = target == "tensorrt"
    want = run_model(unfolded.model_path, unfolded.manifest, frames, opts, 1, simulate=sim, keep_outputs=True)
    got = run_model(folded.model_path, folded.manifest, frames, opts, 1, simulate=sim, keep_outputs=True)
    report = compare(frames, want, got, Gate())
    assert report, report.format()
    assert report.float_detections > 0 and report.recall_vs_float >= 0.9 and report.mean_iou >= 0.8


def test_quantize_fold_blazeface_takes_uint8_and_keeps_the_unfolded_int8_detections(
    demo: DemoAssets, tmp_path: Path
) -> None:
    src = demo.packages["blazeface-front"]
    plain = _quantize(src.root, demo.video, tmp_path / "int8").package
    r = edged_cli(
        "quantize", str(src.root), "--calib", str(demo.video), "--eval", str(demo.video), "--out",
        str(tmp_path / "folded"), "--fold", "--calib-frames", str(CALIB), "--eval-frames", str(EVAL),
        "--report", str(tmp_path / "report.json"), timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert plain is not None
    folded = verify_folder(tmp_path / "folded")
    m = folded.manifest
    # the package takes uint8 BGR pixels at the model's size; the model's own input is recorded
    assert m.precision == "int8" and m.input.dtype == "uint8" and m.input.layout == "NHWC" and m.input.color == "BGR"
    assert m.input.shape == [4, 128, 128, 3] and m.input.folded is not None
    assert m.input.folded.name == src.manifest.input.name and m.input.folded.mean == src.manifest.input.mean
    model = onnx.load(str(folded.model_path))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    # the fold was checked against the unfolded float model and its numbers reported
    fold = m.source["quantize"]["fold"]
    assert fold["checked_against"] == "the unfolded float model" and fold["rows"] >= CALIB // 2
    assert set(fold["max_abs_diff"]) == {o.name for o in model.graph.output}
    assert max(fold["max_abs_diff"].values()) <= fold["atol"]
    assert "quantize: folded: takes uint8 pixels [4, 128, 128, 3]" in r.stdout
    assert "fold: the folded float model gives the unfolded one's outputs" in r.stderr
    # the gate passed against the unfolded float model, its report written
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] and report["recall_vs_float"] >= 0.9, report
    # the preprocessing stayed float: from the pixels, the fold's ops as in the folded float model, any Q/DQ
    # pair only after them (where the unfolded model's input had it, unless the search kept that layer float)
    _fold_prefix_is_float(model, src.manifest.input.name)
    # folded INT8 against unfolded INT8: the same detections within the gate
    _same_detections(plain, folded, demo)
    # and on values, both INT8 models on the same pixels (the folded one's, the unfolded one's preprocessing)
    px = np.stack([row for row in _rows(folded, demo)])
    a = runner(folded.model_path, m.input.name)(px)
    b = runner(plain.model_path, plain.manifest.input.name)(normalise(px, plain.manifest.input))
    for name in a:
        scale = float(np.abs(b[name]).max())
        assert float(np.abs(a[name] - b[name]).max()) <= 0.1 * scale, name


def _fold_prefix_is_float(model: onnx.ModelProto, own_input: str) -> None:
    ops = _first_compute_input(model)
    plain = [o for o in ops if o not in ("QuantizeLinear", "DequantizeLinear")]
    assert plain[:4] == ["Transpose", "Gather", "Transpose", "Cast"] and "Mul" in plain and "Add" in plain, ops
    last_fold = ops.index("Add")  # the mean/std arithmetic, the fold's last float op before its Reshape
    assert "QuantizeLinear" not in ops[:last_fold] and "DequantizeLinear" not in ops[:last_fold], ops
    assert own_input in {o for n in model.graph.node for o in n.output}  # the model's own input, still a tensor


def _rows(pkg: Package, demo: DemoAssets) -> list[np.ndarray]:
    from edged.daemon.capture.preprocess import Preprocessor

    pre = Preprocessor(pkg.manifest.input)
    rows = []
    for f in read_frames(demo.video, pkg.manifest.input.batch):
        row = pre.new_row()
        pre.run(f.image, row)
        rows.append(row)
    return rows


def test_quantizing_a_folded_package_calibrates_on_uint8_rows(demo: DemoAssets, tmp_path: Path) -> None:
    """A package folded by `edged model fold` quantizes as it is (no flag): the package stays folded, its
    preprocessing float, the gate against the folded float model passes; --fold on it is a no-op, said so."""
    src = demo.packages["blazeface-front"]
    folded_float = verify_folder(fold_package(src.root, tmp_path / "ff"))
    said: list[str] = []
    outcome = quantize(folded_float.root, demo.video, demo.video, tmp_path / "q", fold=True, calib_frames=CALIB,
                       eval_frames=EVAL, progress=said.append, target="tensorrt")  # fmt: skip
    assert outcome.package is not None and outcome.report, outcome.report.format()
    m = outcome.package.manifest
    assert m.input == folded_float.manifest.input and m.compatibility["quantized_for"] == "tensorrt"
    assert "fold" not in m.source["quantize"]  # nothing folded here
    assert any("folded already" in s for s in said), said
    assert any(s.startswith("keeping the folded preprocessing (") for s in said), said
    _fold_prefix_is_float(onnx.load(str(outcome.package.model_path)), src.manifest.input.name)
    # against the tensorrt-target INT8 of the unfolded package: the same detections within the gate
    plain = _quantize(src.root, demo.video, tmp_path / "plain", target="tensorrt").package
    assert plain is not None
    _same_detections(plain, outcome.package, demo, target="tensorrt")


def test_fold_a_bare_onnx_with_its_spec_fp16(demo: DemoAssets, tmp_path: Path) -> None:
    """An .onnx file with --spec (no package folder) folds too: laid out as a package, folded, checked."""
    src = demo.packages["blazeface-front"]
    bare = tmp_path / "face.onnx"
    bare.write_bytes(src.model_path.read_bytes())
    (tmp_path / "spec.json").write_bytes((src.root / "manifest.json").read_bytes())
    out = tmp_path / "out"
    r = edged_cli(
        "quantize", str(bare), "--spec", str(tmp_path / "spec.json"), "--precision", "fp16", "--eval", str(demo.video),
        "--eval-frames", "8", "--out", str(out), "--fold", timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    pkg = verify_folder(out)
    assert pkg.manifest.precision == "fp16" and pkg.manifest.input.dtype == "uint8"
    assert pkg.manifest.input.folded is not None and pkg.manifest.source["quantize"]["fold"]["rows"] >= 2
    px = np.random.default_rng(5).integers(0, 256, pkg.manifest.input.shape, dtype=np.uint8)
    got = runner(pkg.model_path, "pixels")(px)  # float16 inside, its outputs the float model's within fp16 noise
    want = runner(src.model_path, src.manifest.input.name)(normalise(px, src.manifest.input))
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=0.02, atol=0.02 * float(np.abs(ref).max()))


@pytest.mark.slow  # two quantizations and two daemons: 2-3 min on the shared machine (the values: tests above)
def test_edged_run_on_the_folded_int8_package_agrees_with_the_unfolded_int8(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """The daemon runs the `quantize --fold` package (its camera side letterboxes uint8 rows, nothing more) and
    publishes the detections the unfolded INT8 package's daemon publishes on the same frames, within the gate."""
    src = demo.packages["blazeface-front"]
    plain = _quantize(src.root, demo.video, tmp_path / "int8").package
    folded = _quantize(src.root, demo.video, tmp_path / "int8-folded", fold=True).package
    assert plain is not None and folded is not None and folded.manifest.input.folded is not None
    video = some_frames(demo.video, 40, 5, tmp_path / "some.mkv")
    started = {}
    for label, pkg in (("unfolded", plain.root), ("folded", folded.root)):  # side by side: one wait for both
        (tmp_path / label).mkdir()
        started[label] = start_video(broker, subscribe, start_daemon, demo, tmp_path / label, pkg, video, 0.5)
    runs = {}
    for label, (d, sub) in started.items():
        assert d.proc.wait(300) == 0, d.output()[-3000:]
        sub.wait_stopped(10)
        results = sub.results()
        assert {r["model"]["version"] for r in results} == {2}
        runs[label] = detections_by_frame(results)
    assert sorted(runs["unfolded"]) == sorted(runs["folded"]) == list(range(40))
    a = [(d["label"], tuple(d["box"])) for f in range(40) for d in runs["unfolded"][f]]
    matched = sum(
        len(match([(d["label"], tuple(d["box"])) for d in runs["unfolded"][f]],
                  [(d["label"], tuple(d["box"])) for d in runs["folded"][f]]))
        for f in range(40)
    )  # fmt: skip
    b = sum(len(v) for v in runs["folded"].values())
    print(f"\nunfolded int8: {len(a)} detections, folded int8: {b}, matched {matched}")
    assert len(a) >= 10, "the frames show the model faces"
    assert matched >= 0.9 * len(a) and matched >= 0.9 * b
