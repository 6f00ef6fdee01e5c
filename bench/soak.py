#!/usr/bin/env python3
"""Soak: run the demo pipeline for a long time and report the RSS slope and the governor's cost.

The daemon runs as its own process on the demo config (three cameras, BlazeFace at batch 4) with
the governor sampling every second, against a local mosquitto; telemetry is collected at a
subscriber. Reported: RSS at the start and end, the RSS slope after warm-up (least squares, MB/min;
target about 0), the governor's own CPU time as a share of one core (target < 1 %), and, measured
alone, the cost of one sensor read on this machine and on the largest fixture tree (AGX Orin).

    python bench/soak.py [--minutes 10] [--warmup-s 60] [--out bench/out]

The same daemon under faults (broker kills, SIGSTOP, SIGHUP, camera restarts, an OTA push), with every
result counted and its fds, threads, spool and disk watched too, is bench/soak_chaos.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.host.sensors import Sensors
from edged.models.demo import fetch_demo

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests import sysfs_fixtures  # noqa: E402  (the fixture trees live with the tests)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_cost_ms(sensors: Sensors, n: int = 300) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sensors.read()
        times.append((time.perf_counter() - t0) * 1000)
    return float(statistics.median(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    assets = fetch_demo(progress=lambda m: None)
    work = Path(tempfile.mkdtemp(prefix="edged-soak-"))
    port = free_port()
    (work / "m.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    broker = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(work / "m.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    demo_cfg = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    demo_cfg.update(device_id="soak-01", state_dir=str(work / "state"))
    demo_cfg["mqtt"] = {"host": "127.0.0.1", "port": port}
    demo_cfg["model"]["package"] = str(assets.packages["blazeface-back"].root)
    for cam in demo_cfg["cameras"]:
        if cam["uri"].startswith("file://"):
            cam["uri"] = f"file://{assets.video}"
    demo_cfg["telemetry"] = {"interval_s": 5}
    demo_cfg["governor"] = {"interval_s": 1.0}
    cfg = work / "soak.yaml"
    cfg.write_text(yaml.safe_dump(demo_cfg))

    samples: list[tuple[float, dict[str, Any]]] = []
    lock = threading.Lock()

    def on_message(c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        with lock:
            samples.append((time.monotonic(), json.loads(m.payload)))

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="soak-sub", protocol=mqtt.MQTTv5)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe("edged/soak-01/telemetry", 0)
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    seconds = args.minutes * 60
    print(f"soak: {args.minutes:g} min of the demo pipeline ({len(demo_cfg['cameras'])} cameras), governor every 1 s")
    with open(work / "daemon.log", "wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "edged", "run", "-c", str(cfg), "--duration", str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=REPO,
        )
    t_start = time.monotonic()
    try:
        while daemon.poll() is None:
            time.sleep(5)
            with lock:
                last = samples[-1][1] if samples else None
            if last:
                el = time.monotonic() - t_start
                print(
                    f"  {el:6.0f} s  rss {last['memory']['rss_mb']} MB  inference {last['inference']['fps']} fps  "
                    f"governor {last['governor']['cpu_pct']} % cpu",
                    flush=True,
                )
    except KeyboardInterrupt:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    finally:
        client.disconnect()
        client.loop_stop()
        broker.terminate()
        broker.wait(10)
    if daemon.returncode != 0:
        print((work / "daemon.log").read_text()[-3000:])
        return 1
    with lock:
        pts = [(t - t_start, s) for t, s in samples]
    steady = [(t, s["memory"]["rss_mb"]) for t, s in pts if t >= args.warmup_s]
    t = np.array([p[0] for p in steady])
    v = np.array([p[1] for p in steady])
    slope = float(np.polyfit(t, v, 1)[0]) * 60.0
    gov_cpu = pts[-1][1]["governor"]["cpu_pct"]
    here = Sensors(Path("/"))
    fixture = Sensors(sysfs_fixtures.agx_orin_jp5(work / "agx"))
    res = {
        "minutes": args.minutes,
        "samples": len(pts),
        "rss_start_mb": pts[0][1]["memory"]["rss_mb"],
        "rss_after_warmup_mb": float(v[0]),
        "rss_end_mb": float(v[-1]),
        "rss_peak_mb": max(s["memory"]["peak_rss_mb"] for _, s in pts),
        "rss_slope_mb_per_min": round(slope, 4),
        "daemon_reported_slope_mb_per_min": pts[-1][1]["memory"].get("rss_slope_mb_per_min"),
        "governor_cpu_pct_of_a_core": gov_cpu,
        "sensor_read_ms_this_machine": round(read_cost_ms(here), 4),
        "sensor_read_ms_agx_orin_fixture": round(read_cost_ms(fixture), 4),
        "cpu_count": os.cpu_count(),
    }
    shutil.rmtree(work, ignore_errors=True)
    (args.out / "soak.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
