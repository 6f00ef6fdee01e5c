"""`model.build_on_device` builds what the model is.

TensorRT 10.12 deprecated weak typing (the FP16/INT8 builder flags) and 11 removed it: a strongly typed
network takes its precision from the ONNX model. The loader used to ask the builder for fp16 whenever
`model.build_precision` was unset, so on a strongly typed TensorRT an fp32 ONNX package failed its start with
"builds strongly typed networks" instead of building its own fp32 engine. No GPU here: the stand-in
tensorrt/pycuda (tests/trt_standin) reach TensorRT's first native call, which fails as it does without a
GPU ("factory function returned nullptr"); the test reads which refusal came first.
tests/test_tensorrt_api.py checks the same path against the real bindings of every supported version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import load_config
from edged.daemon.lifecycle import loader
from edged.errors import BackendError
from edged.models.demo import DemoAssets
from edged.models.package import open_package
from tests.conftest import base_config, write_config
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standins import use_standins


class Nowhere:
    host, port = "127.0.0.1", 1


def strongly_typed_tensorrt(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """The stand-in tensorrt as a strongly typed version (`import tensorrt` gets it), with no GPU behind it."""
    monkeypatch.setenv("TRT_STANDIN_FAULT", "nullptr")
    monkeypatch.setattr(standin_trt, "__version__", version, raising=False)
    if version.startswith("11."):
        monkeypatch.delattr(standin_trt.BuilderFlag, "FP16")
        monkeypatch.delattr(standin_trt.BuilderFlag, "INT8")
    use_standins(monkeypatch)


def start(demo: DemoAssets, tmp_path: Path, **model: Any) -> str:
    doc = base_config(Nowhere(), demo, tmp_path, [{"name": "a", "uri": "synthetic://?fps=5"}])
    doc["model"].update(build_on_device=True, **model)
    cfg = load_config(write_config(tmp_path / "edged.yaml", doc))
    pkg = open_package(Path(doc["model"]["package"]))
    with pytest.raises(BackendError) as exc:
        loader.open_package_backend(cfg, pkg)
    return str(exc.value)


@pytest.mark.parametrize("version", ["11.4.0", "10.16.1"])
def test_build_on_device_builds_the_fp32_model_as_fp32_on_a_strongly_typed_tensorrt(
    version: str, demo: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    strongly_typed_tensorrt(monkeypatch, version)
    assert open_package(demo.packages["blazeface-back"].root).manifest.precision == "fp32"
    # the build went ahead with the model's own precision, up to TensorRT's first native call
    why = start(demo, tmp_path)
    assert "TensorRT could not start" in why and "strongly typed" not in why, why
    # asking for a precision the model does not carry is still refused, with the fix, before any native call
    why = start(demo, tmp_path, build_precision="fp16")
    assert "builds strongly typed networks" in why and "edged quantize --precision fp16" in why, why
