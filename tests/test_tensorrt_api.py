"""TensorRT API check: edged's TensorRT code against the real Python bindings of every version it supports.

An API check, not an execution test. Each version's real bindings wheel (from PyPI, cached under
~/.cache/edged/trt-api or $EDGED_TRT_API_CACHE) is imported with a stand-in libnvinfer built here with `cc`
(tests/trt_api_stub.c: the ~10 C symbols the bindings link against, every factory returning NULL, which is
what libnvinfer does when CUDA cannot start). tests/trt_api_probe.py then reports, per version:

- which names of the surface the backend and builder declare (trt_api.TRT_API) exist: every `required`
  one must, in every version; an `optional` one is only touched where the version adapter looked first;
- that TrtApi accepts the version and spells its network flags, and edged's Python subclasses of
  TensorRT's interfaces (logger, progress monitor, calibrator) build on the real base classes;
- what the backend and the builder raise at their first native call (trt.Runtime / trt.Builder returning
  nullptr): edged's EngineLoadError / BackendError with the reason, never an untranslated exception.

A static pass checks that the TensorRT names the code uses are all in TRT_API, so the declared surface
cannot fall behind the code. The matrix's versions: 8.6 (JetPack 6.0), 10.3 (JetPack 6.1/6.2), the newest
10.x and 11.x on PyPI, and 11.0.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.backends.tensorrt.api import CALIBRATOR_DEPRECATED_FROM, TRT_API
from edged.models.demo import DemoAssets
from tests.conftest import REPO

# label -> pip requirement of the bindings wheel
MATRIX = {
    "8.6": "tensorrt-bindings==8.6.1",
    "10.3": "tensorrt-cu12-bindings==10.3.*",
    "10.x": "tensorrt-cu12-bindings>=10.4,<11",
    "11.0": "tensorrt-cu12-bindings==11.0.*",
    "11.x": "tensorrt-cu12-bindings>=11.1,<12",
}
QUICK = "10.3"  # JetPack 6.1/6.2's TensorRT: the removal test runs on it
SONAMES = ("nvinfer", "nvonnxparser", "nvinfer_plugin", "nvparsers")
BACKEND = REPO / "daemon" / "backends"


def cache_root() -> Path:
    return Path(os.environ.get("EDGED_TRT_API_CACHE", Path.home() / ".cache" / "edged" / "trt-api"))


def stub_lib(root: Path) -> Path:
    """The stand-in libnvinfer (and parser, plugin libraries), under every soname the bindings need."""
    out = root / "stub"
    if (out / "libnvinfer.so.10").is_file():
        return out
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the stand-in libnvinfer")
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "libstub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(REPO / "tests" / "trt_api_stub.c")], check=True)
    for major in (8, 10, 11):
        for name in SONAMES:
            shutil.copy(lib, out / f"lib{name}.so.{major}")
    return out


def bindings(root: Path, label: str) -> Path:
    """The bindings of one matrix version, installed once into their own folder and reused."""
    target = root / label
    if (target / "tensorrt_bindings").is_dir():
        return target
    tmp = root / f".{label}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--target",
            str(tmp),
            MATRIX[label],
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot install {MATRIX[label]} for Python {sys.version_info[0]}.{sys.version_info[1]}: "
                    f"{r.stderr.strip()[-300:]}")  # fmt: skip
    tmp.rename(target)
    return target


def probe(label: str, tmp: Path, onnx: Path, remove: str | None = None) -> dict[str, Any]:
    root = cache_root()
    stub = stub_lib(root)
    site = bindings(root, label)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "LD_LIBRARY_PATH": str(stub),
        "TRT_API_REMOVE": remove or "",
    }
    env.pop("TRT_STANDIN_FAULT", None)
    r = subprocess.run(
        [sys.executable, str(REPO / "tests" / "trt_api_probe.py"), str(tmp), str(onnx)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def problems(report: dict[str, Any]) -> list[str]:
    """Everything that makes edged's TensorRT code wrong for this version; empty when it fits."""
    out = [f"{name} is missing" for name in TRT_API["required"] if not report["surface"][name]]
    if "error" in report["adapter"]:
        out.append(f"the adapter refuses it: {report['adapter']['error']}")
    for kind, result in report["subclasses"].items():
        if result not in ("no error", "absent"):
            out.append(f"edged's {kind} subclass: {result}")
    for step in ("load", "build_fp16", "build_fp32", "build_default", "build_on_device"):
        if not report[step].startswith(("EngineLoadError", "BackendError")):
            out.append(f"{step}: {report[step]}")
    return out


