"""bench/pipeline_cpu.py's per-stage CPU accounting on a tiny run: the real daemon (one camera on the demo
video, the bench's sleeping stand-in engine, a real mosquitto) in a child process with the stage clocks of
bench/pipeline_cpu_probe.py; every stage is there, and the stages, measured thread by thread, add up to the
process's own CPU time."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edged.daemon.backends import OnnxRuntimeBackend
from edged.models.demo import DemoAssets

from .conftest import REPO, Broker, base_config, write_config

sys.path.insert(0, str(REPO / "bench"))
probe = importlib.import_module("pipeline_cpu_probe")  # bench/ is not a package: mypy sees Any
STAGES, CAMERA_SIDE = probe.STAGES, probe.CAMERA_SIDE


def test_the_stages_cpu_adds_up_to_the_process_cpu(broker: Broker, demo: DemoAssets, tmp_path: Path) -> None:
    # The sleeping stand-in engine (bench/pipeline_batch.py, the real model's outputs on a batch of zeros): no
    # engine CPU, so the camera side, the decoder's threads and the publisher are most of the process's time.
    pkg = demo.packages["blazeface-back"]
    spec = pkg.manifest.input
    zeros = np.zeros(spec.shape, spec.dtype)
    with OnnxRuntimeBackend(pkg.model_path, threads=1) as be:
        outputs: dict[str, Any] = be.infer({spec.name: zeros})
    np.savez(tmp_path / "outputs.npz", **outputs)
    cams = [{"name": "cam0", "uri": f"file://{demo.video}", "realtime": False, "loop": True}]
    cfg = write_config(tmp_path / "edged.yaml", base_config(broker, demo, tmp_path, cams))
    out = tmp_path / "acc.json"
    stand_in = f"({str(tmp_path / 'outputs.npz')!r}, 4.0, {spec.name!r}, {tuple(spec.shape)!r}, {str(zeros.dtype)!r})"
    code = (
        f"import sys, functools; sys.path.insert(0, {str(REPO / 'bench')!r}); "
        "from pipeline_cpu_probe import cpu_child; from pipeline_cpu import stand_in; "
        f"cpu_child({str(cfg)!r}, 5.5, 2.0, functools.partial(stand_in, *{stand_in}), {str(out)!r})"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    acc = json.loads(out.read_text())

    assert acc["frames"] >= 10, acc
    cpu = acc["cpu_ms"]
    assert list(cpu) == list(STAGES)
    assert all(v >= 0 for v in cpu.values()), cpu
    # the stages that do work on every frame were seen doing it (the inference thread's own Python too)
    for stage in ("capture", "preprocess", "gather", "inference", "decode", "scenes", "publish"):
        assert cpu[stage] > 0, (stage, cpu)
    assert acc["camera_side_ms"] == sum(cpu[s] for s in CAMERA_SIDE)
    assert acc["threads_ms"] == sum(cpu.values())
    # Two independent clocks: the threads' own clocks (and /proc for threads Python did not start) against the
    # process's CPU time over the same window. Leaving out a thread (GStreamer's decoder threads, about half the
    # process's time here) breaks this.
    assert abs(acc["threads_ms"] - acc["process_ms"]) <= 0.1 * acc["process_ms"], acc
    # a wrapped stage's wall time includes its CPU time
    assert acc["wall_ms"]["preprocess"] >= cpu["preprocess"] * 0.99
    # the demo package takes 256x256x3 pixels: float32 as it ships, uint8 when folded
    itemsize = {"float32": 4, "uint8": 1}[acc["engine_dtype"]]
    assert acc["engine_bytes_per_frame"] == 256 * 256 * 3 * itemsize
