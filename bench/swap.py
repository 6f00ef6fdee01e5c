#!/usr/bin/env python3
"""Hot swap gap and OTA throughput, in one run, against a local mosquitto and a real daemon process.

gap         a daemon serves the demo video (one camera, --fps frames/s, so one result per batch) from
            the store; `edged push` swaps in a new version --swaps times. For each swap: the longest
            gap between consecutive results around it, in batch intervals (the median gap between
            results before it), as the subscriber sees them (arrival) and as the daemon made them
            (produced: captured_at + capture_to_result, so without the delivery's own jitter). Target:
            <= 2 intervals when both models fit (side by side). The default --fps is the video's own
            rate (15): every frame is kept, so results come at regular intervals. Below it the kept
            frames are uneven (at 10 fps, 67 and 133 ms apart), and the longest gap with no swap at all
            was already 1.7-1.8 median intervals.
ota         `edged push` of a package carrying --mb MiB to the same daemon; throughput = bytes /
            (first "downloading" -> "verifying" on the device's ota/status), median of --repeats.
ceiling     the same bytes in the same chunk size published by one paho client to another through
            the same broker (QoS 0): what MQTT itself does here. ratio = ota / ceiling.

  python bench/swap.py [--swaps 7] [--mb 20] [--repeats 3] [--fps 15]
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from common_rig import MODEL, REPO, PackageRig, parser, write_results
from paho.mqtt.enums import CallbackAPIVersion


class Recorder:
    """Arrival time (monotonic) of every message under a pattern."""

    def __init__(self, port: int, pattern: str) -> None:
        self.items: list[tuple[float, str, bytes]] = []
        self.lock = threading.Lock()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(pattern, qos=1)
        self.c.on_subscribe = lambda *a: ready.set()
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        ready.wait(10)

    def _on(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.items.append((time.monotonic(), m.topic, bytes(m.payload)))

    def results(self) -> list[tuple[float, int]]:
        """(arrival time, model version) of every result."""
        with self.lock:
            return [(t, json.loads(p)["model"]["version"]) for t, topic, p in self.items if "/results/" in topic]

    def produced(self) -> list[tuple[float, int]]:
        """(the time the daemon made it: captured_at + capture_to_result, wall clock, model version)."""
        with self.lock:
            docs = [json.loads(p) for _, topic, p in self.items if "/results/" in topic]
        out = []
        for d in docs:
            captured = dt.datetime.fromisoformat(d["captured_at"].replace("Z", "+00:00")).timestamp()
            out.append((captured + d["latency_ms"]["capture_to_result"] / 1000.0, d["model"]["version"]))
        return sorted(out)

    def ota(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(t, json.loads(p)) for t, topic, p in self.items if topic.endswith("/ota/status") and p]


def push(port: int, tar: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "edged", "push", str(tar), "--device", "bench-01", "--port", str(port)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    if r.returncode != 0:
        raise SystemExit(f"push failed:\n{r.stderr}")


def gap_around(res: list[tuple[float, int]], version: int, interval: float) -> float:
    """The longest gap between consecutive results from three before the first of `version` to three after."""
    first_new = next(i for i, (_, v) in enumerate(res) if v == version)
    window = [t for t, _ in res[max(0, first_new - 3) : first_new + 4]]
    return max(b - a for a, b in itertools.pairwise(window)) / interval


def median_interval(res: list[tuple[float, int]]) -> float:
    times = [t for t, _ in res[-40:]]
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def stop_the_world(cfg_path: Path, rec: Recorder, package: Any, version: int, n: int) -> tuple[list[float], int]:
    from edged.daemon.app import Daemon
    from edged.daemon.config import load_config
    from edged.daemon.lifecycle.manager import estimate_mb
    from edged.models.signing import TrustStore
    from edged.models.store import Store

    logging.getLogger().setLevel(logging.WARNING)
    cfg = load_config(cfg_path)
    daemon = Daemon(cfg)
    t = threading.Thread(target=daemon.run, kwargs={"install_signals": False})
    t.start()
    store, trust = Store(cfg.state_dir), TrustStore.load(cfg.model.keys_dir)
    gaps: list[float] = []
    try:
        mark = len(rec.results())
        while len(rec.results()) < mark + 40:
            time.sleep(0.2)
        for _ in range(n):
            version += 1
            time.sleep(3)
            interval = median_interval(rec.results())
            _, stage = store.stage(package(version), trust)
            assert stage is not None
            cur_mb = daemon.models.active.backend.memory_bytes / 2**20
            new_mb = estimate_mb(daemon.package) + 0.01
            daemon.models._rss_mb = lambda c=cur_mb, m=new_mb: cfg.memory.budget_mb - m + c / 2  # both do not fit
            mode = daemon.models.install_staged(stage)["mode"]
            while not any(v == version for _, v in rec.results()[-5:]):
                time.sleep(0.1)
            time.sleep(2)
            gaps.append(gap_around(rec.results(), version, interval))
            print(f"{mode} swap to v{version}: longest gap {gaps[-1]:.2f} intervals of {interval * 1000:.0f} ms")
    finally:
        daemon.request_stop()
        t.join(30)
    return gaps, version


def ceiling(port: int, total: int, chunk: int) -> float:
    """MiB/s of `total` bytes in `chunk`-sized QoS 0 messages from one paho client to another."""
    got = [0]
    done = threading.Event()
    rx = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ready = threading.Event()
    rx.on_connect = lambda c, u, f, rc, p: c.subscribe("bench/ceiling", qos=0)
    rx.on_subscribe = lambda *a: ready.set()

    def on(c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        got[0] += len(m.payload)
        if got[0] >= total:
            done.set()

    rx.on_message = on
    rx.connect("127.0.0.1", port)
    rx.loop_start()
    ready.wait(10)
    tx = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    tx.max_queued_messages_set(0)
    tx.connect("127.0.0.1", port)
    tx.loop_start()
    data = os.urandom(chunk)
    t0 = time.monotonic()
    for _ in range(-(-total // chunk)):
        tx.publish("bench/ceiling", data, qos=0)
    done.wait(120)
    seconds = time.monotonic() - t0
    for c in (tx, rx):
        c.disconnect()
        c.loop_stop()
    return got[0] / 2**20 / seconds


def main() -> int:
    ap = parser(__doc__, "swap.json")
    ap.add_argument("--swaps", type=int, default=7)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--fps", type=float, default=15.0, help="the camera's fps_max (the demo video's rate: 15)")
    args = ap.parse_args()
    rig = PackageRig("edged-bench-swap-")
    work, broker, demo, package = rig.work, rig.broker, rig.demo, rig.package
    cfg = {
        "device_id": "bench-01",
        "state_dir": str(work / "state"),
        "mqtt": {"host": "127.0.0.1", "port": broker.port},
        "model": {"name": MODEL, "keys_dir": str(rig.trusted), "onnxruntime": {"threads": 1}},
        "cameras": [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "fps_max": args.fps}],
        "inference": {"max_wait_ms": 5},
        "telemetry": {"interval_s": 10},
    }
    cfg_path = work / "bench.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    rig.install(1, cfg_path)
    rec = Recorder(broker.port, "edged/bench-01/#")
    log = open(work / "daemon.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-m", "edged", "run", "-c", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
    )
    try:
        while len(rec.results()) < 30:
            time.sleep(0.2)
        gaps: list[float] = []
        made: list[float] = []
        controls: list[float] = []
        version = 1
        for _ in range(args.swaps):
            version += 1
            time.sleep(6)
            before = rec.results()
            interval = median_interval(before)
            push(broker.port, package(version))
            while not any(v == version for _, v in rec.results()[-5:]):
                time.sleep(0.1)
            time.sleep(2)
            gaps.append(gap_around(rec.results(), version, interval))
            made.append(gap_around(rec.produced(), version, median_interval(rec.produced()[: len(before)])))
            quiet = [t for t, _ in before[-40:-33]]  # seconds before the push: no swap anywhere near
            controls.append(max(b - a for a, b in itertools.pairwise(quiet)) / interval)
            print(
                f"swap to v{version}: batch interval {interval * 1000:.0f} ms, longest gap {gaps[-1]:.2f} intervals "
                f"(produced {made[-1]:.2f}; control {controls[-1]:.2f})"
            )
        blob = work / "payload.bin"
        blob.write_bytes(os.urandom(args.mb << 20))
        rates: list[float] = []
        for _ in range(args.repeats):
            version += 1
            tar = package(version, {"payload.bin": blob})
            mark = len(rec.ota())
            push(broker.port, tar)
            statuses = rec.ota()[mark:]
            t0 = next(t for t, d in statuses if d["state"] == "downloading")
            t1 = next(t for t, d in statuses if d["state"] == "verifying")
            total = next(d["total"] for _, d in statuses if d.get("total"))
            rates.append(total / 2**20 / (t1 - t0))
            print(f"ota: {total / 2**20:.1f} MiB in {t1 - t0:.2f} s = {rates[-1]:.1f} MiB/s")
        daemon.terminate()
        daemon.wait(30)
        stw, version = stop_the_world(cfg_path, rec, package, version, args.swaps)
        top = statistics.median(ceiling(broker.port, args.mb << 20, 256 * 1024) for _ in range(args.repeats))
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)
        rig.close()
    out = {
        "swaps": args.swaps,
        "gap_intervals": [round(g, 2) for g in gaps],
        "gap_intervals_median": round(statistics.median(gaps), 2),
        "gap_intervals_max": round(max(gaps), 2),
        "produced_gap_intervals": [round(g, 2) for g in made],
        "produced_gap_intervals_max": round(max(made), 2),
        "control_gap_intervals_median": round(statistics.median(controls), 2),
        "control_gap_intervals_max": round(max(controls), 2),
        "stop_the_world_gap_intervals": [round(g, 2) for g in stw],
        "stop_the_world_gap_intervals_median": round(statistics.median(stw), 2),
        "ota_mib_s_median": round(statistics.median(rates), 1),
        "mqtt_ceiling_mib_s_median": round(top, 1),
        "ota_over_ceiling": round(statistics.median(rates) / top, 2),
        "ota_mib": args.mb,
        "fps": args.fps,
    }
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
