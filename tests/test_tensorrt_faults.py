"""TensorRT, CUDA and pycuda failures become edged's errors: a start rolls the version back, a swap refuses it.

No GPU here, so the native libraries are stood in for at the seam we own: tests/trt_standin/ holds a
`tensorrt` and a `pycuda.driver` that fail the way the real ones do (a failed cuInit, TensorRT's "factory
function returned nullptr", an unsupported version, a plan TensorRT cannot deserialize, cuMemAlloc out of
memory). In-process they are handed to the backend and builder (`modules=`); a real daemon gets them on its
PYTHONPATH. tests/test_tensorrt_api.py checks the same code against the real TensorRT bindings.
"""

from __future__ import annotations

import logging
import platform
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edged.daemon.backends.tensorrt import TensorRTBackend
from edged.daemon.backends.tensorrt.api import BuilderOptions, TrtApi, TrtModules
from edged.daemon.backends.tensorrt.build import build_engine
from edged.daemon.backends.tensorrt.cuda import Pycuda
from edged.errors import BackendError, EngineLoadError, IncompatibleEngine
from edged.models.compat import DeviceFacts, dla_cores, mismatches
from edged.models.demo import DemoAssets
from edged.models.signing import SigningKey
from tests import sysfs_fixtures as fx
from tests.conftest import REPO, Broker, edged_cli, wait_until, write_config
from tests.test_ota import MODEL, build, device_doc, install, push, store_view, wait_results
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standin.pycuda import driver as standin_cuda

STANDIN = TrtModules(standin_trt, Pycuda(standin_cuda))
# what each fault reads like once edged has translated it
FAULTS = {
    "no_gpu": "CUDA does not start here (no usable NVIDIA GPU?): cuInit failed",
    "nullptr": "TensorRT could not start (no usable NVIDIA GPU",
    "old_version": "TensorRT 8.5.2.2 is not supported: edged runs TensorRT 8.6 (JetPack 6.0) to 11.x",
    "corrupt": "TensorRT cannot deserialize it: IRuntime::deserializeCudaEngine: Error Code 1: Serialization",
    "oom": "out of GPU memory: cuMemAlloc failed",  # then pycuda's text, or cuda-python's error name and text
}


def standin_compat() -> dict[str, Any]:
    return {"tensorrt": str(standin_trt.__version__), "platform": platform.machine()}


