"""A DLA build records, in the package's manifest (`source.dla`), the layers the builder placed on DLA,
those that fell back to the GPU, and the engine's layers as TensorRT's engine inspector names them.

No GPU here: the stand-in tensorrt (tests/trt_standin, TRT_STANDIN_BUILD=1) answers the builder's and the
inspector's calls with a three-layer network and placeholder bytes; what this checks is what edged asks
and writes down. tests/test_tensorrt_api.py checks that every call exists in each supported TensorRT.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.models.demo import DemoAssets
from edged.quantize.engine import build_engine_package
from tests.trt_standins import use_standins


@pytest.fixture
def building_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRT_STANDIN_BUILD", "1")
    monkeypatch.delenv("TRT_STANDIN_FAULT", raising=False)
    use_standins(monkeypatch, no_gpu_check=False)


@pytest.mark.usefixtures("building_tensorrt")
def test_a_dla_build_records_which_layers_run_on_dla(demo: DemoAssets, tmp_path: Path) -> None:
    src = demo.packages["blazeface-back"].root
    pkg = build_engine_package(src, tmp_path / "dla", precision="fp16", dla_core=1)
    m = pkg.manifest
    assert m.compatibility["dla_core"] == 1
    assert m.source["dla"] == {
        "core": 1,
        "layers": ["conv", "relu"],
        "gpu_layers": ["nms"],
        "engine_layers": ["input to nvm", "{ForeignNode[conv...relu]}", "relu from nvm", "nms"],
    }
    # a GPU build records none
    gpu = build_engine_package(src, tmp_path / "gpu", precision="fp16")
    assert "dla" not in gpu.manifest.source and gpu.manifest.compatibility["dla_core"] is None
