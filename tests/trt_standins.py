"""Puts the TensorRT and CUDA stand-ins (tests/trt_standin) where `import tensorrt` and the CUDA binding's
import find them, for one test (monkeypatch undoes it): pycuda by default, or cuda-python."""

from __future__ import annotations

import sys
from typing import Any, Literal

import pytest

from edged.daemon.lifecycle import loader
from tests.trt_standin import cuda as standin_cuda_ns
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standin.cuda import bindings as standin_bindings
from tests.trt_standin.cuda.bindings import driver as standin_cuda_python
from tests.trt_standin.pycuda import driver as standin_cuda

Binding = Literal["pycuda", "cuda-python"]


def use_standins(monkeypatch: pytest.MonkeyPatch, no_gpu_check: bool = True, binding: Binding = "pycuda") -> None:
    """`import tensorrt` gets the stand-in, and the CUDA binding `binding` its stand-in (the other one does not
    import, whatever is installed); with `no_gpu_check` the loader does not look for /dev/nvidia0."""
    monkeypatch.setitem(sys.modules, "tensorrt", standin_trt)
    if binding == "pycuda":
        pycuda = type(sys)("pycuda")
        pycuda.driver = standin_cuda  # type: ignore[attr-defined]
        pycuda.VERSION_TEXT = "stand-in"  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "pycuda", pycuda)
        monkeypatch.setitem(sys.modules, "pycuda.driver", standin_cuda)
        for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.cuda"):
            monkeypatch.setitem(sys.modules, name, None)  # an ImportError: cuda-python is not installed
    else:
        monkeypatch.setitem(sys.modules, "cuda", standin_cuda_ns)
        monkeypatch.setitem(sys.modules, "cuda.bindings", standin_bindings)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", standin_cuda_python)
        for name in ("pycuda", "pycuda.driver"):
            monkeypatch.setitem(sys.modules, name, None)
    if no_gpu_check:
        monkeypatch.setattr(loader, "tensorrt_unavailable_reason", lambda: None)


def standin_builds(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The stand-ins in place, with a builder that builds: returns the list of what each build was asked
    (tensorrt stand-in's BUILDS, fresh for the test)."""
    monkeypatch.setenv("TRT_STANDIN_BUILD", "1")
    monkeypatch.delenv("TRT_STANDIN_FAULT", raising=False)
    use_standins(monkeypatch)
    monkeypatch.setattr(standin_trt, "BUILDS", [])
    return standin_trt.BUILDS
