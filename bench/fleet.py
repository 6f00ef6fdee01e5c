#!/usr/bin/env python3
"""A simulated fleet against one mosquitto on 127.0.0.1: how many edged devices one broker holds.

Each simulated device is one MQTT v5 session (a raw socket, not paho: 1,000 paho clients would spend the
machine's CPU on themselves) that publishes result-sized QoS 1 messages on ``edged/<device>/results/cam``
at the device rate (--rate, default 27/s: a daemon serving 30 fps over its cameras), with at most 20
unacknowledged (the daemon's mqtt.max_inflight; a device whose window is full keeps the rest, as its spool
would, and that backlog is reported). Consumers subscribe at QoS 1 to ``edged/+/results/+`` (several:
the shared subscription ``$share/fleet/edged/+/results/+``) and acknowledge every message.

Reported for the measured window (after connecting every session and a warm-up): offered and delivered
messages/s, the broker's CPU (% of one core, from /proc) and memory, end-to-end latency p50/p99 (the
device's send to the consumer's receive, one clock), and loss: every message the broker acknowledged
(PUBACK) to a device must reach a consumer once the devices stop and the consumers drain.

    python bench/fleet.py [--sessions 1000] [--rate 27] [--payload 390] [--seconds 20] [--warmup 5]
                          [--processes 2] [--consumers 1] [--out bench/results/fleet]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import platform
import resource
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet_wire import connect_packet, mqtt_str, packets, puback_packet, publish_packet, subscribe_packet

RECEIVE_MAX = 1000  # what a consumer lets the broker send it unacknowledged (mosquitto's default is 20)
WINDOW = 20  # unacknowledged QoS 1 messages per device (the daemon's mqtt.max_inflight)
TOPIC = "edged/{device}/results/cam"
BOOT_ID = "0" * 32  # one boot per simulated device


def payload(device: str, seq: int, size: int) -> bytes:
    """A result-shaped JSON document of about `size` bytes carrying the device, its seq and the send time."""
    head = (
        f'{{"schema":"edged.result/2","device":"{device}","camera":"cam","boot_id":"{BOOT_ID}","seq":{seq},'
        f'"t_ns":{time.time_ns()},'
    )
    pad = max(0, size - len(head) - 10)
    return (head + f'"pad":"{"x" * pad}"}}').encode()


# -- simulated devices -------------------------------------------------------------------------------------
class Device:
    """One device's session on a non-blocking socket: publishes, counts PUBACKs, keeps a backlog."""

    def __init__(self, name: str, size: int, port: int, window: tuple[float, float]) -> None:
        self.name, self.size, self.window = name, size, window
        self.topic = mqtt_str(TOPIC.format(device=name))
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(connect_packet(name))
        self.buf = bytearray()
        while not self.buf or packets(bytearray(self.buf)) == []:  # CONNACK
            self.buf += self.sock.recv(64)
        first, body = packets(self.buf)[0]
        if first >> 4 != 2 or body[1] != 0:
            raise ConnectionError(f"{name}: no CONNACK or refused ({body[1]})")
        self.sock.setblocking(False)
        self.seq = 0
        self.mid = 0
        self.inflight: dict[int, int] = {}  # mid -> seq
        self.backlog: collections.deque[int] = collections.deque()  # seqs waiting for a free slot
        self.acked: list[int] = []
        self.max_backlog = 0
        self.sent_in_window = 0

    def readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        self.buf += data
        for first, body in packets(self.buf):
            if first >> 4 == 4:  # PUBACK
                mid = struct.unpack("!H", body[:2])[0]
                reason = body[2] if len(body) > 2 else 0
                seq = self.inflight.pop(mid, None)
                if seq is not None and reason < 0x80:
                    self.acked.append(seq)
        while self.backlog and len(self.inflight) < WINDOW:
            self._send(self.backlog.popleft())

    def publish(self) -> None:
        self.seq += 1
        if len(self.inflight) < WINDOW and not self.backlog:
            self._send(self.seq)
        else:
            self.backlog.append(self.seq)
            self.max_backlog = max(self.max_backlog, len(self.backlog))

    def _send(self, seq: int) -> None:
        self.mid = self.mid % 65535 + 1
        self.inflight[self.mid] = seq
        if self.window[0] <= time.monotonic() < self.window[1]:
            self.sent_in_window += 1
        # a few hundred bytes into an empty socket buffer: written whole or the run is broken
        self.sock.sendall(publish_packet(self.topic, self.mid, payload(self.name, seq, self.size)))


