"""A model at a fixed batch B computes, per image, what the batch-1 original does: the demo models (bit for
bit), a graph shaped like a real Ultralytics export, and the value check that refuses a batch that does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.backends.base import BatchSet
from edged.daemon.lifecycle.admission import batches_check
from edged.errors import Code, PackageError, SwapError
from edged.models.batchcheck import Run, check_batches
from edged.models.demo import DemoAssets
from edged.models.package import write_package
from edged.models.rebatch import rebatch

from .conftest import base_config, edged_cli, write_config
from .ultralytics_export import yolov8_export


@pytest.mark.parametrize(
    ("package", "original"),
    [("blazeface-back", "face_detection_back_256x256_barracuda.onnx"), ("picodet-layout", "layout_cdla.onnx")],
)
def test_rebatched_rows_are_bit_identical(demo: DemoAssets, package: str, original: str, tmp_path: Path) -> None:
    """Rebatched here from the raw export by today's code (the demo cache may hold packages an older edged
    built), and as the demo package has it."""
    pkg = demo.packages[package]
    onnx.save(rebatch(onnx.load(str(demo.root / "raw" / original)), pkg.manifest.input.batch), str(tmp_path / "b.onnx"))
    fresh = OnnxRuntimeBackend(tmp_path / "b.onnx", threads=1)
    batched = OnnxRuntimeBackend(pkg.model_path, threads=1)
    single = OnnxRuntimeBackend(demo.root / "raw" / original, threads=1)
    spec = pkg.manifest.input
    assert single.inputs[0].shape[0] == 1 and batched.inputs[0].shape[0] == spec.batch > 1
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, spec.shape).astype(np.float32)
    out_b, out_f = batched.infer({spec.name: x}), fresh.infer({spec.name: x})
    for row in range(spec.batch):
        out_1 = single.infer({spec.name: x[row : row + 1]})
        for name, value in out_1.items():
            assert np.array_equal(value[0], out_b[name][row]), f"{package} row {row} output {name}"
            assert np.array_equal(value[0], out_f[name][row]), f"{package} rebatched now: row {row} output {name}"


def test_rebatch_rejects_a_graph_it_cannot_fix() -> None:
    from onnx import TensorProto, helper

    # A Reshape to a constant [1, 12] cannot take batch 2 once the target starts with anything but 1.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [2, 6])
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x], [y], [shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(PackageError, match="does not take batch 4"):
        rebatch(m, 4)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        rebatch(onnx.ModelProto(), 0)


# --- a graph shaped like a real Ultralytics YOLOv8 export (tests/ultralytics_export.py) -----------------


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _old_rewrite(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """What edged before this check wrote: every Reshape whose constant target starts with 1 got 0, whether
    its first dimension was the batch or not (a package made by an older edged)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        target = consts.get(n.input[1]) if n.op_type == "Reshape" else None
        if target is not None and target.ndim == 1 and target.size and target[0] == 1:
            fixed = target.copy()
            fixed[0] = 0
            m.graph.initializer.append(numpy_helper.from_array(fixed, f"{n.output[0]}__old"))
            n.input[1] = f"{n.output[0]}__old"
    for t in [*m.graph.input, *m.graph.output]:
        t.type.tensor_type.shape.dim[0].dim_value = batch
    return m


@pytest.fixture(scope="module")
def yolov8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return yolov8_export(tmp_path_factory.mktemp("yolo") / "yolov8n.onnx", ["person", "car", "dog"], 320)


def test_rebatch_leaves_the_anchor_grid_of_an_ultralytics_export_alone(yolov8: Path) -> None:
    """The meshgrid's `[1, -1]` Reshape has the grid's x row as input, not the batch: rewritten, the grid of a
    square input is transposed and every box moves (by up to 312 px here) while every shape stays right."""
    source = onnx.load(str(yolov8))
    x = np.random.default_rng(5).uniform(0, 1, (4, 3, 320, 320)).astype(np.float32)
    want = np.concatenate([_session(source).run(None, {"images": x[i : i + 1]})[0] for i in range(4)])
    got = _session(rebatch(source, 4)).run(None, {"images": x})[0]
    assert got.shape == want.shape == (4, 7, 2100)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # the defect this guards against, for the record: the old rewrite is wrong on the boxes only
    old = _session(_old_rewrite(source, 4)).run(None, {"images": x})[0]
    assert np.abs(old[:, :4] - want[:, :4]).max() > 100 and np.abs(old[:, 4:] - want[:, 4:]).max() < 1e-4


