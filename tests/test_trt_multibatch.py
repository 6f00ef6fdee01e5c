"""TensorRT with several fixed batches (issue 18): one engine per batch, opened as one `BatchSet`.

`edged build-engine` on a package carrying batches 1, 2 and 4 builds model.b1.engine, model.b2.engine and
model.engine (listed in the engine package's `extra_batches`), each with one fixed profile and the same
precision and builder flags; the loader opens them as a BatchSet of TensorRT backends, closing every engine
it opened when one fails; `model.build_on_device` builds and caches one engine per batch.

No GPU here: the stand-in tensorrt/pycuda (tests/trt_standin, TRT_STANDIN_BUILD=1) record what the builder
was asked (`BUILDS`) and write a placeholder plan that names its input's shape, so the engine deserialized
from it reports the batch it was built at. Nothing runs on an engine; tests/test_tensorrt.py (gpu-check)
runs real engines on a GPU, tests/test_tensorrt_api.py checks every call against the real bindings.
"""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edged.cli import main as cli_main
from edged.daemon import backends
from edged.daemon.backends.base import BatchSet, fixed_batches
from edged.daemon.backends.tensorrt import TensorRTBackend
from edged.daemon.config import load_config
from edged.daemon.lifecycle import loader
from edged.daemon.lifecycle.manager import check_io, estimate_mb
from edged.errors import EngineLoadError, QuantizeError
from edged.models import compat
from edged.models.compat import DeviceFacts
from edged.models.demo import DemoAssets
from edged.models.package import Package, open_package, write_package
from edged.models.rebatch import rebatch
from edged.models.signing import generate_key
from edged.quantize.engine import build_engine_package
from tests.conftest import base_config, write_config
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standin.pycuda import driver as standin_cuda
from tests.trt_standins import standin_builds

SHAPE = (256, 256, 3)  # BlazeFace back's input row


class Nowhere:
    host, port = "127.0.0.1", 1