def run_devices(port: int, names: list[str], args: dict[str, Any], start_at: float, stop_at: float) -> dict[str, Any]:
    window = (start_at + args["warmup"], stop_at)
    devices = [Device(n, args["payload"], port, window) for n in names]
    poll = select.epoll()
    by_fd = {d.sock.fileno(): d for d in devices}
    for fd in by_fd:
        poll.register(fd, select.EPOLLIN)
    period = 1.0 / args["rate"]
    start = max(time.monotonic(), start_at)
    due = [start + period * i / len(devices) for i in range(len(devices))]  # spread over one period
    due_in_window = 0

    def read(timeout: float) -> None:
        for fd, _ in poll.poll(timeout):
            by_fd[fd].readable()

    while True:
        now = time.monotonic()
        if now >= stop_at:
            break
        for i, d in enumerate(devices):
            while due[i] <= now:
                d.publish()
                if window[0] <= due[i] < window[1]:
                    due_in_window += 1
                due[i] += period
        read(0.005)
    # the devices stop producing; their windows and backlogs drain (a device keeps what is not acknowledged)
    end = time.monotonic() + 60
    while time.monotonic() < end and any(d.inflight or d.backlog for d in devices):
        read(0.05)
    for d in devices:
        d.sock.setblocking(True)
        d.sock.sendall(b"\xe0\x00")  # DISCONNECT
        d.sock.close()
    return {
        "acked": {d.name: d.acked for d in devices},
        "published": sum(d.seq for d in devices),
        "due_in_window": due_in_window,
        "sent_in_window": sum(d.sent_in_window for d in devices),
        "unacked": sum(len(d.inflight) + len(d.backlog) for d in devices),
        "max_backlog": max(d.max_backlog for d in devices),
    }


def device_worker(port: int, names: list[str], args: dict[str, Any], start_at: float, stop_at: float, out: Any) -> None:
    out.put(run_devices(port, names, args, start_at, stop_at))


def fields(doc: bytes) -> tuple[str, int, int]:
    """(device, seq, t_ns) of a payload() document, without a JSON parser (the consumer's hot path)."""
    i = doc.index(b'"device":"') + 10
    device = doc[i : doc.index(b'"', i)].decode()
    i = doc.index(b'"seq":', i) + 6
    j = doc.index(b",", i)
    k = doc.index(b'"t_ns":', j) + 7
    return device, int(doc[i:j]), int(doc[k : doc.index(b",", k)])