def check_version(label: str, tmp: Path, onnx: Path) -> dict[str, Any]:
    report = probe(label, tmp, onnx)
    assert problems(report) == [], (label, report)
    version = tuple(int(p) for p in report["version"].split(".")[:2])
    major = version[0]
    # the first native call, turned into edged's error with the reason
    assert "TensorRT could not start" in report["load"], report["load"]
    assert "TensorRT could not start" in report["build_fp32"], report["build_fp32"]
    assert "TensorRT could not start" in report["build_default"], report["build_default"]  # 10.12+: the model's fp32
    # build_on_device builds what the model is: never refused for a precision the model does not carry
    assert "TensorRT could not start" in report["build_on_device"], report["build_on_device"]
    if version >= (10, 12):  # strongly typed: fp16 from an fp32 model is refused before any native call
        assert report["adapter"]["strongly_typed"] and "builds strongly typed networks" in report["build_fp16"]
    else:
        assert not report["adapter"]["strongly_typed"] and "TensorRT could not start" in report["build_fp16"]
    # 8.6: EXPLICIT_BATCH (bit 0); 10.12-10.x: STRONGLY_TYPED (bit 1); 10.0-10.11 and 11: none
    assert report["adapter"]["network_flags"] == {8: 1, 10: 2 if version >= (10, 12) else 0}.get(major, 0)
    assert report["subclasses"]["monitor"] == ("absent" if major == 8 else "no error")  # 10.0+
    assert report["subclasses"]["calibrator"] == ("absent" if major >= 11 else "no error")
    assert calibrator_deprecated(label) == (
        report["surface"]["IBuilderConfig.int8_calibrator"] and version >= CALIBRATOR_DEPRECATED_FROM
    ), (label, "the version adapter's CALIBRATOR_DEPRECATED_FROM does not match these bindings")
    return report


def calibrator_deprecated(label: str) -> bool:
    """Whether these bindings warn on IBuilderConfig.int8_calibrator: their deprecation text is compiled in (the
    property cannot be reached without a real builder, so the text is what can be checked here)."""
    (so,) = (cache_root() / label / "tensorrt_bindings").glob("tensorrt*.so")
    return b"Superseded by explicit quantization" in so.read_bytes()


def test_the_quick_version_fits(demo: DemoAssets, tmp_path: Path) -> None:
    check_version(QUICK, tmp_path, demo.packages["blazeface-back"].model_path)


@pytest.mark.parametrize("label", [v for v in MATRIX if v != QUICK])
def test_every_version_in_the_matrix_fits(label: str, demo: DemoAssets, tmp_path: Path) -> None:
    report = check_version(label, tmp_path, demo.packages["blazeface-back"].model_path)
    print(label, report["version"], {n: report["surface"][n] for n in TRT_API["optional"]})


def test_the_check_fails_when_a_version_lacks_an_attribute(demo: DemoAssets, tmp_path: Path) -> None:
    onnx = demo.packages["blazeface-back"].model_path
    report = probe(QUICK, tmp_path, onnx, remove="IExecutionContext.execute_async_v3")
    assert problems(report) == ["IExecutionContext.execute_async_v3 is missing"]
    # one the adapter reads before any native call: the check fails, and the backend and builder still
    # say it in edged's words (no AttributeError escapes)
    report = probe(QUICK, tmp_path, onnx, remove="BuilderFlag")
    assert "BuilderFlag is missing" in problems(report)
    for step in ("load", "build_fp32"):
        assert report[step].startswith(("EngineLoadError", "BackendError")), report[step]
        assert "lacks an API edged uses" in report[step] and "BuilderFlag" in report[step], report[step]


# --- the declared surface covers what the code uses ------------------------------------------------------

# the variables the code names TensorRT objects by, and their classes
OBJECTS = {
    "builder": "Builder",
    "network": "INetworkDefinition",
    "parser": "OnnxParser",
    "config": "IBuilderConfig",
    "profile": "IOptimizationProfile",
    "cache": "ITimingCache",
    "runtime": "Runtime",
    "engine": "ICudaEngine",
    "context": "IExecutionContext",
    "flags": "NetworkDefinitionCreationFlag",
    "layer": "ILayer",
    "inspector": "EngineInspector",
}
TRT_ROOTS = ("trt", "self.trt", "api.trt")


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def used_names(path: Path) -> set[str]:
    """TensorRT names a module uses: `trt.X.Y` chains, and members of the objects in OBJECTS."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # `trt.A` inside `trt.A.B`
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner or node.attr == "__init__":
            continue
        chain = dotted(node)
        if chain is None:
            continue
        for root in TRT_ROOTS:
            if chain.startswith(root + "."):
                rest = chain[len(root) + 1 :].split(".")
                found.add(".".join(rest[:2]))
        base = dotted(node.value)
        if base is not None:
            var = base.split(".")[-1].lstrip("_")
            if var in OBJECTS and not base.startswith(TRT_ROOTS):
                found.add(f"{OBJECTS[var]}.{node.attr}")
    return found


def test_every_tensorrt_name_the_code_uses_is_declared() -> None:
    declared = set(TRT_API["required"]) | set(TRT_API["optional"])
    used = set().union(
        *(used_names(BACKEND / f) for f in ("tensorrt/__init__.py", "tensorrt/build.py", "tensorrt/api.py"))
    )
    assert "IExecutionContext.execute_async_v3" in used and "BuilderFlag.FP16" in used  # the scan sees them
    assert sorted(used - declared) == []
