#!/usr/bin/env python3
"""The device check's GPU steps (scripts/device-check.sh runs it after scripts/gpu-check.sh's engine tests).

On a machine with TensorRT, pycuda and an NVIDIA GPU, in one run, on the demo BlazeFace package:

  loop       50 open/infer/close cycles on one worker thread (as the daemon's inference thread does),
             printing free device memory and the thread's CUDA context-stack depth every 10 cycles;
             both must stay flat (free memory within 32 MiB, depth 0 after every close)
  baseline   free device memory before an open and after its close, the same within 16 MiB
  refusal    on 11.x: a package claiming a 10.x plan is refused (IncompatibleEngine) before TensorRT
             deserialises it (its plan bytes are garbage, so reaching TensorRT would fail otherwise)
  fp16       on 10.12+: an fp16 ONNX model built strongly typed (the precision comes from the model),
             against ONNX Runtime (the engine tests' tolerance)
  eta        the daemon end to end (`edged run --duration`, synthetic cameras so decoding is not the bound,
             its own count of results while serving) against a tight loop over the same engine:
             eta = e2e / raw
  int8       `build-engine --calib` on the float model with Python warnings as errors (-W error):
             edged's Q/DQ quantizer (with its search for the layers to keep in float), no TensorRT
             calibrator on any version; its outputs against ONNX Runtime's on the float model
             (cosine >= 0.95)

Every step prints PASS, FAIL or SKIP with its reason; `--dry-run REASON` skips them all (exit 0). Exit 1
when a step fails. Steps that would not fit the time left (`--budget-s`) are skipped with that reason.

    python bench/device_check.py [--budget-s 420] [--dry-run REASON]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
MIB = 1 << 20
LOOP_CYCLES = 50
LOOP_FLAT_MIB = 32
BASELINE_MIB = 16
INT8_COSINE = 0.95
ETA_SECONDS = 20
ETA_CAMERAS = 8
# (name, what it checks, seconds it may take on an H200 class GPU, builds included)
# in this order: the quick ones first, the INT8 build (its Q/DQ search runs ONNX Runtime on the CPU) last
STEPS = (
    ("loop", f"threaded open/infer/close x{LOOP_CYCLES}: free device memory and context-stack depth flat", 60),
    ("baseline", "GPU memory back to baseline after close", 20),
    ("refusal", "a 10.x plan refused on 11.x before deserialising", 10),
    ("fp16", "FP16 strongly typed build (TensorRT 10.12+) against ONNX Runtime", 90),
    ("eta", "eta on the GPU: daemon end to end / tight loop over the same engine", 60),
    ("int8", "calibrated INT8 build, warnings as errors, against ONNX Runtime", 150),
)
# the check builds (int8, fp16) test correctness, not speed: a low builder optimization level builds faster
CHECK_BUILD = ["--opt-level", "1"]


class Skip(Exception):
    """A step that cannot run here; its message is the reason."""


class Fail(Exception):
    """A step whose check did not hold; its message says how."""


@dataclass
class Env:
    tmp: Path
    demo: Any  # edged.models.demo.DemoAssets
    engine: Path  # the default build of the demo package (an engine package folder)
    trt_version: tuple[int, ...]
    say: Callable[[str], None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds these steps may take in all (420)")
    ap.add_argument("--dry-run", metavar="REASON", help="skip every step with this reason")
    args = ap.parse_args()
    if args.dry_run:
        for i, (name, what, _) in enumerate(STEPS, 2):
            print(f"[{i}/{len(STEPS) + 1}] {name:<9} {what}: SKIP ({args.dry_run})", flush=True)
        return 0
    deadline = time.monotonic() + args.budget_s
    failed = 0
    with tempfile.TemporaryDirectory(prefix="edged-device-check-") as tmp:
        try:
            env = _prepare(Path(tmp))
        except Skip as exc:
            for i, (name, what, _) in enumerate(STEPS, 2):
                print(f"[{i}/{len(STEPS) + 1}] {name:<9} {what}: SKIP ({exc})", flush=True)
            return 0
        for i, (name, what, estimate) in enumerate(STEPS, 2):
            head = f"[{i}/{len(STEPS) + 1}] {name:<9} {what}"
            left = deadline - time.monotonic()
            if left < estimate:
                print(f"{head}: SKIP (out of time: {left:.0f} s left of the budget, the step takes ~{estimate} s)")
                continue
            start = time.monotonic()
            print(f"{head} ...", flush=True)
            try:
                detail = STEP_FUNCS[name](env)
                print(f"{head}: PASS ({detail}; {time.monotonic() - start:.0f} s)", flush=True)
            except Skip as exc:
                print(f"{head}: SKIP ({exc})", flush=True)
            except Fail as exc:
                failed += 1
                print(f"{head}: FAIL ({exc}; {time.monotonic() - start:.0f} s)", flush=True)
            except Exception as exc:  # a step's crash is its failure; the others still run
                failed += 1
                print(f"{head}: FAIL ({type(exc).__name__}: {exc})", flush=True)
    return 1 if failed else 0


def _prepare(tmp: Path) -> Env:
    from edged.daemon.backends import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason:
        raise Skip(f"needs TensorRT, a CUDA binding (cuda-python or pycuda) and an NVIDIA GPU: {reason}")
    from edged.daemon.backends.tensorrt.api import device_facts, parse_version
    from edged.models.demo import fetch_demo

    facts = device_facts()
    print(f"device: TensorRT {facts.tensorrt}, compute capability {facts.compute_capability}, {facts.platform}")
    demo = fetch_demo()
    cache = tmp / "timing.cache"
    engine = _edged(["build-engine", str(demo.packages["blazeface-back"].root), "--out", str(tmp / "engine")], cache)
    print(f"device: default engine build: {engine}", flush=True)
    return Env(tmp, demo, tmp / "engine", parse_version(str(facts.tensorrt)), print)


def _edged(args: list[str], timing_cache: Path | None = None, timeout: float = 900) -> str:
    """`python -W error -m edged ARGS` (warnings as errors); its last line of output, or Fail with its tail."""
    extra = ["--timing-cache", str(timing_cache)] if timing_cache and args[0] == "build-engine" else []
    r = subprocess.run(
        [sys.executable, "-W", "error", "-m", "edged", *args, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise Fail(f"edged {args[0]} exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    return (r.stdout.strip().splitlines() or [""])[-1]


def _engine_feed(env: Env, pkg_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(the package, its input name, one batch of demo frames preprocessed as the daemon does)"""
    from edged.models.package import verify_folder
    from edged.quantize.frames import read_frames
    from edged.quantize.int8 import calibration_batches

    pkg = verify_folder(pkg_dir)
    spec = pkg.manifest.input
    batch = calibration_batches(spec, read_frames(env.demo.video, limit=spec.batch))[0]
    return pkg, spec.name, {spec.name: batch}


