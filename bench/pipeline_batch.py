"""The stand-in backend of bench/pipeline.py, and its one-camera figures: what a package with several fixed
batches (manifest ``extra_batches``) gives a device with fewer cameras than the largest batch.

One camera, the same model three ways: the single-batch package at batch B (every batch padded with B-1
rows), the multi-batch package (``edged model init --batch 1,B``: it runs at batch 1) and a batch-1 package
(the target: within 10 % of it). On the real engine (ONNX Runtime) and on the sleeping stand-in.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edged.daemon.backends import TensorInfo
from edged.daemon.backends.base import BatchSet
from edged.models.init import InitOptions, init_package

RAW = "face_detection_back_256x256_barracuda.onnx"
# (the path of the real outputs at batch B as .npz, ms per image, (input name, shape at batch B), the batches)
SleepSpec = tuple[str, float, tuple[str, tuple[int, ...]], tuple[int, ...]]


class SleepBackend:
    """A bench-only backend: sleeps `per_image_ms` x batch per batch (the GIL is released while it
    sleeps, as a GPU engine releases it) and returns real outputs captured from the real model."""

    name = "sleep"
    cpu_bound = False  # it sleeps, as a GPU engine waits

    def __init__(self, outputs: dict[str, np.ndarray], inputs: list[TensorInfo], per_image_ms: float) -> None:
        self._outputs = outputs
        self._inputs = inputs
        self.batch = inputs[0].shape[0]
        self.per_batch_s = per_image_ms * self.batch / 1000.0

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo(k, tuple(v.shape), str(v.dtype)) for k, v in self._outputs.items()]

    @property
    def memory_bytes(self) -> int:
        return 0

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.per_batch_s)
        return self._outputs

    def close(self) -> None:
        pass

    def __enter__(self) -> SleepBackend:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        pass


def load_sleep(outputs_npz: str, per_image_ms: float, batch: int, in_info: tuple[str, tuple[int, ...]]) -> SleepBackend:
    data = np.load(outputs_npz)
    outs = {k: (data[k] if data[k].shape[0] == batch else np.ascontiguousarray(data[k][:batch])) for k in data.files}
    return SleepBackend(outs, [TensorInfo(in_info[0], (batch, *in_info[1][1:]), "float32")], per_image_ms)


def sleep_backend(spec: SleepSpec) -> Any:
    """The stand-in at each of the package's batches: one SleepBackend, or a BatchSet of them."""
    npz, ms, info, batches = spec
    if len(batches) == 1:
        return load_sleep(npz, ms, batches[0], info)
    return BatchSet({b: load_sleep(npz, ms, b, info) for b in batches})


def make_packages(demo_root: Path, work: Path, batch: int) -> dict[str, Path]:
    """The batch-1 and the multi-batch (1,B) packages of the demo's BlazeFace, made by `edged model init`."""
    raw = demo_root / "raw" / RAW
    out = {}
    for key, opts in (
        ("b1", InitOptions(raw, work / "pkg-b1", name="blazeface-back", batch=1)),
        ("multi", InitOptions(raw, work / "pkg-multi", name="blazeface-back", batch=batch, extra_batches=(1,))),
    ):
        out[key] = init_package(opts).package.root
    return out


def one_camera_lines(res: dict[str, Any], batch: int) -> list[tuple[str, str, str]]:
    """The printed lines of the one-camera figures in `res["one_camera"]`."""
    lines = []
    for engine, figures in res["one_camera"].items():
        b1 = figures["b1"]
        for key, what in (("single", f"batch-{batch} package"), ("multi", f"1,{batch} package"), ("b1", "batch 1")):
            ratio = f"{figures[key] / b1:.3f} of the batch-1 package" if key != "b1" and b1 else ""
            lines.append((f"one camera, {engine}, {what}", f"{figures[key]:.1f} img/s", ratio))
    return lines
