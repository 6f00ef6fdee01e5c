"""The measuring side of bench/pipeline_cpu.py: the daemon's own CPU time per frame by stage, taken inside a
spawned child that runs the real daemon (edged.daemon.app.Daemon), without changing what its threads do.

Two clocks, both read from the daemon's process:

- each thread's CPU clock (CLOCK_THREAD_CPUTIME_ID through ``time.pthread_getcpuclockid``, read from a
  sampler thread, nanoseconds) at the start and the end of a window past the warm-up: what the camera,
  gather, inference, decode, publisher and network threads spent; threads Python did not start (FFmpeg's
  and OpenCV's worker pools, ONNX Runtime's) from ``/proc/self/task/<tid>/stat`` (clock ticks), by name;
- a few methods wrapped in the child only (``Preprocessor.run``, ``Scenes.process``, ``Daemon._on_result``,
  ``Publisher._spool_one`` and ``_deliver``, ``Spool.commit``, ``InferenceLoop._run_batch``) with the calling
  thread's CPU clock (``time.thread_time``) and wall clock around each call, to split a thread between two
  stages (a camera thread reads and decodes, then preprocesses). Each wrapped call costs two clock reads a
  side, about a microsecond.

The stages, ms of CPU per frame inferred in the window:

  capture      camera threads less their preprocessing: reading and decoding the video (plus FFmpeg's
               own threads, listed apart as native)
  preprocess   Preprocessor.run in the camera threads: letterbox into the slot (and, unfolded, to float)
  gather       the gather thread: frames into the batch buffer (one copy a frame)
  inference    the inference thread (the engine's own work where it runs on this thread; a stand-in sleeps)
  decode       the decode thread less the result sink: the model's decoder
  scenes       Scenes.process (per-camera settings, tracks, zones, events)
  handoff      the rest of the sink: telemetry, the control channel's counters, Publisher.submit
  publish      the publisher thread: payload, JSON, spool, commit, handing to paho (its parts apart:
               Publisher._spool_one, Spool.commit, Publisher._deliver)
  network      the MQTT network thread (paho's socket I/O)
  other        the daemon's other Python threads (main, governor, health, commands, ...)
  native       threads Python did not start (decoder and OpenCV pools, ONNX Runtime's), by name
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

STAGES = (
    "capture",
    "preprocess",
    "gather",
    "inference",
    "decode",
    "scenes",
    "handoff",
    "publish",
    "network",
    "other",
    "native",
)
CAMERA_SIDE = ("capture", "preprocess", "gather")  # capture to batch slot
WRAPPED = ("preprocess", "scenes", "sink", "spool_one", "commit", "deliver", "run_batch")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Accounts:
    """Per-thread accumulators of the wrapped calls: {stage: [cpu_s, wall_s, calls]} a thread (no lock on the
    hot path: each thread writes its own; a snapshot sums them)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[dict[str, list[float]]] = []
        self._lock = threading.Lock()

    def mine(self) -> dict[str, list[float]]:
        acc: dict[str, list[float]] | None = getattr(self._local, "acc", None)
        if acc is None:
            acc = {s: [0.0, 0.0, 0.0] for s in WRAPPED}
            self._local.acc = acc
            with self._lock:
                self._all.append(acc)
        return acc

    def snapshot(self) -> dict[str, list[float]]:
        with self._lock:
            accs = list(self._all)
        return {s: [sum(a[s][i] for a in accs) for i in range(3)] for s in WRAPPED}


ACCOUNTS = Accounts()


def _wrap(cls: Any, name: str, stage: str) -> None:
    orig = getattr(cls, name)

    @functools.wraps(orig)
    def timed(*args: Any, **kwargs: Any) -> Any:
        acc = ACCOUNTS.mine()[stage]
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            acc[0] += time.thread_time() - c0
            acc[1] += time.perf_counter() - w0
            acc[2] += 1

    setattr(cls, name, timed)


def install() -> None:
    """Wrap the stage methods (in this process only: the bench's spawned child)."""
    from edged.daemon.app import Daemon
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.daemon.delivery.publisher import Publisher
    from edged.daemon.delivery.spool import Spool
    from edged.daemon.inference import InferenceLoop
    from edged.daemon.scene.scenes import Scenes

    _wrap(Preprocessor, "run", "preprocess")
    _wrap(Scenes, "process", "scenes")
    _wrap(Daemon, "_on_result", "sink")
    _wrap(Publisher, "_spool_one", "spool_one")
    _wrap(Publisher, "_deliver", "deliver")
    _wrap(Spool, "commit", "commit")
    _wrap(InferenceLoop, "_run_batch", "run_batch")


