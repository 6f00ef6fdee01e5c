#!/usr/bin/env python3
"""Where one camera thread's CPU goes, part by part (a benchmark script, not a test).

One daemon `Camera` (daemon/capture/camera.py) reads the demo video (960x540 H.264, GStreamer path,
``realtime: false``) into the rows of a folded package (uint8 BGR NHWC, BlazeFace 256x256) or the unfolded
demo package (float32), and this script takes every frame as the inference thread would, so the camera
reads as fast as it can. The thread's own CPU time (/proc/self/task/TID/stat, every thread's clock ticks)
over `--frames` frames after a warm-up, and the thread CPU time (``time.thread_time``) of each part, timed
around it in that thread:

  read        the source's read: an appsink pull, the buffer mapped as a NumPy view (gstreamer/mapping.py)
  preprocess  the frame letterboxed into its row (capture/preprocess.py)
  owned       the frame kept for event crops (`keep_taken`: a view of GStreamer's buffer is copied)
  cut         the scene-cut detector (capture/motion.py, with tracking on)
  rest        the thread less those parts: the loop, the slot's lock and condition, the frame's metadata

Variants, each run --repeats times interleaved: folded / unfolded, with and without event crops
(`keep_taken`), and folded with the frame scaled to the model's size inside the pipeline (`scale_in_pipeline`:
videoscale in GStreamer's thread, so the camera thread gets 256x144 frames). Medians per part. GStreamer's own
threads (decode, convert) are not in the camera thread.

    python bench/camera_thread.py [--frames 400] [--repeats 3] [--out bench/results/camera-thread.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.daemon.capture import camera as cammod
from edged.daemon.capture.camera import Camera
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import CameraConfig
from edged.models.demo import fetch_demo
from edged.models.package import InputSpec

WARMUP = 50
PARTS = ("read", "preprocess", "owned", "cut")


def thread_cpu_s(tid: int) -> float:
    """utime + stime of one thread of this process, in seconds (clock ticks)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(video: Path, spec: InputSpec, keep_taken: bool, scaled: bool, frames: int) -> dict[str, float]:
    """One camera thread over `frames` frames after WARMUP: ms of CPU per frame, in all and by part."""
    acc: collections.Counter[str] = collections.Counter()
    busy = threading.local()

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            if getattr(busy, "on", False):  # a part inside another counts once, in the outer one
                return f(*a, **k)
            busy.on = True
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                acc[name] += time.thread_time() - t
                busy.on = False

        return wrapper

    pre = Preprocessor(spec)
    pre.run = timed("preprocess", pre.run)  # type: ignore[method-assign]
    saved = cammod.CutDetector.cut, cammod._owned
    cammod.CutDetector.cut = timed("cut", cammod.CutDetector.cut)  # type: ignore[method-assign]
    cammod._owned = timed("owned", cammod._owned)
    cond, stop = threading.Condition(), threading.Event()
    cfg = CameraConfig(name="c", uri=f"file://{video}", realtime=False, loop=True, scale_in_pipeline=scaled)
    cam = Camera(cfg, pre, cond, stop)
    cam.keep_taken = keep_taken
    stream = cam._stream

    def timed_stream(source: Any) -> tuple[str, bool]:
        source.read = timed("read", source.read)
        return stream(source)

    cam._stream = timed_stream  # type: ignore[method-assign]
    try:
        cam.start()
        cpu0 = 0.0
        for n in range(WARMUP + frames):
            with cond:
                while not cam.has_ready_locked():
                    if not cond.wait(10):
                        raise RuntimeError(f"no frame from the camera in 10 s: {cam.stats}")
                taken = cam.take_locked()
                assert taken is not None
                cam.release_locked(taken[0])
            if n == WARMUP - 1:
                acc.clear()
                cpu0 = thread_cpu_s(cam._thread.native_id or 0)
        cpu = thread_cpu_s(cam._thread.native_id or 0) - cpu0
        parts = {p: acc[p] for p in PARTS}
    finally:
        stop.set()
        with cond:
            cond.notify_all()
        cam.join(10)
        cammod.CutDetector.cut, cammod._owned = saved  # type: ignore[method-assign]
    out = {p: v / frames * 1e3 for p, v in parts.items()}
    out["thread"] = cpu / frames * 1e3
    out["rest"] = out["thread"] - sum(out[p] for p in PARTS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "camera-thread.json")
    args = ap.parse_args()
    demo = fetch_demo(progress=lambda m: None)
    spec = demo.packages["blazeface-back"].manifest.input
    folded = spec.model_copy(update={"dtype": "uint8", "layout": "NHWC", "color": "BGR",
                                     "shape": [spec.shape[0], spec.height, spec.width, 3]})  # fmt: skip
    variants = {
        "folded, crops": (folded, True, False),
        "folded, no crops": (folded, False, False),
        "folded scaled, crops": (folded, True, True),
        "unfolded, crops": (spec, True, False),
        "unfolded, no crops": (spec, False, False),
    }
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f} at the start; {args.frames} frames a run, {args.repeats} repeats")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        for name in variants if rep % 2 == 0 else list(variants)[::-1]:
            got = run(demo.video, *variants[name], args.frames)
            runs[name].append(got)
            print(f"  repeat {rep + 1} {name:>20}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()))
    med = {v: {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]} for v, rs in runs.items()}
    load1 = os.getloadavg()[0]
    print(f"\nCPU ms per frame, medians (load average {load0:.1f} at the start, {load1:.1f} at the end)")
    cols = ["thread", *PARTS, "rest"]
    print(f"  {'':20}" + "".join(f"{c:>11}" for c in cols))
    for v, m in med.items():
        print(f"  {v:20}" + "".join(f"{m[c]:11.3f}" for c in cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"frames": args.frames, "repeats": args.repeats, "load_start": load0, "load_end": load1,
           "medians_ms_per_frame": med, "runs": runs}  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"(wrote {args.out})")


if __name__ == "__main__":
    main()