def _open(pkg: Any) -> Any:
    from edged.daemon.backends import open_backend

    return open_backend("engine", pkg.model_path, compatibility=pkg.manifest.compatibility, has_onnx=True)


class Probe:
    """Free device memory and this thread's CUDA context-stack depth, through a primary context it retains
    (so the engines' retain/release never destroys the context between two readings), with the CUDA binding
    the backend uses (cuda_api: cuda-python, else pycuda)."""

    def __init__(self) -> None:
        from edged.daemon.backends.tensorrt.cuda import load_cuda

        self.cuda = load_cuda()
        self.cuda.init()
        self.ctx = self.cuda.retain_primary(0)

    def depth(self) -> int:
        return self.cuda.stack_depth()

    def free_bytes(self) -> int:
        self.cuda.push(self.ctx)
        try:
            return self.cuda.mem_get_info()[0]
        finally:
            self.cuda.pop()

    def close(self) -> None:
        self.cuda.release(self.ctx)


def _on_thread(work: Callable[[], T]) -> T:
    """Run `work` on a fresh thread, as the daemon's inference thread opens, runs and closes engines."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=run, name="device-check-inference")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def step_loop(env: Env) -> str:
    pkg, _, feed = _engine_feed(env, env.engine)

    def work() -> str:
        probe = Probe()
        try:
            frees, depths = [], []
            for cycle in range(1, LOOP_CYCLES + 1):
                with _open(pkg) as backend:
                    for _ in range(3):
                        backend.infer(feed)
                if cycle % 10 == 0:
                    frees.append(probe.free_bytes())
                    # this thread's stack, and the one the engine's own CUDA thread ended with
                    depths.append(probe.depth() + (getattr(backend, "cuda_stack_depth", None) or 0))
                    env.say(
                        f"    cycle {cycle:>2}: free device memory {frees[-1] / MIB:,.1f} MiB "
                        f"({(frees[-1] - frees[0]) / MIB:+.1f} MiB since cycle 10), context-stack depth {depths[-1]} "
                        f"(this thread {probe.depth()}, the engine's CUDA thread at close "
                        f"{getattr(backend, 'cuda_stack_depth', None)}; {probe.cuda.binding})"
                    )
            drift = (max(frees) - min(frees)) / MIB
            if drift > LOOP_FLAT_MIB or any(depths):
                raise Fail(f"not flat: free memory moved {drift:.1f} MiB, context-stack depths {depths}")
            return f"free memory within {drift:.1f} MiB over {LOOP_CYCLES} cycles, context-stack depth 0"
        finally:
            probe.close()

    return _on_thread(work)


def step_baseline(env: Env) -> str:
    pkg, _, feed = _engine_feed(env, env.engine)

    def work() -> str:
        probe = Probe()
        try:
            before = probe.free_bytes()
            backend = _open(pkg)
            backend.infer(feed)
            held = before - probe.free_bytes()
            backend.close()
            after = probe.free_bytes()
            diff = (before - after) / MIB
            if abs(diff) > BASELINE_MIB:
                raise Fail(f"{diff:+.1f} MiB not returned after close (the open engine held {held / MIB:.1f} MiB)")
            return f"the open engine held {held / MIB:.1f} MiB; after close {diff:+.1f} MiB from the baseline"
        finally:
            probe.close()

    return _on_thread(work)


def _compare(env: Env, pkg_dir: Path) -> tuple[float, float]:
    """(cosine, max |error| / max |reference|) of the engine's outputs against ONNX Runtime's on the float model"""
    import numpy as np

    from edged.daemon.backends import OnnxRuntimeBackend

    pkg, _, feed = _engine_feed(env, pkg_dir)
    with _open(pkg) as backend:
        got = backend.infer(feed)
    with OnnxRuntimeBackend(env.demo.packages["blazeface-back"].model_path, threads=1) as ort:
        want = ort.infer(feed)
    cos, rel = 1.0, 0.0
    for name, ref in want.items():
        a, b = got[name].astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        cos = min(cos, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12)))
        rel = max(rel, float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)))
    return cos, rel


def step_int8(env: Env) -> str:
    src = env.demo.packages["blazeface-back"].root
    video = str(env.demo.video)
    out = env.tmp / "int8"
    calibrated = ["--calib", video, "--calib-frames", "32", *CHECK_BUILD]
    _edged(["build-engine", str(src), "--out", str(out), *calibrated], env.tmp / "timing.cache")
    how = "build-engine --calib: Q/DQ by edged's quantizer, checked against float, no calibrator"
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("precision") != "int8":
        raise Fail(f"the package says precision {manifest.get('precision')}, not int8")
    cos, rel = _compare(env, out)
    if cos < INT8_COSINE:
        raise Fail(f"{how}: cosine {cos:.4f} < {INT8_COSINE} against ONNX Runtime (max error {rel:.3f} of range)")
    return f"{how}, no warning; against ONNX Runtime: cosine {cos:.4f}, max error {rel:.3f} of range"


def step_fp16(env: Env) -> str:
    if env.trt_version[:2] < (10, 12):
        raise Skip(f"TensorRT {'.'.join(map(str, env.trt_version))} builds weakly typed (strongly typed from 10.12)")
    src = env.demo.packages["blazeface-back"].root
    video = str(env.demo.video)
    fp16 = env.tmp / "fp16-model"
    out = env.tmp / "fp16"
    frames = ["--eval", video, "--eval-frames", "16"]
    _edged(
        ["quantize", str(src), "--precision", "fp16", "--target", "tensorrt", *frames, "--out", str(fp16), "--force"]
    )
    _edged(["build-engine", str(fp16), "--out", str(out), *CHECK_BUILD], env.tmp / "timing.cache")
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("precision") != "fp16":
        raise Fail(f"the package says precision {manifest.get('precision')}, not fp16")
    cos, rel = _compare(env, out)
    if rel > 0.05:
        raise Fail(f"max error {rel:.4f} of range > 0.05 against ONNX Runtime (cosine {cos:.5f})")
    return f"strongly typed fp16: cosine {cos:.5f}, max error {rel:.4f} of range against ONNX Runtime"


def step_refusal(env: Env) -> str:
    if env.trt_version[0] < 11:
        raise Skip(
            f"TensorRT here is {'.'.join(map(str, env.trt_version))}; refusing a 10.x plan needs 11.x "
            "(the engine tests refuse an 8.5 plan here)"
        )
    from edged.daemon.backends import open_backend
    from edged.models.compat import IncompatibleEngine

    copy = env.tmp / "refusal"
    shutil.copytree(env.engine, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["compatibility"]["tensorrt"] = "10.12.0"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "model.engine").write_bytes(b"not a plan: reaching TensorRT's deserialiser fails otherwise")
    try:
        open_backend("engine", copy / "model.engine", compatibility=manifest["compatibility"], has_onnx=True)
    except IncompatibleEngine as exc:
        if "10.12.0" not in str(exc):
            raise Fail(f"refused, but without naming the plan's TensorRT: {exc}") from exc
        return f"refused before deserialising: {exc}"
    raise Fail("a 10.12 plan (garbage bytes) was opened")


def step_eta(env: Env) -> str:
    import yaml

    pkg, _, feed = _engine_feed(env, env.engine)
    broker, port, how = _broker(env.tmp)
    try:
        cams = [{"name": f"cam{i}", "uri": "synthetic://?width=960&height=540&fps=240"} for i in range(ETA_CAMERAS)]
        doc = {
            "device_id": "device-check",
            "state_dir": str(env.tmp / "state"),
            "log_level": "warning",
            "mqtt": {"host": "127.0.0.1", "port": port},
            "model": {"package": str(env.engine), "backend": "auto"},
            "cameras": cams,
            "inference": {"max_wait_ms": 30, "warmup_batches": 3},
            "detection": {"score_threshold": 0.7},
            "telemetry": {"interval_s": 1},
        }
        cfg = env.tmp / "eta.yaml"
        cfg.write_text(yaml.safe_dump(doc))
        r = subprocess.run(
            [sys.executable, "-m", "edged", "run", "-c", str(cfg), "--duration", str(ETA_SECONDS)],
            capture_output=True,
            text=True,
            timeout=ETA_SECONDS + 120,
        )
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(10)
    # "edged: 148 results in 74 batches over 8.1 s (first batch 3.0 s after the start, then 5.0 s serving); ..."
    said = re.search(r"edged: (\d+) results in \d+ batches over ([\d.]+) s", r.stderr + r.stdout)
    serving = re.search(r"then ([\d.]+) s serving", r.stderr + r.stdout)
    if r.returncode != 0 or said is None:
        raise Fail(f"edged run exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    e2e = int(said.group(1)) / float((serving or said).group(1 if serving else 2))

    def tight() -> float:
        with _open(pkg) as backend:
            batch = int(next(iter(feed.values())).shape[0])
            for _ in range(20):
                backend.infer(feed)
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < 5.0:
                backend.infer(feed)
                n += 1
            return n * batch / (time.perf_counter() - start)

    raw = _on_thread(tight)
    supply = ETA_CAMERAS * 240
    return (
        f"eta {e2e / raw:.3f}: daemon {e2e:.0f} images/s ({ETA_CAMERAS} synthetic cameras, at most {supply}/s; "
        f"results {how}), tight loop {raw:.0f} images/s"
    )


def _broker(tmp: Path) -> tuple[subprocess.Popen[bytes] | None, int, str]:
    """A private mosquitto on 127.0.0.1 where one is installed; else a port nobody listens on (the daemon then
    spools its results, and its own count still gives the rate)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if exe is None:
        return None, port, "spooled: no mosquitto here"
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n")
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port, "published to a private mosquitto"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise Fail("mosquitto did not start")


STEP_FUNCS: dict[str, Callable[[Env], str]] = {
    "loop": step_loop,
    "baseline": step_baseline,
    "refusal": step_refusal,
    "fp16": step_fp16,
    "eta": step_eta,
    "int8": step_int8,
}

if __name__ == "__main__":
    sys.exit(main())
