#!/usr/bin/env python3
"""Shadow evaluation: its cost to the serving model, in one run (a benchmark script, not a test).

A real daemon serves the demo video from its store (BlazeFace, ONNX Runtime on the CPU) to a local
mosquitto; `edged push --shadow` offers the same model as the next version with the default sample rate
(1 frame/s per camera) and an evidence bar it cannot reach in the window (so it stays ``running``). Each
repeat starts a fresh daemon and measures a window without shadow, then one while the device shadows
(its retained ``…/shadow`` report says ``running`` and counts frames):

  throughput  two cameras played as fast as inference takes frames (``realtime: false``): results per
              second at the subscriber. ratio = shadowing / not (goal >= 0.9)
  latency     two cameras at LATENCY_FPS (5 frames/s each, well under capacity): capture-to-publish per
              result (the subscriber's arrival time - the result's captured_at; one machine, one clock),
              p50 and p99, and the batch
              interval (median gap between the daemon's batches). Goal: p99 grows by at most one interval

Medians over --repeats, each repeat's windows back to back, so the machine's load (other processes)
hits both alike as far as it can. Also kept: the candidate's hold on serving (``hold_ms`` of its report: the
wall time of one candidate batch, which a serving batch may wait behind; p50 and max). The machine's load
average is read at the start, at each window and at the end, and the result's `note` says from those figures
whether the machine was quiet or shared (this benchmark's own daemon and pusher count for up to OWN_LOAD).

    python bench/shadow.py [--seconds 20] [--repeats 3] [--out bench/results/shadow.json]
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from common_rig import MODEL, REPO, PackageRig, parser, write_results
from paho.mqtt.enums import CallbackAPIVersion

DEVICE = "bench-01"
LATENCY_FPS = 5.0  # each camera's rate in the latency windows: well under what the loaded machine serves
REPORT_EVERY_S = 5.0  # about how often a device publishes its running report (protocol/shadow.py's device)
BATCH_GAP_S = 0.003  # results made closer than this came from one batch
OWN_LOAD = 1.5  # what this benchmark adds to the load average itself: a saturated daemon (1 thread) and its pusher
QUIET_PER_CORE = 0.5  # a load average under this per core besides our own: nothing else to speak of was running


class Recorder:
    """Every result's arrival (wall clock, monotonic) and the newest shadow report."""

    def __init__(self, port: int) -> None:
        self.results: list[tuple[float, float, dict[str, Any]]] = []  # (monotonic, wall, doc)
        self.shadow: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(f"edged/{DEVICE}/#", qos=1)
        self.c.on_subscribe = lambda *a: ready.set()
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        if not ready.wait(10):
            raise SystemExit("the recorder could not subscribe")

    def _on(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        mono, wall = time.monotonic(), time.time()
        if "/results/" in m.topic:
            with self.lock:
                self.results.append((mono, wall, json.loads(m.payload)))
        elif m.topic.endswith("/shadow") and m.payload:
            with self.lock:
                self.shadow = json.loads(m.payload)

    def shadowing(self, since: float) -> bool:
        """A report of a shadow begun after `since` (wall clock) says it runs and has frames in."""
        with self.lock:
            doc = self.shadow
        running = doc.get("state") == "running" and float(doc.get("started") or 0) >= since
        return running and int(doc.get("totals", {}).get("frames") or 0) >= 1

    def shadow_counts(self) -> tuple[int, int]:
        """(frames the candidate ran, sampled frames it skipped) so far, from the newest report."""
        with self.lock:
            doc = self.shadow
        return int(doc.get("totals", {}).get("frames") or 0), int(doc.get("evidence", {}).get("skipped") or 0)

    def window(self, seconds: float, loads: list[float]) -> list[tuple[float, float, dict[str, Any]]]:
        """The results that arrived in the next `seconds`; the 1-minute load average at its end into `loads`."""
        start = time.monotonic()
        time.sleep(seconds)
        loads.append(os.getloadavg()[0])
        with self.lock:
            return [r for r in self.results if start <= r[0] < start + seconds]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def captured(doc: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(doc["captured_at"].replace("Z", "+00:00")).timestamp()


def figures(window: list[tuple[float, float, dict[str, Any]]], seconds: float) -> dict[str, float]:
    """Results per second; capture-to-publish p50/p99 (ms: arrival - captured_at); the batch interval (ms): the
    median gap between the daemon's batches, each batch's results made at one moment (captured_at +
    capture_to_result, within BATCH_GAP_S of each other)."""
    lat = sorted((wall - captured(doc)) * 1000.0 for _, wall, doc in window)
    made = sorted(captured(doc) + doc["latency_ms"]["capture_to_result"] / 1000.0 for _, _, doc in window)
    batches = made[:1]
    for t in made[1:]:
        if t - batches[-1] > BATCH_GAP_S:
            batches.append(t)
    gaps = [b - a for a, b in itertools.pairwise(batches)]
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {
        "results_per_s": len(window) / seconds,
        "p50_ms": q[49],
        "p99_ms": q[98],
        "batch_interval_ms": statistics.median(gaps) * 1000.0 if gaps else float("nan"),
    }


def machine_note(cores: int, start: float, windows: list[float], end: float) -> str:
    """Whether the machine was quiet or shared, from its load average: before the benchmark ran (`start`) and at
    the end of each window (`windows`, this benchmark's own load in them up to OWN_LOAD)."""
    most = max(windows, default=end)
    quiet = QUIET_PER_CORE * cores
    during = f"{min(windows):.1f}-{most:.1f} at the windows' ends" if windows else "none read during the windows"
    figures = f"load average {start:.1f} at the start, {during}, {end:.1f} at the end, on {cores} cores"
    if start < quiet and most <= OWN_LOAD + quiet:
        return f"{figures}: quiet (nothing to speak of ran beside this benchmark's own daemon)"
    others = max(start, most - OWN_LOAD)
    return (
        f"{figures}: shared (other work added about {others:.1f} to the load): "
        "read the ratios measured side by side, not the absolute rates"
    )


def hold_figures(report: dict[str, Any]) -> dict[str, float | None]:
    """The candidate's hold on serving in a report: one candidate batch's wall time, p50 and max (ms)."""
    hold = report.get("hold_ms") or {}
    return {"p50": hold.get("p50"), "max": hold.get("max"), "batches": hold.get("batches")}


def run_once(
    rig: PackageRig, mode: str, seconds: float, rep: int, loads: list[float]
) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
    """One daemon: a window without shadow, then one while it shadows. (without, with, the report then)."""
    work, broker, demo = rig.work, rig.broker, rig.demo
    state = work / f"state-{mode}-{rep}"
    fast = mode == "throughput"
    cams = [
        {
            "name": f"cam{i}",
            "uri": f"file://{demo.video}",
            "loop": True,
            "fps_max": 240 if fast else LATENCY_FPS,
            "realtime": not fast,
        }
        for i in (1, 2)
    ]
    cfg = {
        "device_id": DEVICE,
        "state_dir": str(state),
        "mqtt": {"host": "127.0.0.1", "port": broker.port},
        "model": {"name": MODEL, "keys_dir": str(rig.trusted), "onnxruntime": {"threads": 1}, "probation_s": 3600},
        "cameras": cams,
        "telemetry": {"interval_s": 10},
    }
    cfg_path = work / f"{mode}-{rep}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = [sys.executable, "-m", "edged"]
    rig.install(1, cfg_path)
    rec = Recorder(broker.port)
    log = open(work / f"daemon-{mode}-{rep}.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen([*run, "run", "-c", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    pusher: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 180
        while len(rec.results) < 60:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not serve: {(work / f'daemon-{mode}-{rep}.log').read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(3)  # past the first batches' warm-up
        without = figures(rec.window(seconds, loads), seconds)
        pushed_at = time.time()
        push_log = open(work / f"push-{mode}-{rep}.log", "wb")  # noqa: SIM115
        pusher = subprocess.Popen(
            [
                *run,
                "push",
                str(rig.package(2)),
                "--device",
                DEVICE,
                "--port",
                str(broker.port),
                "--shadow",
                "--min-frames",
                "1000000",
                "--max-s",
                "3600",
                "--state",
                str(work / f"rollout-{mode}-{rep}.json"),
            ],
            stdout=push_log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        deadline = time.monotonic() + 300
        while not rec.shadowing(pushed_at):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(
                    f"no shadow report running: {rec.shadow}; {(work / f'push-{mode}-{rep}.log').read_text()}"
                )
            time.sleep(0.2)
        frames0, skipped0 = rec.shadow_counts()
        with_shadow = figures(rec.window(seconds, loads), seconds)
        time.sleep(REPORT_EVERY_S)  # the report that covers the window's end
        frames1, skipped1 = rec.shadow_counts()
        with_shadow["candidate_frames_per_s"] = (frames1 - frames0) / (seconds + REPORT_EVERY_S)
        with_shadow["candidate_skipped_per_s"] = (skipped1 - skipped0) / (seconds + REPORT_EVERY_S)
        report = dict(rec.shadow)
        return without, with_shadow, report
    finally:
        if pusher is not None and pusher.poll() is None:
            pusher.terminate()
            pusher.wait(30)
        daemon.terminate()
        daemon.wait(60)
        rec.close()


def main() -> int:
    ap = parser(__doc__, "shadow.json")
    ap.add_argument("--seconds", type=float, default=20.0, help="each window")
    args = ap.parse_args()
    rig = PackageRig("edged-bench-shadow-")
    cores = os.cpu_count() or 1
    load_start = os.getloadavg()[0]
    loads: list[float] = []  # at each window's end
    print(f"machine: {platform.machine()}, {cores} cores, load average {load_start:.1f} at the start", flush=True)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {cores} cores",
        "note": "",  # from the load average, at the end (`machine_note`)
        "load_average_start": round(load_start, 1),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "sample_fps": 1.0,
    }
    try:
        for mode in ("throughput", "latency"):
            rows = []
            holds = []
            for rep in range(args.repeats):
                without, with_shadow, report = run_once(rig, mode, args.seconds, rep, loads)
                rows.append((without, with_shadow))
                hold = hold_figures(report)
                holds.append(hold)
                totals = report.get("totals", {})
                print(
                    f"{mode} #{rep + 1}: {without['results_per_s']:.1f} -> {with_shadow['results_per_s']:.1f} "
                    f"results/s; p99 {without['p99_ms']:.0f} -> {with_shadow['p99_ms']:.0f} ms; batch interval "
                    f"{without['batch_interval_ms']:.0f} ms; the candidate ran "
                    f"{with_shadow['candidate_frames_per_s']:.2f} frames/s (skipped "
                    f"{with_shadow['candidate_skipped_per_s']:.2f}/s); shadow {totals.get('frames')} frames, "
                    f"agreement {totals.get('agreement')}; hold p50 {hold['p50']} / max {hold['max']} ms over "
                    f"{hold['batches']} candidate batches; load average {loads[-2]:.1f}, {loads[-1]:.1f}",
                    flush=True,
                )
            med: dict[str, Any] = {
                key: {
                    "without": round(statistics.median(w[key] for w, _ in rows), 2),
                    "with": round(statistics.median(s[key] for _, s in rows), 2),
                }
                for key in ("results_per_s", "p50_ms", "p99_ms", "batch_interval_ms")
            }
            for key in ("candidate_frames_per_s", "candidate_skipped_per_s"):
                med[key] = round(statistics.median(s[key] for _, s in rows), 2)
            med["throughput_ratio"] = round(
                statistics.median(s["results_per_s"] / w["results_per_s"] for w, s in rows), 3
            )
            med["p99_growth_in_batch_intervals"] = round(
                statistics.median((s["p99_ms"] - w["p99_ms"]) / w["batch_interval_ms"] for w, s in rows), 2
            )
            p50s = [h["p50"] for h in holds if h["p50"] is not None]
            maxes = [h["max"] for h in holds if h["max"] is not None]
            med["hold_ms"] = {  # over the repeats: the median of each report's p50, the largest max
                "p50": round(statistics.median(p50s), 1) if p50s else None,
                "max": round(max(maxes), 1) if maxes else None,
                "per_repeat": holds,
            }
            out[mode] = med
    finally:
        rig.close()
    load_end = os.getloadavg()[0]
    out["load_average_end"] = round(load_end, 1)
    out["load_average_windows"] = [round(v, 1) for v in loads]
    out["note"] = machine_note(cores, load_start, loads, load_end)
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
