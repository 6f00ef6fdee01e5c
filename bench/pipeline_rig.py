"""The rig of bench/pipeline.py: a private mosquitto on 127.0.0.1, a subscriber that counts results and
telemetry (Counter), the daemon's config for a run, and a runner of spawned children."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
import shutil
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion

DEVICE = "bench-01"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n")
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("mosquitto did not start")


class Counter:
    """Subscribes to results and telemetry; keeps (receive time, payload) for later parsing."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[float, bytes]] = []
        self.telemetry: list[bytes] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-{port}-{time.time_ns()}", protocol=mqtt.MQTTv5
        )
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(
            [(f"edged/{DEVICE}/results/+", 1), (f"edged/{DEVICE}/telemetry", 0)]
        )
        self.c.on_subscribe = lambda *a: self.ready.set()
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.ready.wait(10)

    def _on(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        now = time.time()
        with self.lock:
            if m.topic.endswith("/telemetry"):
                self.telemetry.append(bytes(m.payload))
            else:
                self.got.append((now, bytes(m.payload)))

    def reset(self) -> None:
        with self.lock:
            self.got, self.telemetry = [], []

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def rate(self, skip_s: float = 2.0, tail_s: float = 0.5) -> float:
        """Results per second at the subscriber over the steady part of the run."""
        with self.lock:
            times = [t for t, _ in self.got]
        if len(times) < 10:
            return 0.0
        t0, t1 = times[0] + skip_s, times[-1] - tail_s
        n = sum(1 for t in times if t0 <= t <= t1)
        return n / max(1e-6, t1 - t0)

    def latencies_ms(self, skip_s: float = 2.0) -> list[float]:
        with self.lock:
            got = list(self.got)
        if not got:
            return []
        start = got[0][0] + skip_s
        out = []
        for t, payload in got:
            if t < start:
                continue
            doc = json.loads(payload)
            captured = dt.datetime.fromisoformat(doc["captured_at"].replace("Z", "+00:00")).timestamp()
            out.append((t - captured) * 1000.0)
        return out

    def peak_rss_mb(self) -> float:
        with self.lock:
            docs = [json.loads(p) for p in self.telemetry]
        return max((d["memory"].get("peak_rss_mb", 0.0) for d in docs), default=0.0)


def write_config(
    path: Path, port: int, package: Path, cameras: list[dict[str, Any]], state: Path, dedicated_core: bool = False
) -> Path:
    doc = {
        "device_id": DEVICE,
        "state_dir": str(state),
        "log_level": "warning",
        "mqtt": {"host": "127.0.0.1", "port": port},
        "model": {"package": str(package), "onnxruntime": {"threads": 1}},
        "cameras": cameras,
        "inference": {"max_wait_ms": 30, "warmup_batches": 3, "dedicated_core": dedicated_core},
        "detection": {"score_threshold": 0.7},
        "telemetry": {"interval_s": 1},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def run_child(target: Any, args: tuple[Any, ...], counter: Counter, timeout: float) -> None:
    counter.reset()
    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        raise SystemExit(f"{target.__name__} did not finish in {timeout} s")
    if p.exitcode != 0:
        raise SystemExit(f"{target.__name__} failed with exit code {p.exitcode}")
    time.sleep(0.3)  # the last PUBACKed messages reach the subscriber


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")
