"""What the chaos soak watches (see soak_chaos.py): every result a subscriber receives, and the daemon's
resources sampled from /proc.

- `Results`: a paho subscriber as docs/subscriber.md recommends for one that must not miss results: QoS 1,
  a fixed client id, a persistent session (clean start off, a session expiry), so results published while
  it is away (a broker restart) wait for it. It records every result's (boot_id, seq, camera, frame, model
  version); `tally()` finds what is missing (a gap in a boot's seq) and what came twice.
- `Sampler`: every few seconds the daemon's RSS (/proc/PID/status VmRSS), fds (/proc/PID/fd), threads
  (/proc/PID/status Threads), the spool's bytes (state_dir/spool.db*) and the state directory's bytes.
- `growth()`: per hour, the least-squares slope after warm-up; and the value after warm-up against the
  value at the end (medians of a window each, since GStreamer's idle pool threads come and go).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


@dataclass(frozen=True)
class Received:
    boot_id: str
    seq: int
    camera: str
    frame: int
    version: int
    at: float  # arrival, time.monotonic()


class Results:
    """Every result of one device, with a persistent session on the broker."""

    def __init__(self, host: str, port: int, device: str) -> None:
        self.device = device
        self.items: list[Received] = []
        self.telemetry: dict[str, Any] | None = None
        self.statuses: list[str] = []
        self.connects = 0
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"soak-sub-{port}", protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 2)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 24 * 3600
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.connect(host, port, clean_start=False, properties=props)
        self.client.loop_start()
        if not self.subscribed.wait(30):
            raise RuntimeError("the soak's subscriber could not subscribe")

    def _on_connect(self, c: mqtt.Client, u: Any, flags: Any, rc: Any, p: Any) -> None:
        self.connects += 1
        root = f"edged/{self.device}"
        c.subscribe([(f"{root}/results/#", 1), (f"{root}/telemetry", 1), (f"{root}/status", 1)])

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            return
        doc = json.loads(msg.payload)
        with self.lock:
            if "/results/" in msg.topic:
                version = int(doc["model"]["version"])
                got = Received(doc["boot_id"], doc["seq"], doc["camera"], doc["frame"], version, time.monotonic())
                self.items.append(got)
            elif msg.topic.endswith("/telemetry"):
                self.telemetry = doc
            elif msg.topic.endswith("/status"):
                self.statuses.append(str(doc.get("state")))

    def count(self) -> int:
        with self.lock:
            return len(self.items)

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.items)

    def last_telemetry(self) -> dict[str, Any] | None:
        with self.lock:
            return self.telemetry

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def tally(items: list[Received], wrap_camera: str) -> dict[str, Any]:
    """Lost (a seq missing within a boot's 1..highest received), duplicated (received more than once), per
    camera counts and longest silence (between arrivals), `wrap_camera`'s loop wraps (its file frame index
    going back, in seq order), and the model versions in the order they served."""
    by_boot: dict[str, list[int]] = defaultdict(list)
    for r in items:
        by_boot[r.boot_id].append(r.seq)
    boots = {}
    lost = dups = 0
    for boot, seqs in by_boot.items():
        seen = set(seqs)
        missing = sorted(set(range(1, max(seqs) + 1)) - seen)
        lost += len(missing)
        dups += len(seqs) - len(seen)
        boots[boot] = {
            "received": len(seqs),
            "highest_seq": max(seqs),
            "missing": len(missing),
            "missing_first": missing[:20],
            "duplicates": len(seqs) - len(seen),
        }
    unique = sorted({(r.boot_id, r.seq): r for r in items}.values(), key=lambda r: (r.boot_id, r.seq))
    per_camera: dict[str, int] = defaultdict(int)
    for r in unique:
        per_camera[r.camera] += 1
    frames = [r.frame for r in unique if r.camera == wrap_camera]
    wraps = sum(1 for a, b in itertools.pairwise(frames) if b < a)
    arrivals: dict[str, list[float]] = defaultdict(list)
    for r in items:
        arrivals[r.camera].append(r.at)
    silence = {
        c: round(max((b - a for a, b in itertools.pairwise(sorted(ts))), default=0.0), 1) for c, ts in arrivals.items()
    }
    versions: list[int] = []
    for r in unique:
        if not versions or versions[-1] != r.version:
            versions.append(r.version)
    return {
        "received": len(items),
        "unique": len(unique),
        "lost": lost,
        "duplicates": dups,
        "boots": boots,
        "per_camera": dict(per_camera),
        "loop_wraps": wraps,
        "longest_silence_s": {c: round(v, 1) for c, v in silence.items()},  # per camera, between two results' arrivals
        "versions_in_order": versions,
    }


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the soak started
    rss_mb: float
    fds: int
    threads: int
    spool_bytes: int
    state_bytes: int
    results: int  # received by the subscriber so far


def dir_bytes(root: Path, prefix: str = "") -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            if name.startswith(prefix):
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    continue  # removed while we walked
    return total


def proc_usage(pid: int) -> tuple[float, int, int] | None:
    """(RSS MB, fds, threads) of a process, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in status if ":" in line}
    if "VmRSS" not in fields:  # a zombie
        return None
    return int(fields["VmRSS"][0]) / 1024, fds, int(fields["Threads"][0])


