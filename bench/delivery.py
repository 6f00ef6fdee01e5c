#!/usr/bin/env python3
"""Delivery throughput: the durable spool against direct paho publishing, and backlog drain time.

In one run, against a local mosquitto on 127.0.0.1, with result-sized payloads (~600 bytes):

  direct   a paho client publishing at QoS 1 (same in-flight window), counted until every PUBACK
  spool    the daemon's Publisher: queue -> SQLite spool (group commit) -> paho -> PUBACK -> delete
  ratio    spool / direct (target >= 0.8, and far above any camera rate: >= 2000 results/s here)
  drain    a backlog of --backlog results left in the spool (the broker away), delivered when it is back

Each figure is the median of --repeats runs.

    python bench/delivery.py [--count 20000] [--backlog 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.config import MqttConfig, SpoolConfig
from edged.daemon.publish import Publisher
from edged.daemon.spool import Spool

DOC = {
    "schema": "edged.result/1",
    "device": "bench-01",
    "camera": "dock",
    "boot_id": "0" * 32,
    "seq": 0,
    "frame": 0,
    "captured_at": "2026-11-29T16:03:11.120Z",
    "latency_ms": {"capture_to_result": 23.1, "infer": 4.2},
    "model": {"name": "faces", "version": 7},
    "image": {"width": 1920, "height": 1080},
    "detections": [{"label": "face", "class_id": 0, "score": 0.91, "box": [412.0, 96.0, 530.0, 240.0]}] * 4,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker(work: Path, port: int) -> subprocess.Popen[bytes]:
    conf = work / "m.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\n")
    p = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return p
        except OSError:
            time.sleep(0.05)
    raise SystemExit("mosquitto did not start")


def direct(port: int, n: int, window: int) -> float:
    acked = threading.Semaphore(0)
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"direct-{time.time_ns()}", protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(window)
    c.max_queued_messages_set(0)
    c.on_publish = lambda *a: acked.release()
    c.connect("127.0.0.1", port)
    c.loop_start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    for i in range(n):
        payload = json.dumps({**DOC, "seq": i + 1}, separators=(",", ":")).encode()
        c.publish("edged/bench-01/results/dock", payload, qos=1)
    for _ in range(n):
        acked.acquire()
    dt = time.perf_counter() - t0
    c.disconnect()
    c.loop_stop()
    return n / dt


def make_publisher(port: int, work: Path, name: str) -> Publisher:
    return Publisher(
        MqttConfig(host="127.0.0.1", port=port, client_id=name),
        SpoolConfig(),
        Spool(work / f"{name}.db", 1 << 34, 86400),
        "bench-01",
        "edged/bench-01",
        "0" * 32,
        dict,
    )


def spooled(port: int, work: Path, n: int) -> float:
    pub = make_publisher(port, work, f"spool-{time.time_ns()}")
    pub.start()
    while not pub.connected:
        time.sleep(0.01)
    t0 = time.perf_counter()
    for i in range(n):
        while pub._q.full():  # the daemon drops when its queue is full; the bench waits instead
            time.sleep(0.002)
        pub.submit_event({**DOC, "seq": i + 1})
    while pub.acked < n:
        time.sleep(0.002)
    dt = time.perf_counter() - t0
    pub.stop(timeout_s=1)
    return n / dt


def drain(port: int, work: Path, backlog: int) -> tuple[float, float]:
    name = f"drain-{time.time_ns()}"
    spool = Spool(work / f"{name}.db", 1 << 34, 86400)
    payload = json.dumps(DOC, separators=(",", ":")).encode()
    t0 = time.perf_counter()
    for _ in range(backlog):
        spool.append("edged/bench-01/results/dock", payload, 1)
    spool.commit()
    fill_s = time.perf_counter() - t0
    spool.close()
    pub = make_publisher(port, work, name)
    t0 = time.perf_counter()
    pub.start()
    while pub.spool.rows > 0:
        time.sleep(0.01)
    dt = time.perf_counter() - t0
    pub.stop(timeout_s=1)
    return dt, fill_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--backlog", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="edged-delivery-"))
    port = free_port()
    b = broker(work, port)
    res: dict[str, Any] = {
        "count": args.count,
        "backlog": args.backlog,
        "repeats": args.repeats,
        "payload_bytes": len(json.dumps(DOC, separators=(",", ":"))),
    }
    try:
        window = MqttConfig().max_inflight
        d, s, dr = [], [], []
        for _ in range(args.repeats):
            d.append(direct(port, args.count, window))
            s.append(spooled(port, work, args.count))
            dr.append(drain(port, work, args.backlog)[0])
        res["direct_per_s"] = statistics.median(d)
        res["spool_per_s"] = statistics.median(s)
        res["ratio"] = res["spool_per_s"] / res["direct_per_s"]
        res["drain_s"] = statistics.median(dr)
        res["drain_per_s"] = args.backlog / res["drain_s"]
    finally:
        b.terminate()
        b.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(f"payload {res['payload_bytes']} bytes, in-flight window {window}, median of {args.repeats}")
    print(f"direct paho, QoS 1            {res['direct_per_s']:9.0f} results/s")
    print(f"through the spool, QoS 1      {res['spool_per_s']:9.0f} results/s   ratio {res['ratio']:.3f}")
    print(f"drain a {args.backlog}-result backlog  {res['drain_s']:9.1f} s  ({res['drain_per_s']:.0f} results/s)")
    (args.out / "delivery.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
