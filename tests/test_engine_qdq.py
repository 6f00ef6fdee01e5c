"""`edged build-engine --calib FRAMES` from a float model: int8 through explicit quantization (Q/DQ) on every
TensorRT version, never TensorRT's calibrator.

TensorRT 10.1 deprecated `IBuilderConfig.int8_calibrator` and the calibrator classes ("superseded by explicit
quantization", no other setter), 10.12 deprecated the weak typing implicit int8 needs, 11 removed both; before
this, `--calib` set the calibrator (a DeprecationWarning from 10.1) and was refused from 10.12. Now edged's own
quantizer (the `tensorrt` target) runs on the frames through the daemon's preprocessing, the Q/DQ model is
checked against the float one on them (output values and detections), and the engines are built from it.

Real: the demo's BlazeFace front, the demo video, ONNX Runtime's quantizer and the simulated-quantization
runs. Stand-in: tensorrt/pycuda (tests/trt_standin, TRT_STANDIN_BUILD=1), which record what the builder was
asked (`BUILDS`: the ONNX file parsed, flags, whether a calibrator ran); nothing runs on an engine here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest

from edged.cli import main as cli_main
from edged.daemon.backends.tensorrt import api as trt_api
from edged.errors import QuantizeError
from edged.models.demo import DemoAssets
from edged.models.package import Package, open_package, sha256_file, write_package
from edged.models.rebatch import rebatch
from edged.quantize.engine import build_engine_package
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standins import standin_builds

FRAMES = 8  # two batches of the model's 4


@pytest.fixture
def building(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return standin_builds(monkeypatch)


@pytest.fixture(scope="module")
def front_1_4(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Package:
    """BlazeFace front (batch 4) carrying batch 1 too, as `edged model init --batch 1,4` makes it."""
    src = demo.packages["blazeface-front"]
    root = tmp_path_factory.mktemp("front") / "faces"
    root.mkdir()
    b1 = root / "model.b1.onnx"
    onnx.save(rebatch(onnx.load(str(src.model_path)), 1), str(b1))
    fields = src.manifest.model_dump(by_alias=True, exclude={"files", "golden"}, exclude_none=True)
    fields["extra_batches"] = [{"batch": 1, "file": "model.b1.onnx"}]
    files = {"model.onnx": src.model_path, "model.b1.onnx": b1, "labels.txt": src.root / "labels.txt"}
    return write_package(root, fields, files)


def is_qdq(path: Path) -> bool:
    return any(n.op_type == "QuantizeLinear" for n in onnx.load(str(path)).graph.node)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("version", ["10.3.0", "10.12.0"])
def test_calib_builds_int8_from_a_checked_qdq_model(
    version: str,
    demo: DemoAssets,
    front_1_4: Package,
    tmp_path: Path,
    building: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TRT_STANDIN_VERSION", version)
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger=trt_api.__name__):
        pkg = build_engine_package(front_1_4.root, tmp_path / "int8", calib=demo.video, calib_frames=FRAMES,
                                   progress=said.append)  # fmt: skip
    # no calibrator anywhere: TensorRT parsed Q/DQ models, one per batch, the largest first
    assert [b["calibration"] for b in building] == [None, None]
    assert [Path(b["onnx"]).name for b in building] == ["model.onnx", "model.b1.onnx"]
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
    strongly_typed = version == "10.12.0"
    flags = {tuple(b["flags"]) for b in building}
    if strongly_typed:  # the precision is the model's: no flags, the STRONGLY_TYPED network
        assert flags == {()}
        assert {b["network_flags"] for b in building} == {1 << standin_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED}
    else:  # weakly typed: int8 (and fp16 for the layers outside Q/DQ pairs), as for any Q/DQ model
        assert flags == {(standin_trt.BuilderFlag.FP16, standin_trt.BuilderFlag.INT8)}
    # the package carries the Q/DQ models the engines were built from (their hashes are the manifest's)
    m = pkg.manifest
    assert m.precision == "int8" and m.batch_files == {1: "model.b1.engine", 4: "model.engine"}
    assert is_qdq(pkg.root / "model.onnx") and is_qdq(pkg.root / "model.b1.onnx")
    assert m.source["onnx_sha256"] == sha256_file(pkg.root / "model.onnx")
    assert [e["onnx_sha256"] for e in m.source["engines"]] == [
        sha256_file(pkg.root / "model.b1.onnx"),
        sha256_file(pkg.root / "model.onnx"),
    ]
    # how the int8 came about, and its check against the float model on the calibration frames
    int8 = m.source["int8"]
    assert int8["method"] == "qdq" and int8["frames"] == FRAMES
    assert int8["float_model_sha256"] == sha256_file(front_1_4.model_path)
    check = int8["check"]
    assert check["recall_vs_float"] >= 0.9 and check["precision_vs_float"] >= 0.9
    assert set(check["outputs"]) == {o.name for o in onnx.load(str(front_1_4.model_path)).graph.output}
    assert any(s.startswith("the Q/DQ model against the float model, outputs: ") for s in said), said
    assert any(s.startswith("calibrating: 2/2 batches") for s in said), said
    # the batch-1 model is the batch-4 one rebatched, checked row for row
    assert any(s.startswith("batch 1: model.b1.onnx (the quantized model rebatched") for s in said), said


def test_a_qdq_model_that_cannot_be_checked_is_refused(
    demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]]
) -> None:
    """Frames on which the float model finds nothing cannot show the int8 model keeps anything: refused before
    a search or a build, with the reason."""
    blank = tmp_path / "blank"
    blank.mkdir()
    for i in range(4):
        cv2.imwrite(str(blank / f"{i}.png"), np.full((240, 320, 3), 40 * i, np.uint8))
    with pytest.raises(QuantizeError, match=r"the float model detects nothing on the 4 calibration frames"):
        build_engine_package(demo.packages["blazeface-front"].root, tmp_path / "out", calib=blank)
    assert building == []


def test_calib_with_a_model_or_precision_it_cannot_serve_is_named(
    demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    front = demo.packages["blazeface-front"].root
    with pytest.raises(QuantizeError, match=r"--calib builds an int8 engine; drop it or --precision fp16"):
        build_engine_package(front, tmp_path / "a", precision="fp16", calib=demo.video)
    with pytest.raises(QuantizeError, match=r"needs its scales: --calib FRAMES"):
        build_engine_package(front, tmp_path / "b", precision="int8")
    qdq = tmp_path / "qdq"
    fields = open_package(front).manifest.model_dump(by_alias=True, exclude={"files", "golden"}, exclude_none=True)
    fields["precision"] = "int8"
    write_package(qdq, fields, {"model.onnx": front / "model.onnx", "labels.txt": front / "labels.txt"})
    with pytest.raises(QuantizeError, match=r"already int8 \(Q/DQ\).*drop --calib"):
        build_engine_package(qdq, tmp_path / "c", calib=demo.video)
    assert building == []
    # the CLI's help says what --calib is (not trtexec's cache file)
    with pytest.raises(SystemExit):
        cli_main(["build-engine", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "not trtexec's --calib, which reads a calibration cache" in help_text
