#!/usr/bin/env python3
"""What one device sends, by publish mode: a real daemon (the demo's three cameras: the demo video at 15 and
5 fps and a 10 fps test pattern, BlazeFace, onnxruntime) against a private mosquitto on 127.0.0.1, run with
every camera's `detection.publish` set to `frames`, `events`, then `both`; a subscriber counts the
messages and payload bytes on each kind of topic over --seconds after the first result or event.

Object events depend on the scene (the demo video is a few people walking past, looped); results do not:
one per inferred frame. The figures feed docs/fleet.md's per-device table and bench/fleet.py's --rate and
--payload.

    python bench/fleet_modes.py [--seconds 30] [--modes frames,events,both] [--out bench/results/fleet.modes]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from fleet import start_broker
from paho.mqtt.enums import CallbackAPIVersion

from edged.models.demo import default_dir, fetch_demo

KINDS = ("results", "events", "status", "telemetry", "model/state")


def kind(topic: str) -> str:
    suffix = topic.split("/", 2)[2]
    return "results" if suffix.startswith("results/") else suffix


def config(port: int, state: Path, mode: str) -> dict[str, Any]:
    demo = fetch_demo(default_dir())
    video = str(demo.video)
    det = {"publish": mode}
    return {
        "device_id": "modes-01",
        "state_dir": str(state),
        "mqtt": {"host": "127.0.0.1", "port": port},
        "model": {"package": str(demo.packages["blazeface-back"].root), "onnxruntime": {"threads": 1}},
        "cameras": [
            {"name": "lobby", "uri": f"file://{video}", "loop": True, "fps_max": 15, "detection": det},
            {"name": "dock", "uri": f"file://{video}", "loop": True, "fps_max": 5, "detection": det},
            {"name": "pattern", "uri": "synthetic://?width=640&height=360&fps=10", "fps_max": 10, "detection": det},
        ],
        "inference": {"max_wait_ms": 30},
        "detection": {"score_threshold": 0.7, "iou_threshold": 0.3},
    }


def measure(port: int, tmp: Path, mode: str, seconds: float) -> dict[str, Any]:
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    lock = threading.Lock()
    first: list[float] = []
    window: list[float] = []

    def on_message(c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        k = kind(msg.topic)
        if not first and k in ("results", "events"):
            first.append(now)
        if window and window[0] <= now < window[1]:
            with lock:
                counts[k][0] += 1
                counts[k][1] += len(msg.payload)

    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"modes-{mode}", protocol=mqtt.MQTTv5)
    sub.on_message = on_message
    sub.connect("127.0.0.1", port)
    sub.subscribe("edged/#", qos=1)
    sub.loop_start()
    cfg = tmp / f"{mode}.yaml"
    cfg.write_text(yaml.safe_dump(config(port, tmp / f"state-{mode}", mode)))
    log = open(tmp / f"{mode}.log", "wb")  # noqa: SIM115 (the daemon's output for its whole run)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "edged", "run", "-c", str(cfg)], stdout=log, stderr=log, env=env)
    try:
        end = time.monotonic() + 120
        while not first and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        if not first:
            raise SystemExit(f"{mode}: no result or event in 120 s:\n{(tmp / f'{mode}.log').read_text()[-2000:]}")
        window[:] = [first[0] + 2, first[0] + 2 + seconds]  # after the first one: the cameras are up
        while time.monotonic() < window[1]:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)
        sub.disconnect()
        sub.loop_stop()
    per = {
        k: {"msgs_per_s": round(n / seconds, 2), "bytes_per_s": round(b / seconds, 1)} for k, (n, b) in counts.items()
    }
    total_n = sum(n for n, _ in counts.values()) / seconds
    total_b = sum(b for _, b in counts.values()) / seconds
    return {
        "mode": mode,
        "seconds": seconds,
        "by_topic": per,
        "msgs_per_s": round(total_n, 2),
        "bytes_per_s": round(total_b, 1),
        "mean_result_bytes": round(counts["results"][1] / counts["results"][0], 1) if counts["results"][0] else None,
        "mean_event_bytes": round(counts["events"][1] / counts["events"][0], 1) if counts["events"][0] else None,
        "gb_per_day": round(total_b * 86400 / 1e9, 3),
    }


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["mode     msgs/s  bytes/s   GB/day  mean result B  mean event B   (one device: the demo's 3 cameras)"]
    for r in rows:
        lines.append(
            f"{r['mode']:<8} {r['msgs_per_s']:>6.2f} {r['bytes_per_s']:>8.0f} {r['gb_per_day']:>8.3f} "
            f"{r['mean_result_bytes'] or '-'!s:>14} {r['mean_event_bytes'] or '-'!s:>13}"
        )
    for r in rows:
        lines.append(
            f"{r['mode']}: "
            + ", ".join(f"{k} {v['msgs_per_s']}/s {v['bytes_per_s']} B/s" for k, v in r["by_topic"].items())
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--modes", default="frames,events,both")
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.txt")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-modes-") as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            rows = [measure(port, Path(tmp), m, args.seconds) for m in args.modes.split(",")]
        finally:
            broker.terminate()
            broker.wait(10)
    text = report(rows)
    print(text)
    if args.out is not None:
        Path(f"{args.out}.json").write_text(json.dumps(rows, indent=2) + "\n")
        Path(f"{args.out}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
