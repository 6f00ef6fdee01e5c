"""INT8 calibration through TensorRT's calibrator, per version, with warnings as errors.

TensorRT 10.1 deprecated `IBuilderConfig.int8_calibrator` (and the calibrator classes) in favour of explicit
quantization (Q/DQ), with no replacement setter; its bindings warn (PyErr_WarnEx, DeprecationWarning) on every
read and write of the property, which pyproject's `filterwarnings = ["error"]` turns into a failed build. The
stand-in tensorrt warns as the real bindings do (tests/trt_standin); which versions really carry that
deprecation is checked against their bindings in tests/test_tensorrt_api.py. No GPU here: nothing is built."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edged.daemon.backends.tensorrt.build import build_engine
from edged.errors import BackendError
from edged.models.demo import DemoAssets
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standins import standin_builds, use_standins

SHAPE = (4, 128, 128, 3)


@pytest.fixture
def building(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return standin_builds(monkeypatch)


def calibrate(demo: DemoAssets, tmp_path: Path) -> str:
    batches = [np.zeros(SHAPE, np.float32), np.ones(SHAPE, np.float32)]
    onnx = demo.packages["blazeface-back"].model_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as pytest's filterwarnings, and whatever a caller's filters are
        built = build_engine(onnx, tmp_path / "model.engine", "input", SHAPE, "int8", calibration=batches)
    return built.precision


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("version", ["8.6.1", "10.0.1", "10.3.0", "10.11.0"])
def test_a_float_model_calibrates_under_warnings_as_errors(
    version: str,
    demo: DemoAssets,
    tmp_path: Path,
    building: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TRT_STANDIN_VERSION", version)
    with caplog.at_level(logging.WARNING, logger="edged.daemon.backends.tensorrt.api"):
        assert calibrate(demo, tmp_path) == "int8"
    assert building[-1]["calibration"] == "2 batches"  # TensorRT got the calibrator and ran every batch
    assert standin_trt.BuilderFlag.INT8 in building[-1]["flags"]
    said = [r.getMessage() for r in caplog.records]
    if tuple(int(p) for p in version.split(".")[:2]) >= (10, 1):  # the deprecated route, said with the one that stays
        assert any("deprecated since 10.1" in m and "edged quantize --target tensorrt" in m for m in said), said
    else:
        assert not said, said


def test_the_standin_warns_as_the_real_bindings_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard on this file's test: setting the property directly fails under warnings as errors on 10.3."""
    monkeypatch.setenv("TRT_STANDIN_VERSION", "10.3.0")
    config = standin_trt._Config()
    with pytest.raises(DeprecationWarning, match="Superseded by explicit quantization"):
        config.int8_calibrator = object()
    monkeypatch.setenv("TRT_STANDIN_VERSION", "10.0.1")
    config.int8_calibrator = object()  # not deprecated before 10.1


@pytest.mark.parametrize("version", ["10.12.0", "11.0.0"])
def test_strongly_typed_versions_refuse_a_calibrator(
    version: str, demo: DemoAssets, tmp_path: Path, building: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRT_STANDIN_VERSION", version)
    with pytest.raises(BackendError, match=r"builds strongly typed networks.*Q/DQ"):
        calibrate(demo, tmp_path)
    assert building == []


@pytest.mark.parametrize("binding", ["pycuda", "cuda-python"])
def test_the_calibrators_device_buffer_is_freed_inside_the_context(
    binding: str, demo: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freed before the build pops its context (garbage collection would free it after: a cleanup warning and
    the buffer held past the build). The stand-in CUDA refuses a free without a current context."""
    from tests.trt_standin.cuda.bindings import driver as cuda_python
    from tests.trt_standin.pycuda import driver as pycuda

    monkeypatch.setenv("TRT_STANDIN_BUILD", "1")
    monkeypatch.setenv("TRT_STANDIN_VERSION", "10.0.1")
    monkeypatch.delenv("TRT_STANDIN_FAULT", raising=False)
    use_standins(monkeypatch, binding=binding)  # type: ignore[arg-type]
    driver = pycuda if binding == "pycuda" else cuda_python
    monkeypatch.setattr(driver, "STATE", driver.State())
    assert calibrate(demo, tmp_path) == "int8"
    calls = [name for name, _ in driver.STATE.calls]
    assert calls.count("cuMemAlloc") == 1 and driver.STATE.allocated == 0, calls
    assert calls.index("cuMemFree") < len(calls) - 1 - calls[::-1].index("cuCtxPopCurrent"), calls
    assert driver.STATE.retained == 0