# -- consumers ---------------------------------------------------------------------------------------------
def consumer_worker(
    port: int, topic: str, index: int, ready: Any, done: Any, measure: tuple[float, float], out: Any
) -> None:
    """A blocking-socket QoS 1 subscriber: acknowledges every PUBLISH, records (device, seq) and latency."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(connect_packet(f"fleet-consumer-{index}", receive_maximum=RECEIVE_MAX) + subscribe_packet(1, topic))
    sock.settimeout(0.2)
    buf = bytearray()
    got: dict[str, list[int]] = collections.defaultdict(list)
    latencies: list[float] = []
    received_in_window = 0
    idle_since = None
    subscribed = False
    while True:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            data = b""
            if done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 2.0:  # nothing for 2 s after the devices drained
                    break
            continue
        if not data:
            break
        idle_since = None
        buf += data
        acks = bytearray()
        now_ns, now = time.time_ns(), time.monotonic()
        for first, body in packets(buf):
            kind = first >> 4
            if kind == 9 and not subscribed:  # SUBACK
                subscribed = True
                ready.put(index)
            elif kind == 3:
                tlen = struct.unpack("!H", body[:2])[0]
                pos = 2 + tlen
                mid = struct.unpack("!H", body[pos : pos + 2])[0] if first & 0x06 else 0
                pos += 2 if first & 0x06 else 0
                plen, mult = 0, 1  # the properties' length (a variable byte integer)
                while True:
                    digit = body[pos]
                    pos += 1
                    plen += (digit & 0x7F) * mult
                    mult *= 128
                    if not digit & 0x80:
                        break
                device, seq, t_ns = fields(body[pos + plen :])
                got[device].append(seq)
                if measure[0] <= now < measure[1]:
                    received_in_window += 1
                    latencies.append((now_ns - t_ns) / 1e6)
                if mid:
                    acks += puback_packet(mid)
        if acks:
            sock.sendall(acks)
    sock.sendall(b"\xe0\x00")
    sock.close()
    out.put({"index": index, "got": dict(got), "latencies": latencies, "received_in_window": received_in_window})


# -- the broker --------------------------------------------------------------------------------------------
def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = workdir / "mosquitto.conf"
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false", "max_queued_messages 100000"]
    if os.geteuid() == 0:
        lines.append("user root")
    conf.write_text("\n".join(lines) + "\n")
    log = open(workdir / "broker.log", "wb")  # noqa: SIM115 (the broker's stderr for its whole life)
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=log)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"mosquitto did not listen on {port}: {(workdir / 'broker.log').read_text()[-500:]}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine() -> dict[str, Any]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    version = subprocess.run(
        [shutil.which("mosquitto") or "mosquitto", "-h"], capture_output=True, text=True
    ).stdout.split("\n")[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gb": round(mem / 2**20, 1),
        "load_avg_at_start": os.getloadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mosquitto": version,
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.sessions * 2 + 1024)), hard))
    info = machine()
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="edged-fleet-") as tmp:
        broker, port = start_broker(Path(tmp))
        try:
            return measure(args, ctx, broker, port, info)
        finally:
            broker.terminate()
            broker.wait(10)
            shutil.copy(Path(tmp) / "broker.log", Path(tempfile.gettempdir()) / "edged-fleet-broker.log")


def measure(
    args: argparse.Namespace, ctx: Any, broker: subprocess.Popen[bytes], port: int, info: dict[str, Any]
) -> dict[str, Any]:
    names = [f"sim-{i:05d}" for i in range(args.sessions)]
    topic = "edged/+/results/+" if args.consumers == 1 else "$share/fleet/edged/+/results/+"
    # the connect ramp's length is not known in advance: the publishing starts at a time far enough out
    ramp_s = 3 + args.sessions / 250
    start_at = time.monotonic() + ramp_s
    window = (start_at + args.warmup, start_at + args.warmup + args.seconds)
    ready, out, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    consumers = [
        ctx.Process(target=consumer_worker, args=(port, topic, i, ready, done, window, out))
        for i in range(args.consumers)
    ]
    for p in consumers:
        p.start()
    for _ in consumers:
        ready.get(timeout=30)
    dev_out = ctx.Queue()
    shards = [names[i :: args.processes] for i in range(args.processes)]
    devices = [
        ctx.Process(target=device_worker, args=(port, s, vars(args), start_at, window[1], dev_out)) for s in shards if s
    ]
    for p in devices:
        p.start()
    while time.monotonic() < window[0]:
        time.sleep(0.05)
    cpu0, t0 = cpu_s(broker.pid), time.monotonic()
    gen0 = {p.pid: cpu_s(p.pid) for p in devices + consumers if p.pid is not None}
    rss = [rss_mb(broker.pid)]
    while time.monotonic() < window[1]:
        time.sleep(0.5)
        rss.append(rss_mb(broker.pid))
    elapsed = time.monotonic() - t0
    broker_cpu = (cpu_s(broker.pid) - cpu0) / elapsed * 100
    devices_cpu = sum(cpu_s(p.pid) - gen0[p.pid] for p in devices if p.pid is not None) / elapsed * 100
    consumers_cpu = sum(cpu_s(p.pid) - gen0[p.pid] for p in consumers if p.pid is not None) / elapsed * 100
    dev_results = [dev_out.get(timeout=120) for _ in devices]
    done.set()
    con_results = [out.get(timeout=120) for _ in consumers]
    for p in devices + consumers:
        p.join(10)
    acked: dict[str, list[int]] = {}
    for r in dev_results:
        acked.update(r["acked"])
    received: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for c in con_results:
        for dev, seqs in c["got"].items():
            received[dev].update(seqs)
    missing = [(s, max(seqs)) for dev, seqs in acked.items() for s in seqs if received[dev][s] == 0]
    lost = len(missing)
    # where in a device's run the lost ones were: 0 its first result, 1 its last
    lost_at = sorted(round(s / last, 2) for s, last in missing)
    dupes = sum(n - 1 for counts in received.values() for n in counts.values() if n > 1)
    latencies = [x for c in con_results for x in c["latencies"]]
    # the broker's CPU time per result routed (in from a device, out to a consumer, both PUBACKs): what one
    # core would hold at this cost, were the broker given all of it (CPU time, not wall-clock: the load
    # generator and anything else on the machine take their share of the cores)
    delivered = sum(c["received_in_window"] for c in con_results)
    us_per_result = broker_cpu / 100 * args.seconds / delivered * 1e6 if delivered else 0.0
    return {
        "machine": info,
        "sessions": args.sessions,
        "rate_per_device": args.rate,
        "payload_bytes": len(payload("sim-00000", 1, args.payload)),
        "consumers": args.consumers,
        "subscription": topic,
        "seconds": args.seconds,
        "offered_msgs_per_s": round(sum(r["due_in_window"] for r in dev_results) / args.seconds, 1),
        "sent_msgs_per_s": round(sum(r["sent_in_window"] for r in dev_results) / args.seconds, 1),
        "delivered_msgs_per_s": round(sum(c["received_in_window"] for c in con_results) / args.seconds, 1),
        "per_consumer": [sum(len(v) for v in c["got"].values()) for c in con_results],
        "broker_cpu_pct_of_one_core": round(broker_cpu, 1),
        "broker_rss_mb_max": round(max(rss), 1),
        "broker_cpu_us_per_result": round(us_per_result, 1),
        "devices_per_broker_core": int(1e6 / us_per_result / args.rate) if us_per_result else None,
        "devices_cpu_pct": round(devices_cpu, 1),
        "consumers_cpu_pct": round(consumers_cpu, 1),
        "load_avg_at_end": os.getloadavg(),
        "latency_ms_p50": round(pct(latencies, 0.50), 2),
        "latency_ms_p99": round(pct(latencies, 0.99), 2),
        "published": sum(r["published"] for r in dev_results),
        "acked_by_broker": sum(len(v) for v in acked.values()),
        "unacked_at_end": sum(r["unacked"] for r in dev_results),
        "max_device_backlog": max(r["max_backlog"] for r in dev_results),
        "lost": lost,
        "lost_at_quartiles": [lost_at[int(q * (len(lost_at) - 1))] for q in (0, 0.25, 0.5, 0.75, 1)] if lost_at else [],
        "duplicates": dupes,
    }


def report(r: dict[str, Any]) -> str:
    m = r["machine"]
    load = m["load_avg_at_start"][0]
    return "\n".join(
        [
            f"fleet: {r['sessions']} simulated devices x {r['rate_per_device']} QoS 1 results/s of "
            f"{r['payload_bytes']} B -> one mosquitto on 127.0.0.1 -> {r['consumers']} consumer(s) on "
            f"{r['subscription']}",
            f"machine: {m['cpu']}, {m['cores']} cores, {m['mem_gb']} GB, load avg at start {load:.2f}; "
            f"{m['mosquitto']}; Python {m['python']} (devices and consumers share the machine with the broker)",
            f"offered        {r['offered_msgs_per_s']:>10.0f} msg/s",
            f"sent           {r['sent_msgs_per_s']:>10.0f} msg/s  (measured {r['seconds']} s)",
            f"delivered      {r['delivered_msgs_per_s']:>10.0f} msg/s  per consumer (whole run): {r['per_consumer']}",
            f"broker CPU     {r['broker_cpu_pct_of_one_core']:>10.1f} % of one core   "
            f"RSS max {r['broker_rss_mb_max']} MB",
            f"               {r['broker_cpu_us_per_result']} us of broker CPU per result routed: one core would hold "
            f"~{r['devices_per_broker_core']} devices at this rate (CPU time, extrapolated)",
            f"load generator {r['devices_cpu_pct']:>10.1f} % (devices)  {r['consumers_cpu_pct']:.1f} % (consumers) "
            f"of one core; machine load avg at end {r['load_avg_at_end'][0]:.2f}",
            f"latency        p50 {r['latency_ms_p50']} ms   p99 {r['latency_ms_p99']} ms  "
            "(device send -> consumer receive)",
            f"loss           {r['lost']} of {r['acked_by_broker']} acknowledged ({r['unacked_at_end']} never "
            f"acknowledged, {r['duplicates']} duplicates; largest device backlog {r['max_device_backlog']})",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=27.0, help="results/s per device")
    ap.add_argument(
        "--payload", type=int, default=390, help="bytes per result (the demo device: 390, bench/fleet_modes.py)"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--processes", type=int, default=2, help="processes simulating the devices")
    ap.add_argument("--consumers", type=int, default=1, help=">1: a shared subscription")
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.txt (e.g. bench/results/fleet)")
    args = ap.parse_args()
    result = run(args)
    text = report(result)
    print(text)
    if args.out is not None:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{args.out}.txt").write_text(text + "\n")
    if result["lost"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
