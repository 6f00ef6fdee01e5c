"""TensorRT: engine builds, the backend against ONNX Runtime, the daemon on an engine package.

Needs tensorrt, pycuda and an NVIDIA GPU; elsewhere these skip with the reason, except the tests that
check how edged behaves *without* TensorRT. ``scripts/gpu-check.sh`` runs this file on a GPU machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edged.daemon.backends import OnnxRuntimeBackend, open_backend, tensorrt_unavailable_reason
from edged.errors import BackendError
from edged.models.demo import DemoAssets
from edged.models.package import verify_folder, write_package
from edged.quantize.frames import read_frames
from edged.quantize.int8 import calibration_batches
from tests.conftest import base_config, edged_cli, wait_until, write_config

REASON = tensorrt_unavailable_reason()
needs_trt = pytest.mark.skipif(REASON is not None, reason=f"needs TensorRT and a GPU: {REASON}")
# JetPack installs no mosquitto and the bundle carries none: scripts/gpu-check.sh runs offline without it
NO_MOSQUITTO = shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").is_file()
needs_mosquitto = pytest.mark.skipif(NO_MOSQUITTO, reason="no mosquitto here (apt-get install mosquitto)")


@pytest.mark.skipif(REASON is None, reason="TensorRT is present; this checks the message without it")
def test_without_tensorrt_build_engine_and_engine_packages_say_why(demo: DemoAssets, tmp_path: Path) -> None:
    r = edged_cli("build-engine", str(demo.packages["blazeface-back"].root), "--out", str(tmp_path / "e"))
    assert r.returncode == 1
    assert "tensorrt backend unavailable" in r.stderr and "NVIDIA GPU" in r.stderr
    assert not (tmp_path / "e").exists()
    # an engine package on such a machine: check-config names the reason, not a traceback
    src = demo.packages["blazeface-back"]
    fake_engine = tmp_path / "model.engine"
    fake_engine.write_bytes(b"not a plan")
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields.update(kind="engine", model_file="model.engine", labels_file=None, compatibility={"tensorrt": "10.3.0"})
    write_package(tmp_path / "pkg", fields, {"model.engine": fake_engine})
    with pytest.raises(BackendError, match="tensorrt backend unavailable"):
        open_backend("engine", tmp_path / "pkg" / "model.engine")


@pytest.fixture(scope="module")
def engine_pkg(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if REASON:
        pytest.skip(f"needs TensorRT and a GPU: {REASON}")
    out = tmp_path_factory.mktemp("trt") / "blazeface-fp16"
    r = edged_cli("build-engine", str(demo.packages["blazeface-back"].root), "--out", str(out), timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@needs_trt
def test_engine_package_records_what_it_needs(engine_pkg: Path) -> None:
    pkg = verify_folder(engine_pkg)
    c = pkg.manifest.compatibility
    assert pkg.manifest.kind == "engine" and pkg.manifest.precision == "fp16"
    assert c["tensorrt"] and c["compute_capability"] and c["batch"] == 4 and c["device_memory_bytes"] > 0
    assert "model.onnx" in pkg.manifest.files  # carried for rebuilds
    import tensorrt as trt

    plan = (engine_pkg / "model.engine").read_bytes()  # TensorRT's own bytes, nothing prepended
    assert trt.Runtime(trt.Logger()).deserialize_cuda_engine(plan) is not None


@needs_trt
def test_tensorrt_matches_onnxruntime_on_demo_frames(engine_pkg: Path, demo: DemoAssets) -> None:
    pkg = verify_folder(engine_pkg)
    spec = pkg.manifest.input
    batch = calibration_batches(spec, read_frames(demo.video, limit=spec.batch))[0]
    with open_backend("engine", pkg.model_path, compatibility=pkg.manifest.compatibility) as trt_be:
        got = trt_be.infer({spec.name: batch})
        again = trt_be.infer({spec.name: batch})
        assert trt_be.memory_bytes > 0
    with OnnxRuntimeBackend(engine_pkg / "model.onnx", threads=1) as ort_be:
        want = ort_be.infer({spec.name: batch})
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=0.05, atol=0.05 * float(np.abs(ref).max()))
        np.testing.assert_array_equal(got[name], again[name])


@needs_trt
def test_incompatible_engine_is_refused_before_deserializing(engine_pkg: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pkg"
    shutil.copytree(engine_pkg, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["compatibility"]["tensorrt"] = "8.5.2"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    from edged.errors import IncompatibleEngine

    with pytest.raises(IncompatibleEngine, match=r"built with TensorRT 8\.5\.2.*rebuild it on this device"):
        open_backend("engine", copy / "model.engine", compatibility=manifest["compatibility"], has_onnx=True)


@needs_trt
@needs_mosquitto
def test_daemon_runs_the_engine_package(
    engine_pkg: Path, demo: DemoAssets, broker, subscribe, start_daemon, tmp_path: Path
) -> None:
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "realtime": False}]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["model"] = {"package": str(engine_pkg), "backend": "auto"}
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(300) == 0, d.output()[-3000:]
    wait_until(lambda: len(sub.results()) == 300, 10, "300 results")
    assert sum(len(r["detections"]) for r in sub.results()) > 250


@pytest.mark.skipif(REASON is None, reason="TensorRT is present; this checks the message without it")
def test_build_on_device_without_tensorrt_fails_start_with_the_reason(
    broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    cams = [{"name": "lobby", "uri": f"file://{demo.video}", "realtime": False}]
    doc = base_config(broker, demo, tmp_path, cams)
    doc["model"]["build_on_device"] = True
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    assert d.proc.wait(60) == 1
    assert "model.build_on_device is set, but tensorrt backend unavailable" in d.output()


@needs_trt
def test_multi_batch_engine_package_runs_each_batch(demo: DemoAssets, tmp_path: Path) -> None:
    """A `1,4` package -> `edged build-engine` -> one engine per batch, opened by the loader as one model: a
    one-row feed runs the batch-1 engine and gives what the batch-4 engine gives for that row."""
    import onnx

    from edged.daemon.backends.base import BatchSet
    from edged.daemon.config import load_config
    from edged.daemon.lifecycle.loader import open_package_backend
    from edged.models.rebatch import rebatch

    src = demo.packages["blazeface-back"]
    onnx.save(rebatch(onnx.load(str(src.model_path)), 1), str(tmp_path / "model.b1.onnx"))
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    fields["extra_batches"] = [{"batch": 1, "file": "model.b1.onnx"}]
    files = {"model.onnx": src.model_path, "model.b1.onnx": tmp_path / "model.b1.onnx"}
    multi = write_package(tmp_path / "multi", fields, files | {"labels.txt": src.root / "labels.txt"})
    out = tmp_path / "multi-trt"
    r = edged_cli("build-engine", str(multi.root), "--out", str(out), timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "batch 1 (2 of 2): model.b1.engine" in r.stderr
    pkg = verify_folder(out)
    assert pkg.manifest.batch_files == {1: "model.b1.engine", 4: "model.engine"}
    doc = base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://?fps=5"}])
    doc["model"]["package"] = str(out)
    backend = open_package_backend(load_config(write_config(tmp_path / "c.yaml", doc)), pkg)
    spec = pkg.manifest.input
    batch = calibration_batches(spec, read_frames(demo.video, limit=spec.batch))[0]
    with backend:
        assert isinstance(backend, BatchSet) and backend.batches == (1, 4)
        four, one = backend.infer({spec.name: batch}), backend.infer({spec.name: batch[:1]})
        assert backend.memory_bytes == sum(backend.member(b).memory_bytes for b in (1, 4))
    for name, ref in four.items():
        assert one[name].shape == (1, *ref.shape[1:])
        np.testing.assert_allclose(one[name][0], ref[0], rtol=0.05, atol=0.05 * float(np.abs(ref).max()))


class Nowhere:
    host, port = "127.0.0.1", 1