def _native_cpu() -> dict[int, tuple[str, float]]:
    """tid -> (name, CPU seconds) of every thread of this process, from /proc (clock ticks)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) * _TICK_S)  # utime, stime
    return out


def snapshot(loop: Any, publisher: Any) -> dict[str, Any]:
    """Every thread's CPU time now, the wrapped calls' sums, and the counters that give the frames."""
    py: dict[int, tuple[str, float]] = {}
    for t in threading.enumerate():
        if t.ident is None or t.native_id is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except OSError:  # ended meanwhile
            continue
        py[t.native_id] = (t.name, cpu)
    return {
        "wall": time.perf_counter(),
        "process": time.process_time(),
        "python": py,
        "native": {tid: v for tid, v in _native_cpu().items() if tid not in py},
        "wrapped": ACCOUNTS.snapshot(),
        "frames": loop.stats.rows,
        "batches": loop.stats.batches,
        "captured": sum(c.stats.frames for c in loop.cameras),
        "spooled": publisher.spooled,
    }


def _delta(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by thread name over the window (threads alive at its end; one that started in it counts
    from zero)."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in b.items():
        out[name] = out.get(name, 0.0) + cpu - a.get(tid, (name, 0.0))[1]
    return out


def account(a: dict[str, Any], b: dict[str, Any], engine_row_bytes: int) -> dict[str, Any]:
    """The stages' CPU (and, where a call is wrapped, wall) ms per frame inferred between snapshots a and b."""
    frames = b["frames"] - a["frames"]
    if frames <= 0:
        raise RuntimeError("no frame was inferred in the measuring window")
    threads = _delta(a["python"], b["python"])
    native = _delta(a["native"], b["native"])
    w = {s: [b["wrapped"][s][i] - a["wrapped"][s][i] for i in range(3)] for s in WRAPPED}
    cam = sum(v for k, v in threads.items() if k.startswith("camera-"))
    known = {"gather", "inference", "decode", "publisher", "mqtt-network"}
    other = sum(v for k, v in threads.items() if k not in known and not k.startswith("camera-"))
    cpu_s = {
        "capture": cam - w["preprocess"][0],
        "preprocess": w["preprocess"][0],
        "gather": threads.get("gather", 0.0),
        "inference": threads.get("inference", 0.0),
        "decode": threads.get("decode", 0.0) - w["sink"][0],
        "scenes": w["scenes"][0],
        "handoff": w["sink"][0] - w["scenes"][0],
        "publish": threads.get("publisher", 0.0),
        "network": threads.get("mqtt-network", 0.0),
        "other": other,
        "native": sum(native.values()),
    }
    wall_s = {"preprocess": w["preprocess"][1], "inference": w["run_batch"][1], "scenes": w["scenes"][1]}
    window = b["wall"] - a["wall"]
    per = {k: v * 1000.0 / frames for k, v in cpu_s.items()}
    return {
        "frames": frames,
        "captured": b["captured"] - a["captured"],
        "window_s": window,
        "frames_per_s": frames / window,
        "cpu_ms": per,
        "wall_ms": {k: v * 1000.0 / frames for k, v in wall_s.items()},
        "camera_side_ms": sum(per[k] for k in CAMERA_SIDE),
        "threads_ms": sum(per.values()),
        "process_ms": (b["process"] - a["process"]) * 1000.0 / frames,
        "native_by_name_ms": {k: v * 1000.0 / frames for k, v in sorted(native.items()) if v > 0},
        # the publisher thread's parts: numbering, encoding and appending each result (spool_one), committing
        # the spool (commit, SQLite), handing rows to paho and deleting acknowledged ones (deliver)
        "publish_parts_ms": {k: w[k][0] * 1000.0 / frames for k in ("spool_one", "commit", "deliver")},
        "engine_bytes_per_frame": engine_row_bytes,
    }


def cpu_child(cfg_path: str, seconds: float, skip_s: float, stand_in: Any, out: str) -> None:
    """The daemon for `seconds` with the stage clocks; its accounts over [skip_s, seconds - 1] to `out`."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    install()
    from edged.daemon.app import Daemon
    from edged.daemon.config import load_config

    cfg = load_config(cfg_path)
    daemon = Daemon(cfg, stand_in() if stand_in is not None else None)
    box: dict[str, Any] = {}

    def sample() -> None:
        t0 = time.monotonic()
        deadline = t0 + seconds
        while time.monotonic() < deadline and not getattr(getattr(daemon, "loop", None), "stats", None):
            time.sleep(0.05)
        time.sleep(max(0.0, t0 + skip_s - time.monotonic()))
        a = snapshot(daemon.loop, daemon.publisher)
        time.sleep(max(0.0, t0 + seconds - 1.0 - time.monotonic()))
        b = snapshot(daemon.loop, daemon.publisher)
        row = daemon.loop.cameras[0].rows[0]
        box["acc"] = account(a, b, int(row.nbytes))
        box["acc"]["engine_dtype"] = str(row.dtype)

    sampler = threading.Thread(target=sample, name="bench-sampler", daemon=True)
    sampler.start()
    daemon.run(duration_s=seconds, install_signals=False)
    sampler.join(10)
    if "acc" not in box:
        raise SystemExit("the sampler took no measurement")
    Path(out).write_text(json.dumps(box["acc"]))
