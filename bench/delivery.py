#!/usr/bin/env python3
"""Delivery throughput: the durable spool against direct paho publishing, and backlog drain time.

In one run, against a local mosquitto on 127.0.0.1, with result-sized payloads (~600 bytes):

  direct   a paho client publishing at QoS 1 (same in-flight window), counted until every PUBACK; the
           target's baseline is paho's own Client; the same run with the daemon's client (DeviceClient,
           daemon/delivery/client.py: paho with its per-PUBACK decoding and debug lines cut) is printed too, so
           that what the spool itself costs can be told from what the client saves
  spool    the daemon's Publisher: queue -> SQLite spool (group commit) -> paho -> PUBACK -> delete
  cpu      CPU time of this process per result on each path (all threads; the broker is another
           process): direct / spool is the ratio a CPU-bound machine would see, and it does not swing
           with the other jobs' load as the throughputs do
  ratio    spool / direct with paho's Client (target >= 0.8, and far above any camera rate: >= 2000 results/s here); the
           producer waits while the publisher's queue is full, and a run in which any result is
           dropped (from the queue, or from the spool's memory before its commit) is refused
  drain    a backlog of --backlog results left in the spool (the broker away), delivered when it is back
  backlog  the spool's own cost with 0 / 100k / 1M rows waiting (--sizes): a commit of 2 results (insert,
           fsync, the byte and age bounds), and a send of 100 (read the next rows after the cursor from the
           file, as a backlog is read, delete them as on their PUBACKs); medians of 200 commits and 100
           sends (target: 1M within 1.5x of 0); and a send of the 100 rows just committed, which the
           spool hands out from memory (the sender's steady state while the broker keeps up)
  wear     bytes the publisher thread writes to the state directory at the demo's rate (--wear-rate
           results/s in batches of 2, PUBACKs from the broker), for --wear-s seconds, per hour

Each throughput figure is the median of --repeats runs.

    python bench/delivery.py [--count 20000] [--backlog 100000] [--repeats 3] [--sizes 0,100000,1000000]
                             [--wear-s 60] [--wear-rate 30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import sqlite3
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
from edged.daemon.delivery.client import DeviceClient
from edged.daemon.delivery.publisher import Publisher
from edged.daemon.delivery.spool import Spool

DOC = {
    "schema": "edged.result/2",
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


def _cpu_s() -> float:
    """CPU seconds of this process, all its threads (the broker is another process)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def direct(port: int, n: int, window: int, client_class: type[mqtt.Client] = mqtt.Client) -> tuple[float, float]:
    """Results/s and CPU µs per result."""
    acked = threading.Semaphore(0)
    c = client_class(CallbackAPIVersion.VERSION2, client_id=f"direct-{time.time_ns()}", protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(window)
    c.max_queued_messages_set(0)
    c.on_publish = lambda *a: acked.release()
    c.connect("127.0.0.1", port)
    c.loop_start()
    time.sleep(0.2)
    t0, c0 = time.perf_counter(), _cpu_s()
    for i in range(n):
        payload = json.dumps({**DOC, "seq": i + 1}, separators=(",", ":")).encode()
        c.publish("edged/bench-01/results/dock", payload, qos=1)
    for _ in range(n):
        acked.acquire()
    dt, cpu = time.perf_counter() - t0, _cpu_s() - c0
    c.disconnect()
    c.loop_stop()
    return n / dt, cpu / n * 1e6


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


def spooled(port: int, work: Path, n: int) -> tuple[float, float]:
    """Results/s and CPU µs per result."""
    pub = make_publisher(port, work, f"spool-{time.time_ns()}")
    pub.start()
    while not pub.connected:
        time.sleep(0.01)
    t0, c0 = time.perf_counter(), _cpu_s()
    for i in range(n):
        while pub.queue_full:  # the daemon drops when its queue is full; the bench waits instead
            time.sleep(0.002)
        pub.submit_event({**DOC, "seq": i + 1})
    # every result must be acknowledged: one dropped from memory (over spool max_unsaved_bytes, as when the
    # publisher took the whole queue before it committed) makes the run invalid, not faster
    while pub.acked < n:
        if pub.spool.dropped_unsaved or pub.dropped_queue_full:
            pub.stop(timeout_s=1)
            raise SystemExit(
                f"spool run invalid: {pub.spool.dropped_unsaved} dropped from memory, "
                f"{pub.dropped_queue_full} at the queue"
            )
        time.sleep(0.002)
    dt, cpu = time.perf_counter() - t0, _cpu_s() - c0
    pub.stop(timeout_s=1)
    return pub.acked / dt, cpu / n * 1e6


def drain(port: int, work: Path, backlog: int) -> tuple[float, float]:
    name = f"drain-{time.time_ns()}"
    spool = Spool(work / f"{name}.db", 1 << 34, 86400)
    payload = json.dumps(DOC, separators=(",", ":")).encode()
    t0 = time.perf_counter()
    for i in range(backlog):
        spool.append("edged/bench-01/results/dock", payload, 1)
        if i % 1000 == 999:  # within max_unsaved_bytes (4 MB): one commit of 100k would drop most of them
            spool.commit()
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


def _backlog_file(path: Path, n: int, payload: bytes) -> None:
    """A spool file with `n` rows waiting, written in one transaction (the spool's schema)."""
    Spool(path, 1 << 34, 7 * 86400).close()
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    row = ("edged/bench-01/results/dock", payload, 1, time.time(), len(payload), 0.0)
    db.executemany(
        "INSERT INTO messages (topic, payload, qos, created, size, clock_s) VALUES (?, ?, ?, ?, ?, ?)",
        (row for _ in range(n)),
    )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def backlog_cost(work: Path, n: int, commits: int = 200, sends: int = 100) -> dict[str, float]:
    """Median ms of one commit (2 results) and one send (100 results: after() + delete()) with `n` rows
    waiting ahead of them, as in a long broker outage (the default bounds: 7 days, no byte limit hit)."""
    payload = json.dumps(DOC, separators=(",", ":")).encode()
    path = work / f"backlog-{n}.db"
    _backlog_file(path, n, payload)
    t0 = time.perf_counter()
    spool = Spool(path, 1 << 34, 7 * 86400)
    open_s = time.perf_counter() - t0
    commit, commit_cpu, send, fresh = [], [], [], []
    for _ in range(commits):
        t0, c0 = time.perf_counter(), time.thread_time()
        spool.append("edged/bench-01/results/dock", payload, 1)
        spool.append("edged/bench-01/results/dock", payload, 1)
        spool.commit()
        commit.append(time.perf_counter() - t0)
        commit_cpu.append(time.thread_time() - c0)
    last = 0
    for _ in range(sends):
        for _ in range(100):  # keeps the backlog where it is: what is sent is replaced
            spool.append("edged/bench-01/results/dock", payload, 1)
        spool.commit()
        spool.forget_unsent()  # read from the file, as a backlog from before a restart is
        t0 = time.perf_counter()
        rows = spool.after(last, 100)
        spool.delete([r.id for r in rows])
        send.append(time.perf_counter() - t0)
        last = rows[-1].id
    for _ in range(sends):  # the rows just committed, past the backlog: handed out from memory
        for _ in range(100):
            spool.append("edged/bench-01/results/dock", payload, 1)
        spool.commit()
        t0 = time.perf_counter()
        rows = spool.after(spool.last_id - 100, 100)
        spool.delete([r.id for r in rows])
        fresh.append(time.perf_counter() - t0)
    spool.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return {
        "rows": n,
        "open_s": open_s,
        "commit_ms": statistics.median(commit) * 1e3,
        "commit_cpu_ms": statistics.median(commit_cpu) * 1e3,
        "send_ms": statistics.median(send) * 1e3,
        "send_fresh_ms": statistics.median(fresh) * 1e3,
    }


def _fs_type(path: Path) -> str:
    """The filesystem type the bench's spool files are on (from /proc/mounts), for the record."""
    best = ("", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt, fstype = line.split()[1:3]
        if str(path).startswith(mnt) and len(mnt) > len(best[0]):
            best = (mnt, fstype)
    return best[1]


def _thread_write_bytes(tid: int) -> int:
    io = Path(f"/proc/self/task/{tid}/io").read_text()
    return int(next(line.split()[1] for line in io.splitlines() if line.startswith("write_bytes:")))


def wear(port: int, work: Path, seconds: float, rate: float) -> dict[str, float]:
    """Bytes written to storage by the publisher thread (it does every spool write: inserts, fsyncs,
    deletes, checkpoints) while results come at `rate`/s in batches of 2, as the demo's batches do."""
    state = work / f"wear-{time.time_ns()}"
    state.mkdir()
    pub = make_publisher(port, state, "spool")
    pub.start()
    while not pub.connected:
        time.sleep(0.01)
    for i in range(20):  # past the file's creation
        pub.submit_event({**DOC, "seq": i + 1})
    while pub.acked < 20:
        time.sleep(0.01)
    tid = pub._thread.native_id
    if tid is None:
        raise SystemExit("the publisher thread has no id")
    before, acked0, seq = _thread_write_bytes(tid), pub.acked, 20
    t0 = time.perf_counter()
    period = 2 / rate
    while time.perf_counter() - t0 < seconds:
        for _ in range(2):
            seq += 1
            pub.submit_event({**DOC, "seq": seq})
        time.sleep(max(0.0, t0 + (seq - 20) / 2 * period - time.perf_counter()))
    while pub.acked < seq:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    written = _thread_write_bytes(tid) - before
    pub.stop(timeout_s=1)
    results = pub.acked - acked0
    payload = len(json.dumps(DOC, separators=(",", ":")))
    return {
        "seconds": elapsed,
        "results": results,
        "results_per_s": results / elapsed,
        "write_bytes": written,
        "bytes_per_result": written / results,
        "mb_per_hour": written / elapsed * 3600 / 1e6,
        "amplification": written / (results * payload),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--backlog", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="0,100000,1000000", help="backlogs for the cost table ('' skips it)")
    ap.add_argument("--wear-s", type=float, default=60.0, help="seconds of the wear run (0 skips it)")
    ap.add_argument("--wear-rate", type=float, default=30.0, help="results/s of the wear run (the demo's)")
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
        "machine": f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}; spool files under {work} "
        f"({_fs_type(work)})",
    }
    try:
        window = MqttConfig().max_inflight
        d, s, dr, dc, sc, dd, ddc = [], [], [], [], [], [], []
        for _ in range(args.repeats):
            rate, cpu = direct(port, args.count, window)
            d.append(rate)
            dc.append(cpu)
            rate, cpu = direct(port, args.count, window, DeviceClient)
            dd.append(rate)
            ddc.append(cpu)
            rate, cpu = spooled(port, work, args.count)
            s.append(rate)
            sc.append(cpu)
            dr.append(drain(port, work, args.backlog)[0])
        res["runs"] = {
            "direct_per_s": d,
            "direct_device_client_per_s": dd,
            "spool_per_s": s,
            "drain_s": dr,
            "direct_cpu_us": dc,
            "direct_device_client_cpu_us": ddc,
            "spool_cpu_us": sc,
        }
        res["direct_device_client_per_s"] = statistics.median(dd)
        res["direct_device_client_cpu_us"] = statistics.median(ddc)
        res["ratio_device_client"] = statistics.median(s) / res["direct_device_client_per_s"]
        res["direct_cpu_us"] = statistics.median(dc)
        res["spool_cpu_us"] = statistics.median(sc)
        res["cpu_ratio"] = res["direct_cpu_us"] / res["spool_cpu_us"]
        res["direct_per_s"] = statistics.median(d)
        res["spool_per_s"] = statistics.median(s)
        res["ratio"] = res["spool_per_s"] / res["direct_per_s"]
        res["drain_s"] = statistics.median(dr)
        res["drain_per_s"] = args.backlog / res["drain_s"]
        sizes = [int(x) for x in args.sizes.split(",") if x]
        res["backlog_cost"] = [backlog_cost(work, n) for n in sizes]
        if args.wear_s > 0:
            res["wear"] = wear(port, work, args.wear_s, args.wear_rate)
    finally:
        b.terminate()
        b.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(res["machine"])
    print(f"payload {res['payload_bytes']} bytes, in-flight window {window}, median of {args.repeats}")
    print(f"direct paho, QoS 1            {res['direct_per_s']:9.0f} results/s")
    print(f"direct, the daemon's client   {res['direct_device_client_per_s']:9.0f} results/s")
    print(
        f"through the spool, QoS 1      {res['spool_per_s']:9.0f} results/s   ratio {res['ratio']:.3f} "
        f"(of the daemon's client direct: {res['ratio_device_client']:.3f})"
    )
    runs = res["runs"]
    each = zip(runs["direct_per_s"], runs["direct_device_client_per_s"], runs["spool_per_s"], strict=True)
    print(
        "  each run (direct, daemon's client direct, spool, ratio): "
        + "; ".join(f"{a:.0f}, {b:.0f}, {c:.0f}, {c / a:.3f}" for a, b, c in each)
    )
    print(
        f"CPU per result (this process)  direct {res['direct_cpu_us']:.1f} us "
        f"(daemon's client {res['direct_device_client_cpu_us']:.1f}), spool {res['spool_cpu_us']:.1f} us: "
        f"direct / spool {res['cpu_ratio']:.3f} (the throughput the spool path would keep on a CPU-bound machine)"
    )
    print(f"drain a {args.backlog}-result backlog  {res['drain_s']:9.1f} s  ({res['drain_per_s']:.0f} results/s)")
    if res["backlog_cost"]:
        base = res["backlog_cost"][0]
        print(
            "backlog (rows)   commit of 2 (ms)   its CPU (ms)      send of 100 (ms)   just committed (ms)   "
            "open (s)   medians; x = of the first row; a commit's wall time is mostly its fsync"
        )
        for c in res["backlog_cost"]:
            print(
                f"{c['rows']:>14}   {c['commit_ms']:8.3f} x{c['commit_ms'] / base['commit_ms']:4.2f}"
                f"   {c['commit_cpu_ms']:7.3f} x{c['commit_cpu_ms'] / base['commit_cpu_ms']:4.2f}"
                f"   {c['send_ms']:8.3f} x{c['send_ms'] / base['send_ms']:4.2f}"
                f"   {c['send_fresh_ms']:9.3f} x{c['send_fresh_ms'] / base['send_fresh_ms']:4.2f}"
                f"       {c['open_s']:8.2f}"
            )
    if "wear" in res:
        w = res["wear"]
        print(
            f"wear at {w['results_per_s']:.0f} results/s for {w['seconds']:.0f} s: "
            f"{w['write_bytes'] / 1e6:.1f} MB written, "
            f"{w['bytes_per_result']:.0f} bytes/result ({w['amplification']:.1f}x the payload), "
            f"{w['mb_per_hour']:.0f} MB/hour"
        )
    (args.out / "delivery.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