class Sampler:
    """Samples the daemon every `every_s` on its own thread until stopped."""

    def __init__(self, pid: int, state_dir: Path, results: Results, t0: float, every_s: float = 5.0) -> None:
        self.pid, self.state_dir, self.results, self.t0, self.every_s = pid, state_dir, results, t0, every_s
        self.samples: list[Sample] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self.thread.start()

    def sample(self) -> Sample | None:
        usage = proc_usage(self.pid)
        if usage is None:
            return None
        rss, fds, threads = usage
        spool, state = dir_bytes(self.state_dir, "spool.db"), dir_bytes(self.state_dir)
        t = round(time.monotonic() - self.t0, 1)
        s = Sample(t, round(rss, 1), fds, threads, spool, state, self.results.count())
        with self.lock:
            self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def snapshot(self) -> list[Sample]:
        with self.lock:
            return list(self.samples)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def window_median(samples: list[Sample], key: str, start_s: float, end_s: float) -> float:
    vals = [float(getattr(s, key)) for s in samples if start_s <= s.t_s <= end_s]
    if not vals:
        raise ValueError(f"no samples of {key} between {start_s:g} and {end_s:g} s")
    return float(np.median(vals))


def growth(samples: list[Sample], key: str, warmup_s: float, base_s: float, end_s: float) -> dict[str, float]:
    """`key` after warm-up (the median of [warmup_s, warmup_s + base_s]), at the end (the median of the last
    `base_s` before end_s), the difference, and the least-squares slope per hour over [warmup_s, end_s]."""
    pts = [(s.t_s, float(getattr(s, key))) for s in samples if warmup_s <= s.t_s <= end_s]
    slope = float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0]) * 3600 if len(pts) >= 3 else 0.0
    base = window_median(samples, key, warmup_s, warmup_s + base_s)
    end = window_median(samples, key, end_s - base_s, end_s)
    return {
        "after_warmup": round(base, 2),
        "end": round(end, 2),
        "growth": round(end - base, 2),
        "per_hour": round(slope, 2),
        "peak": round(max(p[1] for p in pts), 2),
    }


HEADER = f"{'t s':>7} {'results':>8} {'rss MB':>7} {'fds':>4} {'thr':>4} {'spool kB':>9} {'state MB':>9}  event"


def row(s: Sample, event: str = "") -> str:
    return (
        f"{s.t_s:7.0f} {s.results:8d} {s.rss_mb:7.1f} {s.fds:4d} {s.threads:4d} {s.spool_bytes / 1024:9.1f} "
        f"{s.state_bytes / 2**20:9.2f}  {event}"
    )
