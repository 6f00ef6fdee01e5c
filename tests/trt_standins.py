"""Puts the TensorRT and pycuda stand-ins (tests/trt_standin) where `import tensorrt` and
`import pycuda.driver` find them, for one test (monkeypatch undoes it)."""

from __future__ import annotations

import sys

import pytest

from edged.daemon import loader
from tests.trt_standin import tensorrt as standin_trt
from tests.trt_standin.pycuda import driver as standin_cuda


def use_standins(monkeypatch: pytest.MonkeyPatch, no_gpu_check: bool = True) -> None:
    """`import tensorrt` / `pycuda.driver` get the stand-ins; with `no_gpu_check` the loader does not look for
    /dev/nvidia0 (there is none here)."""
    pycuda = type(sys)("pycuda")
    pycuda.driver = standin_cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", standin_trt)
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.driver", standin_cuda)
    if no_gpu_check:
        monkeypatch.setattr(loader, "tensorrt_unavailable_reason", lambda: None)
