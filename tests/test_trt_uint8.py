"""uint8 pixels into TensorRT: `edged build-engine --fold` and a folded package's engine.

TensorRT takes a uint8 network input only straight into a Cast (NVIDIA/TensorRT#3985); a folded graph moves the
bytes first (models/fold.py), so the builder gets a copy with the Cast in front (daemon/backends/tensorrt/
uint8.py). What the CPU allows is checked here: the rewritten graphs of the real demo models give the folded
graphs' outputs bit for bit (ONNX Runtime), a uint8 input TensorRT could not take is refused with the reason, and
`build-engine --fold` through the TensorRT stand-in (tests/trt_standin, TRT_STANDIN_BUILD=1) folds, checks,
and hands the builder the cast-first copy with the uint8 profile. The engine's own input binding is uint8 on a
real build: that needs TensorRT and a GPU (skipped here with the reason).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edged.daemon.backends import tensorrt_unavailable_reason
from edged.daemon.backends.tensorrt.uint8 import cast_first, uint8_inputs
from edged.errors import BackendError
from edged.models.demo import DemoAssets
from edged.models.fold import fold_graph, runner
from edged.models.package import verify_folder
from edged.quantize.engine import build_engine_package
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standins import standin_builds

REASON = tensorrt_unavailable_reason()


@pytest.mark.parametrize("name", ["blazeface-front", "blazeface-back", "picodet-layout"])
def test_cast_first_gives_the_folded_outputs_bit_for_bit(name: str, demo: DemoAssets, tmp_path: Path) -> None:
    pkg = demo.packages[name]
    spec = pkg.manifest.input
    folded = fold_graph(onnx.load(str(pkg.model_path)), spec)
    ready = cast_first(folded)
    assert ready is not None and uint8_inputs(ready) == ["pixels"]
    readers = [n for n in ready.graph.node if "pixels" in n.input]
    assert [n.op_type for n in readers] == ["Cast"]  # the uint8 input feeds a Cast and nothing else
    assert [a.i for a in readers[0].attribute if a.name == "to"] == [TensorProto.FLOAT]
    assert cast_first(ready) is None  # already as TensorRT takes it
    onnx.save(folded, str(tmp_path / "folded.onnx"))
    onnx.save(ready, str(tmp_path / "ready.onnx"))
    rng = np.random.default_rng(3)
    px = rng.integers(0, 256, (spec.batch, spec.height, spec.width, 3), dtype=np.uint8)
    want = runner(tmp_path / "folded.onnx", "pixels")(px)
    got = runner(tmp_path / "ready.onnx", "pixels")(px)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert any(float(np.abs(v).max()) > 0 for v in want.values())


def _graph(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_uint8_input_tensorrt_cannot_take_is_refused() -> None:
    k = helper.make_tensor("k", TensorProto.UINT8, [1], [1])
    adds = _graph([helper.make_node("Add", ["x", "k"], ["a"]), helper.make_node("Cast", ["a"], ["y"], to=1)], [k])
    with pytest.raises(BackendError, match=r"reaches a Add before any Cast to float"):
        cast_first(adds)
    two = _graph(
        [
            helper.make_node("Cast", ["x"], ["c"], to=1),
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
            helper.make_node("Cast", ["t"], ["u"], to=1),
            helper.make_node("Sum", ["c", "u"], ["y"]),
        ],
        [],
    )
    with pytest.raises(BackendError, match=r"read by 2 nodes"):
        cast_first(two)
    plain = _graph([helper.make_node("Cast", ["x"], ["y"], to=10)], [])
    assert cast_first(plain) is None  # straight into a Cast to float16: as it is


@pytest.fixture
def building(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return standin_builds(monkeypatch)


def test_build_engine_fold_hands_tensorrt_uint8_pixels_into_a_cast(
    demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[Path] = []
    parse = standin_trt.OnnxParser.parse_from_file

    def keep(self: Any, path: str) -> bool:  # the builder's temporary copy, kept to look at
        parsed.append(tmp_path / f"parsed{len(parsed)}.onnx")
        shutil.copyfile(path, parsed[-1])
        return parse(self, path)

    monkeypatch.setattr(standin_trt.OnnxParser, "parse_from_file", keep)
    src = demo.packages["blazeface-front"]
    said: list[str] = []
    pkg = build_engine_package(src.root, tmp_path / "engine", precision="fp16", fold=True, progress=said.append)
    m = pkg.manifest
    # the engine package takes uint8 pixels: its manifest is the folded one, the ONNX it carries folded
    assert m.kind == "engine" and m.input.dtype == "uint8" and m.input.shape == [4, 128, 128, 3]
    assert m.input.folded is not None and m.input.folded.name == src.manifest.input.name
    carried = onnx.load(str(pkg.root / "model.onnx"))
    assert uint8_inputs(carried) == ["pixels"]
    # the fold was checked against the unfolded model, its numbers recorded
    fold = m.source["fold"]
    assert fold["checked_against"] == "the unfolded float model" and max(fold["max_abs_diff"].values()) <= fold["atol"]
    assert any(s.startswith("fold: the folded float model gives the unfolded one's outputs") for s in said), said
    # TensorRT parsed the cast-first copy, the profile on the uint8 input at the model's size
    assert len(building) == 1 and building[0]["profiles"] == [{"pixels": ((4, 128, 128, 3),) * 3}]
    assert Path(building[0]["onnx"]).name == "model.uint8-cast-first.onnx"
    ready = onnx.load(str(parsed[0]))
    assert [n.op_type for n in ready.graph.node if "pixels" in n.input] == ["Cast"]
    assert any(s.startswith("pixels is uint8 pixels: the engine takes bytes") for s in said), said
    # an unfolded build parses the package's own ONNX, untouched
    build_engine_package(src.root, tmp_path / "plain", precision="fp16")
    assert Path(building[1]["onnx"]) == src.model_path
    assert building[1]["profiles"] == [{src.manifest.input.name: (tuple(src.manifest.input.shape),) * 3}]


def test_build_engine_fold_with_calib_calibrates_on_uint8_rows(
    demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]]
) -> None:
    """--fold --calib: the Q/DQ model is made from the folded float model on uint8 rows, its preprocessing in
    float, checked against the folded float model on the same rows; the engine is built from it."""
    said: list[str] = []
    pkg = build_engine_package(demo.packages["blazeface-front"].root, tmp_path / "int8", fold=True, calib=demo.video,
                               calib_frames=8, progress=said.append)  # fmt: skip
    m = pkg.manifest
    assert m.precision == "int8" and m.input.dtype == "uint8" and m.input.folded is not None
    qdq = onnx.load(str(pkg.root / "model.onnx"))
    assert uint8_inputs(qdq) == ["pixels"] and any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
    check = m.source["int8"]["check"]
    assert check["recall_vs_float"] >= 0.9 and check["precision_vs_float"] >= 0.9
    assert any(s.startswith("keeping the folded preprocessing (") for s in said), said
    assert Path(building[0]["onnx"]).name == "model.uint8-cast-first.onnx"
    assert verify_folder(pkg.root).manifest.source["fold"]["rows"] >= 8


@pytest.mark.skipif(REASON is not None, reason=f"needs TensorRT and a GPU: {REASON}")
def test_folded_engine_binding_is_uint8_and_matches_onnxruntime(demo: DemoAssets, tmp_path: Path) -> None:
    from edged.daemon.backends import OnnxRuntimeBackend, open_backend

    pkg = build_engine_package(demo.packages["blazeface-front"].root, tmp_path / "e", precision="fp32", fold=True)
    spec = pkg.manifest.input
    px = np.random.default_rng(0).integers(0, 256, spec.shape, dtype=np.uint8)
    with open_backend("engine", pkg.model_path, compatibility=pkg.manifest.compatibility) as trt_be:
        assert [t.dtype for t in trt_be.inputs] == ["uint8"]
        got = trt_be.infer({spec.name: px})
    with OnnxRuntimeBackend(pkg.root / "model.onnx", threads=1) as ort_be:
        want = ort_be.infer({spec.name: px})
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))


def test_the_backend_hands_a_uint8_binding_the_rows_as_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folded engine's input binding is uint8: the backend's pinned host buffer is uint8 (a quarter of the
    float32 one), the batch is copied to the device as it comes, no float conversion on the host, and a float
    batch is refused rather than truncated. The stand-in engine (tests/trt_standin) is told its input is uint8,
    as a real folded engine says through `get_tensor_dtype`."""
    import platform

    from edged.daemon.backends.tensorrt import TensorRTBackend
    from edged.daemon.backends.tensorrt.api import TrtModules
    from edged.daemon.backends.tensorrt.cuda import Pycuda
    from edged.errors import InferenceError
    from tests.trt_standin.pycuda import driver as standin_cuda

    shape = (4, 128, 128, 3)
    dtypes = {"pixels": "uint8", "output": "float32"}
    monkeypatch.setattr(standin_trt._Engine, "get_tensor_dtype", lambda self, name: dtypes[name])
    monkeypatch.setattr(standin_trt, "nptype", lambda d: np.dtype(d).type)
    copied: list[np.ndarray] = []
    monkeypatch.setattr(standin_cuda, "memcpy_htod_async", lambda dst, src, stream: copied.append(src.copy()))
    plan = tmp_path / "model.engine"
    plan.write_bytes(standin_trt.PLAN_MAGIC + f'["pixels", {list(shape)}]'.encode())
    compat = {"tensorrt": str(standin_trt.__version__), "platform": platform.machine()}
    px = np.random.default_rng(7).integers(0, 256, shape, dtype=np.uint8)
    with TensorRTBackend(plan, compat, modules=TrtModules(standin_trt, Pycuda(standin_cuda))) as be:
        assert [(t.name, t.dtype) for t in be.inputs] == [("pixels", "uint8")]
        be.infer({"pixels": px})
        assert len(copied) == 1 and copied[0].dtype == np.uint8 and copied[0].nbytes == px.size
        np.testing.assert_array_equal(copied[0], px)
        with pytest.raises(InferenceError):
            be.infer({"pixels": px.astype(np.float32)})