@pytest.mark.parametrize("fault", FAULTS)
def test_every_native_failure_at_load_is_an_engine_load_error(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRT_STANDIN_FAULT", fault)
    plan = tmp_path / "model.engine"
    plan.write_bytes(b"plan")
    with pytest.raises(EngineLoadError, match=re.escape(FAULTS[fault])) as exc:
        TensorRTBackend(plan, standin_compat(), modules=STANDIN)
    assert exc.value.code == "model_load_failed"


def test_the_backend_loads_and_closes_through_the_seam(tmp_path: Path) -> None:
    plan = tmp_path / "model.engine"
    plan.write_bytes(b"p" * 1000)
    with pytest.raises(IncompatibleEngine, match="built for DLA core 1, this device has no DLA"):
        TensorRTBackend(plan, {**standin_compat(), "dla_core": 1}, modules=STANDIN)
    agx = tmp_path / "agx"
    for i in range(2):
        fx.put(agx, f"proc/device-tree/bus@0/host1x@13e00000/nvdla{i}@1588{i}000/status", "okay\0")
    with TensorRTBackend(plan, {**standin_compat(), "dla_core": 1}, modules=STANDIN, root=agx) as be:
        assert [t.name for t in be.inputs] == ["input"] and be._runtime.DLA_core == 1
        io = sum(int(h.nbytes) for h in be._host.values())
        assert be.memory_bytes == (1 << 20) + 1000 + io  # scratch memory + weights (the plan) + buffers
    assert be._stream is None and be._context is None and not be._device  # close() let go of all of it


@pytest.mark.parametrize("fault", ["no_gpu", "nullptr", "old_version"])
def test_every_native_failure_at_build_is_a_backend_error(
    fault: str, demo: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRT_STANDIN_FAULT", fault)
    onnx = demo.packages[MODEL].model_path
    with pytest.raises(BackendError, match=re.escape(FAULTS[fault].split(" (")[0])):
        build_engine(onnx, tmp_path / "e", "input", (4, 256, 256, 3), modules=STANDIN)
    assert not (tmp_path / "e").exists()


def test_dla_refuses_fp32_before_any_native_call(demo: DemoAssets, tmp_path: Path) -> None:
    onnx = demo.packages[MODEL].model_path
    with pytest.raises(BackendError, match="DLA runs fp16 or int8 only"):
        build_engine(onnx, tmp_path / "e", "input", (4, 256, 256, 3), "fp32", dla_core=0, modules=STANDIN)
    with pytest.raises(BackendError, match="cannot be hardware-compatible"):
        opts = BuilderOptions(hardware_compatibility="ampere+")
        build_engine(onnx, tmp_path / "e", "input", (4, 256, 256, 3), dla_core=0, options=opts, modules=STANDIN)


def fake_trt(version: str, weak_typing: bool = True) -> Any:
    flags = SimpleNamespace(EXPLICIT_BATCH=0, STRONGLY_TYPED=1)
    builder_flags = SimpleNamespace(FP16=1, INT8=2) if weak_typing else SimpleNamespace()
    return SimpleNamespace(__version__=version, BuilderFlag=builder_flags, NetworkDefinitionCreationFlag=flags)


def test_an_unsupported_tensorrt_on_the_device_is_named_by_the_compatibility_check() -> None:
    facts = DeviceFacts("aarch64", "8.5.2.2", "8.7", "35.4.1")
    problems = mismatches({"tensorrt": "8.5.2.2", "compute_capability": "8.7"}, facts)
    assert problems == ["this device's TensorRT 8.5.2.2 is not supported: edged runs TensorRT 8.6 (JetPack 6.0) to "
                        "11.x (JetPack 5's TensorRT 8.5 and Python 3.8 cannot run edged; flash JetPack 6)"]  # fmt: skip


def test_the_version_adapter_spells_each_version() -> None:
    assert TrtApi(fake_trt("8.6.2")).network_flags() == 1  # explicit batch, or the ONNX parser refuses all
    assert TrtApi(fake_trt("10.3.0")).network_flags() == 0
    eleven = TrtApi(fake_trt("11.4.0", weak_typing=False))
    assert eleven.strongly_typed and eleven.network_flags() == 0
    eleven.check_precision("fp16", "fp16", dla=False, calibrate=False)  # an fp16 model builds fp16
    assert [eleven.default_precision(m) for m in ("fp32", "fp16", "int8")] == ["fp32", "fp16", "int8"]
    ten = TrtApi(fake_trt("10.3.0"))
    assert [ten.default_precision(m) for m in ("fp32", "fp16", "int8")] == ["fp16", "fp16", "int8"]
    with pytest.raises(BackendError, match=r"strongly typed.*which is fp32, not fp16.*edged quantize --precision fp16"):
        eleven.check_precision("fp16", "fp32", dla=False, calibrate=False)
    with pytest.raises(BackendError, match=r"which is fp32, not int8.*--target tensorrt"):
        eleven.check_precision("int8", "fp32", dla=False, calibrate=False)
    TrtApi(fake_trt("10.3.0")).check_precision("fp16", "fp32", dla=False, calibrate=False)  # the FP16 flag
    for old in ("8.5.2.2", "7.1.3", "12.0.0"):
        with pytest.raises(BackendError, match=rf"TensorRT {old} is not supported"):
            TrtApi(fake_trt(old))


class Config:
    """An IBuilderConfig's timing-cache calls: a cache from elsewhere does not apply (set returns False)."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def create_timing_cache(self, data: bytes) -> Any:
        return SimpleNamespace(data=data)

    def set_timing_cache(self, cache: Any, ignore_mismatch: bool) -> bool:
        if cache.data:
            return False
        self.applied.append(cache.data)
        return True


def test_a_foreign_timing_cache_is_discarded_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = Config()
    with caplog.at_level(logging.WARNING):
        TrtApi(fake_trt("10.3.0")).timing_cache(config, b"from an AGX Xavier", "cache.bin")
    assert config.applied == [b""]  # the build goes on with a new cache
    assert "timing cache from another device or TensorRT version" in caplog.text


def test_dla_presence_is_part_of_the_compatibility_check(tmp_path: Path) -> None:
    nx = fx.orin_nano_jp6(tmp_path / "nano")
    for i, status in enumerate((b"disabled\0", b"disabled\0")):  # Orin Nano: the DLA nodes are disabled
        fx.put(nx, f"proc/device-tree/bus@0/host1x@13e00000/nvdla{i}@1588{i}000/status", status.decode())
    agx = tmp_path / "agx"
    for i in range(2):
        fx.put(agx, f"proc/device-tree/bus@0/host1x@13e00000/nvdla{i}@1588{i}000/status", "okay\0")
    assert (dla_cores(nx), dla_cores(agx), dla_cores(tmp_path / "x86")) == (0, 2, 0)
    want = {"dla_core": 1}
    assert mismatches(want, DeviceFacts.read(agx)) == []
    assert mismatches(want, DeviceFacts.read(nx)) == ["built for DLA core 1, this device has no DLA"]
    assert mismatches({"dla_core": 2}, DeviceFacts.read(agx)) == ["built for DLA core 2, this device has 2 DLA core(s)"]


# --- a real daemon: rolled back at start, refused at a swap ------------------------------------------------


def engine_tar(demo: DemoAssets, tmp: Path, signer: SigningKey, version: int) -> Path:
    junk = tmp / f"v{version}.engine"
    junk.write_bytes(b"a plan the stand-in TensorRT reads as its fault says")
    compat = {"tensorrt": "10.3.0", "platform": platform.machine()}
    return build(
        demo, tmp, signer, version, kind="engine", model_file="model.engine", compatibility=compat,
        files={"model.engine": junk},
    )  # fmt: skip


@pytest.mark.parametrize("fault", ["no_gpu", "old_version", "corrupt", "oom"])
def test_a_failing_engine_is_rolled_back_at_start_and_refused_at_a_swap(
    fault: str, demo: DemoAssets, tmp_path: Path, signer: SigningKey, broker: Broker, subscribe, start_daemon
) -> None:
    installed = {"PYTHONPATH": str(REPO / "tests" / "trt_standin")}  # TensorRT 10.3 when the engine is installed
    env = {**installed, "TRT_STANDIN_FAULT": fault}  # what the daemon finds
    cfg = write_config(tmp_path / "cam-01.yaml", device_doc(broker, demo, tmp_path, "cam-01"))
    install(cfg, build(demo, tmp_path, signer, 1))
    r = edged_cli("model", "install", str(engine_tar(demo, tmp_path, signer, 2)), "-c", str(cfg), env=installed)
    assert r.returncode == 0, r.stderr
    sub = subscribe(broker, "edged/cam-01/#")
    d = start_daemon(cfg, env=env)
    wait_results(sub, 1)  # version 2 did not load: version 1 serves, no restart loop
    rolled = [m.json() for m in sub.on("events") if m.json()["type"] == "model_rolled_back"]
    assert rolled and rolled[0]["code"] == "load_failed" and rolled[0]["to"] == 1, rolled
    assert FAULTS[fault] in rolled[0]["reason"], rolled[0]["reason"]
    assert "Traceback" not in d.output()
    # the same failure at a swap: refused, version 1 serves on. An unsupported TensorRT is known before the
    # transfer (the offer's compatibility check); the others only when the engine is opened
    r = push(broker, engine_tar(demo, tmp_path, signer, 3), "--device", "cam-01")
    code = "incompatible" if fault == "old_version" else "model_load_failed"
    assert r.returncode == 1 and f"rejected ({code}:" in r.stderr, r.stderr
    rejected = sub.wait_events("model_rejected")  # the event is spooled; the status the push saw is not
    assert FAULTS[fault] in rejected[0]["error"], rejected
    n = len(sub.results())
    wait_until(lambda: len(sub.results()) > n + 3, 30, "version 1 still serving")
    assert {r["model"]["version"] for r in sub.results()[n:]} == {1}
    assert d.stop() == 0, d.output()[-3000:]
    view = store_view(tmp_path / "cam-01")
    assert view["current"] == 1 and 2 in view["bad"], view
    assert (3 in view["bad"]) == (code == "model_load_failed"), view  # a refused offer never reached the store