def test_check_batches_refuses_a_batch_that_computes_other_boxes(yolov8: Path) -> None:
    source = onnx.load(str(yolov8))
    good, bad = _session(rebatch(source, 4)), _session(_old_rewrite(source, 4))
    ref = _session(source)

    def run(sess: ort.InferenceSession) -> Run:
        return lambda x: {"output0": sess.run(None, {"images": x})[0]}

    assert check_batches({4: run(good)}, (1, run(ref)), [1, 3, 320, 320], "float32") == [4]
    with pytest.raises(PackageError, match=r"at batch 4: output 'output0' differs .* by up to [1-9]\d\d") as exc:
        check_batches({4: run(bad)}, (1, run(ref)), [1, 3, 320, 320], "float32")
    assert exc.value.code == Code.BATCH_MISMATCH


def test_a_package_from_an_older_edged_with_a_wrong_batch_is_refused_by_pack_at_a_swap_and_at_start(
    yolov8: Path, tmp_path: Path, broker: Any, start_daemon: Any, demo: DemoAssets
) -> None:
    """A package an older edged wrote: model.onnx at batch 4 rewritten wrongly, model.b1.onnx right (batch 1
    needs no rewrite). `edged model pack`, a swap and a daemon's start refuse it."""
    source = onnx.load(str(yolov8))
    onnx.save(_old_rewrite(source, 4), str(tmp_path / "model.onnx"))
    onnx.save(source, str(tmp_path / "model.b1.onnx"))
    manifest = {
        "schema": "edged.model/1", "name": "yolo", "version": 1, "created": "2026-11-01T00:00:00Z", "kind": "onnx",
        "model_file": "model.onnx", "extra_batches": [{"batch": 1, "file": "model.b1.onnx"}], "labels_file": None,
        "labels": ["person", "car", "dog"],
        "input": {"name": "images", "shape": [4, 3, 320, 320], "dtype": "float32", "layout": "NCHW", "color": "RGB",
                  "scale": 1 / 255, "resize": "letterbox", "pad_value": 114},
        "decoder": {"type": "yolov8", "params": {}},
    }  # fmt: skip
    pkg = write_package(
        tmp_path / "pkg", manifest, {"model.onnx": tmp_path / "model.onnx", "model.b1.onnx": tmp_path / "model.b1.onnx"}
    )
    done = edged_cli("model", "pack", str(pkg.root), "--out", str(tmp_path / "pkg.tar"))
    assert done.returncode != 0 and not (tmp_path / "pkg.tar").exists(), done.stdout + done.stderr
    assert "yolo@1 at batch 4: output 'output0' differs from the reference" in done.stderr, done.stderr
    members = {b: OnnxRuntimeBackend(path, threads=1) for b, path in pkg.batch_paths.items()}
    with BatchSet(members) as backend, pytest.raises(SwapError, match="at batch 4: output 'output0'") as exc:
        batches_check(pkg, backend)
    assert exc.value.code == Code.BATCH_MISMATCH
    doc = base_config(broker, demo, tmp_path / "run", [{"name": "cam", "uri": f"file://{demo.video}"}])
    doc["model"]["package"] = str(pkg.root)
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(120) != 0, d.output()[-2000:]
    assert "yolo@1 at batch 4: output 'output0' differs from the reference" in d.output(), d.output()[-2000:]
    # the same package made right passes both
    onnx.save(rebatch(source, 4), str(tmp_path / "model.onnx"))
    pkg = write_package(
        tmp_path / "ok", manifest, {"model.onnx": tmp_path / "model.onnx", "model.b1.onnx": tmp_path / "model.b1.onnx"}
    )
    done = edged_cli("model", "pack", str(pkg.root), "--out", str(tmp_path / "ok.tar"))
    assert done.returncode == 0, done.stdout + done.stderr
    members = {b: OnnxRuntimeBackend(path, threads=1) for b, path in pkg.batch_paths.items()}
    with BatchSet(members) as backend:
        assert batches_check(pkg, backend) == "batches [1, 4] give row for row what batch 1 gives"