@pytest.fixture
def building_tensorrt(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`import tensorrt` / `pycuda.driver` get the stand-ins, whose builder builds; returns what it was asked."""
    return standin_builds(monkeypatch)


@pytest.fixture(scope="module")
def multi(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Package:
    """The demo's BlazeFace (batch 4) with the same model rebatched to 1 and 2, and a golden pair."""
    src = demo.packages["blazeface-back"]
    root = tmp_path_factory.mktemp("trt-multi") / "faces"
    root.mkdir()
    files = {"model.onnx": src.model_path, "labels.txt": src.root / "labels.txt"}
    for b in (1, 2):
        files[f"model.b{b}.onnx"] = root / f"model.b{b}.onnx"
        onnx.save(rebatch(onnx.load(str(src.model_path)), b), str(files[f"model.b{b}.onnx"]))
    np.save(root / "golden_input.npy", np.zeros((4, *SHAPE), np.float32))
    np.savez(root / "golden_output.npz", out=np.zeros(1, np.float32))
    files |= {"golden_input.npy": root / "golden_input.npy", "golden_output.npz": root / "golden_output.npz"}
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields.update(
        name="faces",
        extra_batches=[{"batch": 1, "file": "model.b1.onnx"}, {"batch": 2, "file": "model.b2.onnx"}],
        golden={"input": "golden_input.npy", "output": "golden_output.npz"},
    )
    return write_package(root, fields, files)


def asked(builds: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    """Each build's ONNX file name and its profile's (min = opt = max) input shape, in build order."""
    out = []
    for b in builds:
        ((shapes,),) = [list(p.values()) for p in b["profiles"]]
        assert shapes[0] == shapes[1] == shapes[2], f"a fixed profile is min = opt = max: {shapes}"
        out.append((Path(b["onnx"]).name, shapes[1]))
    return out


def test_build_engine_builds_one_engine_per_batch(
    multi: Package,
    demo: DemoAssets,
    tmp_path: Path,
    building_tensorrt: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    pkg = build_engine_package(multi.root, tmp_path / "trt", precision="fp16", progress=said.append)
    # the largest first, each from its own ONNX file, one fixed profile at its batch
    assert asked(building_tensorrt) == [
        ("model.onnx", (4, *SHAPE)),
        ("model.b2.onnx", (2, *SHAPE)),
        ("model.b1.onnx", (1, *SHAPE)),
    ]
    # the same precision and network flags for every batch (10.3: weakly typed, fp16 asked by a flag)
    assert {tuple(b["flags"]) for b in building_tensorrt} == {(standin_trt.BuilderFlag.FP16,)}
    assert len({b["network_flags"] for b in building_tensorrt}) == 1
    assert [s for s in said if s.startswith("batch ")] == [
        "batch 4 (1 of 3): model.engine from model.onnx",
        "batch 2 (2 of 3): model.b2.engine from model.b2.onnx",
        "batch 1 (3 of 3): model.b1.engine from model.b1.onnx",
    ]
    m = pkg.manifest
    assert m.kind == "engine" and m.precision == "fp16" and m.input.shape == [4, *SHAPE]
    assert m.batch_files == {1: "model.b1.engine", 2: "model.b2.engine", 4: "model.engine"}
    assert set(m.files) == {
        "model.engine", "model.b1.engine", "model.b2.engine", "model.onnx", "model.b1.onnx", "model.b2.onnx",
        "labels.txt",
    }  # fmt: skip
    assert m.golden is None  # the golden pair is the float model's output, not an fp16 engine's
    engines = m.source["engines"]
    assert [e["batch"] for e in engines] == [1, 2, 4]
    # the memory budget counts every engine
    assert m.compatibility["device_memory_bytes"] == sum(e["device_memory_bytes"] for e in engines) > 0
    assert m.compatibility["batch"] == 4
    for b, name in m.batch_files.items():  # each plan is the one built at its batch
        plan = (pkg.root / name).read_bytes()
        assert json.loads(plan[len(standin_trt.PLAN_MAGIC) :]) == ["input:0", [b, *SHAPE]]
    # it packs, signed, and `edged model verify` runs a device's checks on it (this "device": the stand-in's
    # TensorRT 10.3 and compute capability 8.7, as the engines were built)
    facts = DeviceFacts(platform.machine(), tensorrt="10.3.0", compute_capability="8.7")
    monkeypatch.setattr(compat, "detect", lambda: facts)
    key, pub = generate_key(tmp_path / "keys")
    (tmp_path / "trusted").mkdir()
    shutil.copy(pub, tmp_path / "trusted" / pub.name)
    tar = tmp_path / "faces-trt.tar"
    assert cli_main(["model", "pack", str(pkg.root), "--out", str(tar), "--key", str(key)]) == 0
    cfg = engine_config(tmp_path, demo, pkg.root, keys_dir=str(tmp_path / "trusted"))
    assert cli_main(["model", "verify", str(tar), "-c", str(cfg)]) == 0
    assert "faces@1 signed by" in capsys.readouterr().out
    assert open_package(tar, scratch=tmp_path).manifest.batch_files == m.batch_files


@pytest.mark.usefixtures("building_tensorrt")
def test_a_single_batch_source_with_a_golden_pair_builds(multi: Package, tmp_path: Path) -> None:
    """`edged model golden` then `edged build-engine` (docs/byom.md's steps 3 and 4) failed on the manifest: the
    golden files were listed but not carried. The pair is the ONNX model's, not the engine's: not carried."""
    fields = {k: v for k, v in json.loads(multi.manifest_bytes).items() if k not in ("files", "extra_batches")}
    names = ("model.onnx", "labels.txt", "golden_input.npy", "golden_output.npz")
    single = write_package(tmp_path / "single", fields, {n: multi.root / n for n in names})
    pkg = build_engine_package(single.root, tmp_path / "b4")
    assert pkg.manifest.golden is None and pkg.manifest.batch_files == {4: "model.engine"}
    assert b"extra_batches" not in pkg.manifest_bytes and "engines" not in pkg.manifest.source  # as before


def test_build_engine_batch_subset_and_strongly_typed(
    multi: Package,
    tmp_path: Path,
    building_tensorrt: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(standin_trt, "__version__", "11.4.0", raising=False)
    monkeypatch.setattr(backends, "tensorrt_unavailable_reason", lambda: None)  # no /dev/nvidia0 here
    assert cli_main(["build-engine", str(multi.root), "--out", str(tmp_path / "b14"), "--batch", "1,4"]) == 0
    out, err = capsys.readouterr()
    assert "build-engine: batch 1 (2 of 2): model.b1.engine from model.b1.onnx" in err
    assert "(fp32, batch 1,4, TensorRT 11.4.0" in out
    pkg = open_package(tmp_path / "b14")
    assert asked(building_tensorrt) == [("model.onnx", (4, *SHAPE)), ("model.b1.onnx", (1, *SHAPE))]
    # TensorRT 11: every batch built at the model's own precision, strongly typed, no precision flags
    assert pkg.manifest.precision == "fp32" and {tuple(b["flags"]) for b in building_tensorrt} == {()}
    assert pkg.manifest.batch_files == {1: "model.b1.engine", 4: "model.engine"}
    building_tensorrt.clear()
    # a subset without the largest: its own largest is the package's batch
    small = build_engine_package(multi.root, tmp_path / "b12", batches=(1, 2))
    assert asked(building_tensorrt) == [("model.b2.onnx", (2, *SHAPE)), ("model.b1.onnx", (1, *SHAPE))]
    assert small.manifest.input.shape == [2, *SHAPE] and small.manifest.batch_files == {
        1: "model.b1.engine",
        2: "model.engine",
    }
    assert small.manifest.compatibility["batch"] == 2
    assert (small.root / "model.onnx").read_bytes() == (multi.root / "model.b2.onnx").read_bytes()
    with pytest.raises(QuantizeError, match=r"carries batches \[1, 2, 4\], not \[3\]"):
        build_engine_package(multi.root, tmp_path / "b3", batches=(1, 3))


def engine_config(tmp_path: Path, demo: DemoAssets, package: Path, **model: Any) -> Path:
    doc = base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://?fps=5"}])
    doc["model"].update(package=str(package), **model)
    return write_config(tmp_path / "edged.yaml", doc)


def test_the_loader_opens_an_engine_package_per_batch(
    multi: Package, demo: DemoAssets, tmp_path: Path, building_tensorrt: list[dict[str, Any]]
) -> None:
    pkg = build_engine_package(multi.root, tmp_path / "trt", precision="fp16")
    cfg = load_config(engine_config(tmp_path, demo, pkg.root))
    backend = loader.open_package_backend(cfg, pkg)  # refused before: "opens one engine per package today"
    try:
        assert isinstance(backend, BatchSet) and fixed_batches(backend, 4) == (1, 2, 4)
        for b in (1, 2, 4):
            member = backend.member(b)
            assert isinstance(member, TensorRTBackend) and member.inputs[0].shape == (b, *SHAPE)
        check_io(pkg, backend)  # every member's input against the manifest at its batch
        assert backend.memory_bytes == sum(backend.member(b).memory_bytes for b in (1, 2, 4))
        # admission counts the three engines' device memory, as recorded, and an input batch of each
        row = int(np.prod(SHAPE)) * 4
        want = pkg.manifest.compatibility["device_memory_bytes"] + (1 + 2 + 4) * row
        assert estimate_mb(pkg) == pytest.approx(want / 2**20)
    finally:
        backend.close()


def test_one_engine_that_fails_closes_those_opened(
    multi: Package,
    demo: DemoAssets,
    tmp_path: Path,
    building_tensorrt: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pkg = build_engine_package(multi.root, tmp_path / "trt", precision="fp16")
    cfg = load_config(engine_config(tmp_path, demo, pkg.root))
    monkeypatch.setattr(standin_cuda, "STATE", standin_cuda.State())  # what was retained and not released
    real = standin_trt.Runtime.deserialize_cuda_engine

    def corrupt_largest(self: Any, plan: bytes) -> Any:
        if b"[4," in plan:  # the batch-4 engine, opened last
            self._logger.log(standin_trt.ILogger.Severity.ERROR, "Serialization assertion failed")
            return None
        return real(self, plan)

    monkeypatch.setattr(standin_trt.Runtime, "deserialize_cuda_engine", corrupt_largest)
    with pytest.raises(EngineLoadError, match=r"model\.engine: TensorRT cannot deserialize it"):
        loader.open_package_backend(cfg, pkg)
    # batches 1 and 2 opened, then batch 4 failed: all three released the context they retained
    calls = [name for name, _ in standin_cuda.STATE.calls]
    assert calls.count("cuDevicePrimaryCtxRetain") == 3 and standin_cuda.STATE.retained == 0


def test_build_on_device_builds_and_caches_one_engine_per_batch(
    multi: Package,
    demo: DemoAssets,
    tmp_path: Path,
    building_tensorrt: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load_config(engine_config(tmp_path, demo, multi.root, build_on_device=True))
    backend = loader.open_package_backend(cfg, multi)
    try:
        assert asked(building_tensorrt) == [
            ("model.onnx", (4, *SHAPE)),
            ("model.b2.onnx", (2, *SHAPE)),
            ("model.b1.onnx", (1, *SHAPE)),
        ]
        assert {tuple(b["flags"]) for b in building_tensorrt} == {(standin_trt.BuilderFlag.FP16,)}
        assert isinstance(backend, BatchSet) and backend.batches == (1, 2, 4)
        check_io(multi, backend)
    finally:
        backend.close()
    cached = sorted(p.name.rsplit("-", 1)[1] for p in (cfg.state_dir / "engines").iterdir())
    assert cached == ["b1.engine", "b2.engine", "b4.engine"]  # one key per batch, no .partial left
    assert "padded" not in caplog.text and "largest batch" not in caplog.text
    # a second start builds nothing: each batch's engine comes from the cache
    building_tensorrt.clear()
    loader.open_package_backend(cfg, multi).close()
    assert building_tensorrt == []
