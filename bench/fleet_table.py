"""``edged fleet`` against a simulated fleet on a local mosquitto: time to the full table and peak memory.

Each simulated device is a real MQTT v5 session (paho, one per device, many per process, pumped by one
thread) with the daemon's retained last will (an ``offline`` status with `topics.STATUS_EXPIRY_S` as its
Message Expiry Interval) that publishes what a device retains: its ``online`` status, model state and
telemetry. Some devices then die (their process is SIGKILLed: the broker publishes their wills), some stop
cleanly (a retained ``stopped`` status). ``edged fleet --format json`` then runs `--runs` times as its own
process; each run's wall time and peak RSS (ru_maxrss of the child) are recorded, with their medians.

    python bench/fleet_table.py --devices 1000 --runs 5 --out bench/results/fleet-table
    python bench/fleet_table.py sessions --port P --first 0 --count 100 [--prefix edged]   (one process of devices)

The sessions mode is what the test of the table (tests/test_fleet_table.py) starts too.
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
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.protocol import topics

PER_PROCESS = 125  # sessions per simulator process
DEAD_EVERY = 20  # every 20th device's process group dies: its sessions' wills are published
STOPPED_EVERY = 25  # every 25th device stops cleanly (a retained `stopped` status)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def device_id(i: int) -> str:
    return f"sim-{i:05d}"


def docs(i: int, state: str = "online") -> dict[str, dict[str, Any]]:
    """The retained documents of simulated device `i`: status, model state, telemetry (valid against the
    shipped schemas' required fields)."""
    now = time.time()
    boot = f"{i:032x}"
    version = 3 if i % 10 else 4  # a tenth on version 4, on probation
    status = {
        "state": state,
        "version": "0.9.0",
        "boot_id": boot,
        "since": iso(now),
        "spool": "ok",
        "model": {"name": "faces", "version": version},
        "groups": ["dock" if i % 2 else "yard"],
    }
    probation = (
        {
            "version": 4,
            "elapsed_s": 12.0,
            "batches": 30,
            "needs_s": 60.0,
            "needs_batches": 100,
            "baseline_infer_ms": 4.1,
        }
        if version == 4
        else None
    )
    model_state = {"schema": "edged.model-state/1", "name": "faces", "active": version, "probation": probation}
    telemetry = {
        "schema": "edged.telemetry/1",
        "device": device_id(i),
        "boot_id": boot,
        "ts": iso(now),
        "uptime_s": 100.0,
        "cameras": {"lobby": {"state": "streaming", "fps": 15.0, "frames": 1500, "drops": 0, "reconnects": 0,
                              "stalls": 0, "errors": 0, "capture_to_result_ms": {"p50": 20.0}}},
        "inference": {"backend": "onnxruntime", "model": f"faces@{version}", "swaps": 0, "batch": 1, "fps": 15.0,
                      "batches": 1500, "rows": 1500, "padded_rows": 0, "errors": 0, "infer_ms": {"p50": 4.0},
                      "capture_to_result_ms": {"p50": 20.0}},
        "mqtt": {"connected": True, "results": 1500, "spooled": 1500, "published": 1500, "acked": 1500 - i % 7,
                 "refused": 0, "inflight": 0, "spool_rows": i % 7 * 100, "spool_state": "ok",
                 "dropped_queue_full": 0, "oversized": 0, "connects": 1, "connect_failures": 0,
                 "last_error": "connection refused" if i % 50 == 7 else ""},
        "memory": {"rss_mb": 300.0},
        "governor": {"level": "hot" if i % 30 == 3 else "normal", "fps_scale": 0.5 if i % 30 == 3 else 1.0,
                     "paused": False},
        "sensors": {"temps_c": {"cpu": 40.0 + i % 40, "gpu": 38.0 + i % 40}},
        "ota": None,
    }  # fmt: skip
    return {"status": status, topics.MODEL_STATE: model_state, topics.TELEMETRY: telemetry}


def sessions(host: str, port: int, prefix: str, ids: list[int], stop_ids: set[int]) -> None:
    """Connect one session per device with its last will, publish its retained documents, stop those in
    `stop_ids` cleanly; print ``ready`` and keep the rest connected until killed."""
    clients: list[mqtt.Client] = []
    pending: list[mqtt.MQTTMessageInfo] = []
    for i in ids:
        root = topics.device_root(prefix, device_id(i))
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edged-{device_id(i)}", protocol=mqtt.MQTTv5)
        will = Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
        will.MessageExpiryInterval = topics.STATUS_EXPIRY_S
        offline = json.dumps(docs(i, "offline")["status"]).encode()
        c.will_set(topics.status(root), offline, qos=1, retain=True, properties=will)
        c.connect(host, port, keepalive=120)
        for suffix, doc in docs(i).items():
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if suffix == "status":
                props.MessageExpiryInterval = topics.STATUS_EXPIRY_S
            qos = 0 if suffix == topics.TELEMETRY else 1
            pending.append(c.publish(f"{root}/{suffix}", json.dumps(doc).encode(), qos=qos, retain=True,
                                     properties=props))  # fmt: skip
        clients.append(c)
        _pump(clients, 0.0)
    end = time.monotonic() + 120
    while not all(p.is_published() for p in pending) and time.monotonic() < end:
        _pump(clients, 0.01)
    for c, i in zip(clients, ids, strict=True):
        if i in stop_ids:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.MessageExpiryInterval = topics.STATUS_EXPIRY_S
            root = topics.device_root(prefix, device_id(i))
            info = c.publish(topics.status(root), json.dumps(docs(i, "stopped")["status"]).encode(), qos=1,
                             retain=True, properties=props)  # fmt: skip
            while not info.is_published():
                _pump(clients, 0.01)
            c.disconnect()  # a clean DISCONNECT: the broker drops the will
            _pump([c], 0.05)
    live = [c for c, i in zip(clients, ids, strict=True) if i not in stop_ids]
    print("ready", flush=True)
    while True:
        _pump(live, 0.2)


def _pump(clients: list[mqtt.Client], timeout: float) -> None:
    for c in clients:
        c.loop(timeout=0)
    if timeout:
        time.sleep(timeout)


def start_sessions(
    port: int, first: int, count: int, prefix: str = "edged", stop_ids: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    """A simulator process holding devices first..first+count-1; returns once all of them are ready."""
    args = [sys.executable, __file__, "sessions", "--port", str(port), "--first", str(first), "--count", str(count)]
    args += ["--prefix", prefix] + [a for i in stop_ids for a in ("--stop", str(i))]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    p.stdout.close()  # it prints nothing more
    if line.strip() != "ready":
        p.kill()
        raise RuntimeError(f"the simulator for {first}..{first + count - 1} did not start: {line!r}")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_fleet(port: int, prefix: str) -> tuple[float, float, list[dict[str, Any]]]:
    """One `edged fleet --format json` as a child process: (seconds, peak RSS in MB, its rows)."""
    args = [sys.executable, "-m", "edged", "fleet", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--prefix", prefix, "--format", "json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(args, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)  # the child's own peak RSS (ru_maxrss, KiB)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"edged fleet exited {p.returncode}: {err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, json.loads(out.read())


def bench(devices: int, runs: int, out: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="edged-fleet-table-"))
    port = free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n"
        + ("user root\n" if os.geteuid() == 0 else "")
    )
    broker = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    procs: list[subprocess.Popen[str]] = []
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        for first in range(0, devices, PER_PROCESS):
            n = min(PER_PROCESS, devices - first)
            stops = tuple(i for i in range(first, first + n) if i % STOPPED_EVERY == 0)
            procs.append(start_sessions(port, first, n, stop_ids=stops))
        setup_s = time.monotonic() - t0
        # the first simulator's process dies: its live sessions' wills are published
        killed_at = time.time()
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        dead = [i for i in range(min(PER_PROCESS, devices)) if i % STOPPED_EVERY]
        time.sleep(2.0)  # the broker sees the closed sockets at once; the wills are published then
        walls: list[float] = []
        rsss: list[float] = []
        table: list[dict[str, Any]] = []
        for _ in range(runs):
            wall, rss, table = run_fleet(port, "edged")
            walls.append(wall)
            rsss.append(rss)
        by_id = {r["device"]: r for r in table}
        offline = [d for d in (device_id(i) for i in dead) if by_id.get(d, {}).get("state") == "offline"]
        will_ts = [by_id[d]["since"] for d in offline if by_id[d]["since"]]
        result: dict[str, Any] = {
            "devices": devices,
            "sessions_live": devices - len(dead) - len([i for i in range(devices) if i % STOPPED_EVERY == 0]),
            "offline_expected": len(dead),
            "offline_in_table": len(offline),
            "offline_with_will_time": len(will_ts),
            "will_killed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(killed_at)),
            "will_times_seen": sorted(set(will_ts))[:3],
            "rows": len(table),
            "complete": len(table) == devices,
            "setup_s": round(setup_s, 1),
            "runs": runs,
            "wall_s": [round(w, 3) for w in walls],
            "wall_s_median": round(statistics.median(walls), 3),
            "peak_rss_mb": [round(r, 1) for r in rsss],
            "peak_rss_mb_median": round(statistics.median(rsss), 1),
            "cpus": os.cpu_count(),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = (
        f"edged fleet over {devices} simulated device sessions (local mosquitto, {result['cpus']} CPUs)\n"
        f"table complete: {result['complete']} ({result['rows']} rows); offline shown: {result['offline_in_table']} "
        f"of {result['offline_expected']}, with the will's time: {result['offline_with_will_time']} "
        f"(killed at {result['will_killed_at']}, shown {', '.join(result['will_times_seen'])})\n"
        f"time to the full table (process start to exit), {runs} runs: median {result['wall_s_median']} s "
        f"{result['wall_s']}\n"
        f"peak RSS of the edged fleet process: median {result['peak_rss_mb_median']} MB {result['peak_rss_mb']}\n"
    )
    out.with_suffix(".txt").write_text(text)
    print(text, end="")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    s = sub.add_parser("sessions")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--prefix", default="edged")
    s.add_argument("--first", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--stop", type=int, action="append", default=[])
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fleet-table")
    args = p.parse_args(argv)
    if args.mode == "sessions":
        ids = list(range(args.first, args.first + args.count))
        sessions(args.host, args.port, args.prefix, ids, set(args.stop))
        return 0
    bench(args.devices, args.runs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
