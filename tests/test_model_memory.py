"""What a loaded model costs, as the budget counts it: ONNX Runtime's arena in the loaded figure (real ONNX
Runtime on the demo model, measured against the process's RSS), and an engine package admitted on the device
memory its manifest records (weights included), not on its file plus that record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from edged.daemon.backends.onnxruntime import OnnxRuntimeBackend
from edged.daemon.lifecycle.manager import estimate_mb
from edged.models.demo import DemoAssets
from edged.models.footprint import activation_bytes
from edged.models.package import write_package
from tests.conftest import REPO

# a second session in a process whose ONNX Runtime is already up (the environment's own memory is not the
# model's), then 20 batches: how much the process grew, against what the backend says it holds
MEASURE = """
import os, sys, numpy as np
from pathlib import Path
from edged.daemon.backends.onnxruntime import OnnxRuntimeBackend
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
model, shape = Path(sys.argv[1]), tuple(int(d) for d in sys.argv[2].split(","))
x = np.random.default_rng(0).random(shape, dtype=np.float32)
warm = OnnxRuntimeBackend(model, threads=1)
warm.infer({warm.inputs[0].name: x})
warm.close()
base = rss()
b = OnnxRuntimeBackend(model, threads=1)
for _ in range(20):
    b.infer({b.inputs[0].name: x})
print(rss() - base, b.memory_bytes)
"""


def test_the_loaded_onnx_model_counts_onnx_runtimes_arena(demo: DemoAssets) -> None:
    pkg = demo.packages["blazeface-back"]
    shape = ",".join(str(d) for d in pkg.manifest.input.shape)
    r = subprocess.run(
        [sys.executable, "-c", MEASURE, str(pkg.model_path), shape],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    grown, counted = (int(v) for v in r.stdout.split())
    print(f"\nblazeface-back batch 4: RSS +{grown / 2**20:.1f} MB after 20 batches, counted {counted / 2**20:.1f} MB")
    # the weights and one batch of I/O alone are under 4 MB; the process grows ten times that
    assert counted >= 0.75 * grown, (grown, counted)
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as b:
        assert b.memory_bytes >= pkg.model_path.stat().st_size + 2 * activation_bytes(pkg.model_path)


def test_an_engine_is_admitted_on_its_recorded_memory_not_its_file_plus_it(demo: DemoAssets, tmp_path: Path) -> None:
    """`device_memory_bytes` (edged build-engine) is the context's scratch memory plus the plan's weights: the
    file is not counted a second time. An engine without the record is counted by its file."""
    src = demo.packages["blazeface-back"]
    fields = src.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"\0" * (8 << 20))  # 8 MB of weights
    spec = src.manifest.input
    io_mb = int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize / 2**20
    files = {"model.engine": engine, "labels.txt": src.root / "labels.txt"}
    recorded = write_package(
        tmp_path / "recorded",
        {**fields, "kind": "engine", "model_file": "model.engine", "compatibility": {"device_memory_bytes": 10 << 20}},
        files,
    )
    assert abs(estimate_mb(recorded) - (10 + io_mb)) < 0.01, estimate_mb(recorded)  # not 8 + 10 + I/O
    unrecorded = write_package(
        tmp_path / "unrecorded", {**fields, "kind": "engine", "model_file": "model.engine", "compatibility": {}}, files
    )
    assert abs(estimate_mb(unrecorded) - (8 + io_mb)) < 0.01, estimate_mb(unrecorded)
