"""The CUDA binding adapter (daemon/backends/tensorrt/cuda.py): which binding runs, and cuda-python's calls against
the real `cuda-bindings` package.

The real check: the cuda-bindings 12.x wheel (from PyPI, cached under ~/.cache/edged/cuda-api or
$EDGED_CUDA_API_CACHE) is imported in a subprocess; every driver function the adapter calls
(`CUDA_PYTHON_API`) must exist with the arguments the adapter passes and return the values it unpacks (read
from the bindings' embedded signatures and documented returns). There is no libcuda here, so the adapter's
first call meets the real "no driver" failure: it must come out as a CudaError naming cuInit, which
trt_api.translate words as "CUDA does not start here". Both bindings' call shapes under the backend are
exercised with stand-ins in tests/test_trt_thread.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edged.daemon.backends.tensorrt.cuda import CUDA_PYTHON_API, load_cuda
from edged.errors import BackendError
from tests.conftest import REPO
from tests.trt_standins import use_standins

WHEELS = ("cuda-bindings>=12.6,<13", "cuda-pathfinder")
PROBE = r"""
import inspect, json, re, sys
from cuda.bindings import driver
from edged.daemon.backends.tensorrt.cuda import CUDA_PYTHON_API, CudaError, CudaPython
from edged.daemon.backends.tensorrt.api import translate
from edged.errors import EngineLoadError
out = {}
for name, (nargs, nvalues) in CUDA_PYTHON_API.items():
    fn = getattr(driver, name, None)
    if fn is None:
        out[name] = "missing"
        continue
    doc = fn.__doc__ or ""
    sig = doc.splitlines()[0]
    args = [a for a in re.search(r"\((.*)\)", sig).group(1).split(",") if a.strip()]
    section = re.search(r"\n( *)Returns\n *-------\n(.*?)(?:\n *See Also\n|\Z)", doc, re.S)
    indent = section.group(1)
    values = [l for l in section.group(2).splitlines() if l.strip() and l[len(indent)] != " "]
    out[name] = [len(args), len(values) - 1]  # the CUresult first
try:
    CudaPython(driver).init()
    out["init"] = "no error"
except CudaError as exc:
    out["init"] = str(translate(exc, "x", EngineLoadError))
print(json.dumps(out))
"""


def cuda_bindings() -> Path:
    root = Path(os.environ.get("EDGED_CUDA_API_CACHE", Path.home() / ".cache" / "edged" / "cuda-api"))
    target = root / "cuda-bindings-12"
    if (target / "cuda" / "bindings").is_dir():
        return target
    tmp = root / ".partial"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:", "--target", str(tmp),
         *WHEELS],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"cannot install {' '.join(WHEELS)}: {r.stderr.strip()[-300:]}")
    tmp.rename(target)
    return target


def test_the_adapters_calls_fit_the_real_cuda_bindings() -> None:
    site = cuda_bindings()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    shapes = {name: tuple(v) if isinstance(v, list) else v for name, v in report.items() if name != "init"}
    assert shapes == CUDA_PYTHON_API
    assert report["init"].startswith("x: CUDA does not start here (no usable NVIDIA GPU?): cuInit failed:")


def test_cuda_python_is_chosen_before_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    use_standins(monkeypatch, binding="cuda-python")
    monkeypatch.delitem(sys.modules, "pycuda")
    monkeypatch.delitem(sys.modules, "pycuda.driver")
    from tests.trt_standin.pycuda import driver as pycuda_driver

    pycuda = type(sys)("pycuda")
    pycuda.driver = pycuda_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)  # both importable
    monkeypatch.setitem(sys.modules, "pycuda.driver", pycuda_driver)
    cuda = load_cuda()
    assert cuda.binding == "cuda-python" and "preferred" in cuda.why


def test_pycuda_runs_where_cuda_python_is_absent_and_neither_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    use_standins(monkeypatch, binding="pycuda")
    cuda = load_cuda()
    assert cuda.binding == "pycuda" and cuda.version == "stand-in" and "cuda-python is not installed" in cuda.why
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(
        BackendError, match=r"no CUDA binding: cuda-python \(.*\), pycuda \(.*\); install edged\[tensorrt\]"
    ):
        load_cuda()