def test_build_engine_fold_at_every_batch(demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]]) -> None:
    """A package carrying batches 1 and 4: each is folded and checked, each engine takes uint8 pixels at its batch."""
    from edged.models.package import write_package
    from edged.models.rebatch import rebatch

    src = demo.packages["blazeface-front"]
    root = tmp_path / "faces"
    root.mkdir()
    onnx.save(rebatch(onnx.load(str(src.model_path)), 1), str(root / "model.b1.onnx"))
    fields = src.manifest.model_dump(by_alias=True, exclude={"files", "golden"}, exclude_none=True)
    fields["extra_batches"] = [{"batch": 1, "file": "model.b1.onnx"}]
    files = {"model.onnx": src.model_path, "model.b1.onnx": root / "model.b1.onnx"}
    files["labels.txt"] = src.root / "labels.txt"
    write_package(root, fields, files)
    pkg = build_engine_package(root, tmp_path / "engine", precision="fp16", fold=True)
    assert pkg.manifest.batch_files == {1: "model.b1.engine", 4: "model.engine"}
    assert [b["profiles"] for b in building] == [
        [{"pixels": ((4, 128, 128, 3),) * 3}],
        [{"pixels": ((1, 128, 128, 3),) * 3}],
    ]
    assert [Path(b["onnx"]).name for b in building] == ["model.uint8-cast-first.onnx", "model.b1.uint8-cast-first.onnx"]
    for name in ("model.onnx", "model.b1.onnx"):
        assert uint8_inputs(onnx.load(str(pkg.root / name))) == ["pixels"]
