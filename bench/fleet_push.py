"""The pusher's memory with a big fleet: `edged push --group fleet` to N simulated devices (default 1,000).

One mosquitto on loopback; the devices are lightweight paho sessions (several processes, each driving
its share of the sessions from one select loop) that answer as a daemon does: a retained ``online``
status listing group ``fleet``, the offer answered on its response topic, chunks asked for in a window
of `--window` requests of `--chunk-kb`, ``probation`` on ``ota/status`` once every byte arrived. They
check nothing (no signature, no hash): what is measured is the pusher.

It runs the push twice against the same fleet: ``edged push`` as shipped (the rollout's pusher: fenced
discovery, the bounded outgoing queue) and, for comparison, the plain `Pusher` that serves each chunk
from paho's thread with an unbounded queue (``--plain`` also). For each it prints devices discovered and
succeeded, wall time, and the pusher process's peak RSS (its ``ru_maxrss`` from wait4).

    python bench/fleet_push.py --devices 1000 --size-mib 1
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import selectors
import shutil
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

from edged.models.demo import default_dir, fetch_demo
from edged.models.package import pack_tar, write_package
from edged.models.signing import generate_key, load_signing_key
from edged.protocol.ota import chunk_key
from edged.protocol.schemas import OTA_SCHEMA, REPLY_SCHEMA

PREFIX = "edged"
GROUP = "fleet"
REASK_S = 5.0

PLAIN = """
import sys
from pathlib import Path
from edged.daemon.config import MqttConfig
from edged.deploy.push import Pusher, report
cfg = MqttConfig(host="127.0.0.1", port=int(sys.argv[2]))
p = Pusher(cfg, Path(sys.argv[1]))
p.connect()
online, offline = p.discover("fleet", 2.0)
print(f"push: group 'fleet': {len(online)} online", file=sys.stderr)
p.push(online, "swap", float(sys.argv[3]))
report(p, "swap", 0.0, sys.stderr)
p.close()
"""


class Sim:
    """One simulated device's session."""

    def __init__(self, dev: str, chunk: int, window: int) -> None:
        self.dev = dev
        self.root = f"{PREFIX}/{dev}"
        self.chunk, self.window = chunk, window
        self.transfer = ""
        self.todo: list[tuple[str, int, int]] = []  # (file, offset, length) not asked for yet
        self.asked: dict[tuple[str, int], int] = {}
        self.got = self.total = 0
        self.model: dict[str, Any] = {}
        self.last = 0.0
        self.done = 0
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sim-{dev}", protocol=mqtt.MQTTv5)
        self.c.will_set(f"{self.root}/status", json.dumps({"state": "offline", "groups": [GROUP]}), 1, True)
        self.c.on_connect = self.on_connect
        self.c.on_message = self.on_message

    def on_connect(self, c: mqtt.Client, u: Any, f: Any, rc: Any, p: Any) -> None:
        c.publish(f"{self.root}/status", json.dumps({"state": "online", "groups": [GROUP]}), 1, True)
        c.subscribe([(f"{self.root}/cmd/ota", 1), (f"{self.root}/ota/data", 0)])

    def status(self, state: str) -> None:
        doc = {"schema": OTA_SCHEMA, "transfer": self.transfer, "state": state, "ts": time.time()}
        doc.update(model=self.model, bytes=self.got, total=self.total)
        self.c.publish(f"{self.root}/ota/status", json.dumps(doc), 1, True)

    def on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/cmd/ota"):
            doc = json.loads(msg.payload)
            m = json.loads(base64.b64decode(doc["manifest"]))
            self.transfer, self.model = doc["transfer"], {"name": m["name"], "version": m["version"]}
            files = sorted((name, int(e["size"])) for name, e in m["files"].items())
            self.todo = [
                (n, off, min(self.chunk, size - off)) for n, size in files for off in range(0, size, self.chunk)
            ]
            self.todo.reverse()
            self.asked.clear()
            self.got, self.total = 0, sum(s for _, s in files)
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.CorrelationData = msg.properties.CorrelationData  # type: ignore[union-attr]
            reply = {"schema": REPLY_SCHEMA, "verb": "ota", "ok": True, "result": {"state": "accepted"}}
            c.publish(msg.properties.ResponseTopic, json.dumps(reply), 1, properties=props)  # type: ignore[union-attr]
            self.status("accepted")
            self.ask()
        elif self.transfer:
            (transfer, name, off), start = chunk_key(msg.payload)
            n = self.asked.pop((name, off), None)
            if transfer != self.transfer or n is None:
                return
            self.got += len(msg.payload) - start
            self.last = time.monotonic()
            self.ask()
            if not self.todo and not self.asked:
                self.status("probation")
                self.transfer = ""
                self.done += 1

    def ask(self) -> None:
        while self.todo and len(self.asked) < self.window:
            name, off, n = self.todo.pop()
            self.asked[(name, off)] = n
            req = {"transfer": self.transfer, "file": name, "offset": off, "length": n}
            self.c.publish(f"{self.root}/ota/req", json.dumps(req), 0)
        self.last = time.monotonic()

    def reask(self) -> None:
        if self.transfer and self.asked and time.monotonic() - self.last > REASK_S:
            self.todo.extend((name, off, n) for (name, off), n in self.asked.items())
            self.asked.clear()
            self.ask()


def worker(devs: list[str], port: int, chunk: int, window: int, ready: Any, stop: Any) -> None:
    sims = [Sim(d, chunk, window) for d in devs]
    sel = selectors.DefaultSelector()
    for s in sims:
        s.c.connect("127.0.0.1", port, keepalive=120)
        sel.register(s.c.socket(), selectors.EVENT_READ, s)  # type: ignore[arg-type]
    ready_sent = False
    last_misc = 0.0
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.05):
            key.data.c.loop_read(64)
        for s in sims:
            if s.c.want_write():
                s.c.loop_write()
        now = time.monotonic()
        if now - last_misc > 1.0:
            last_misc = now
            for s in sims:
                s.c.loop_misc()
                s.reask()
            if not ready_sent and all(s.c.is_connected() for s in sims):
                ready.release()
                ready_sent = True
    for s in sims:
        s.c.disconnect()


def build_package(tmp: Path, size_mib: float) -> Path:
    demo = fetch_demo(default_dir()).packages["blazeface-back"]
    fields = demo.manifest.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
    blob = tmp / "blob.bin"
    blob.write_bytes(os.urandom(int(size_mib * 2**20)))
    key = load_signing_key(generate_key(tmp / "key")[0])
    pkg = write_package(
        tmp / "pkg",
        {**fields, "version": 9},
        {"model.onnx": demo.model_path, "labels.txt": demo.root / "labels.txt", "blob.bin": blob},
    )
    return pack_tar(pkg, tmp / "pkg.tar", key.sign(pkg.manifest_bytes))


def run_pusher(cmd: list[str], timeout: float) -> tuple[int, float, float, str]:
    """(exit status, seconds, peak RSS MiB, stderr) of one pusher process."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
            time.sleep(0.2)
        seconds = time.monotonic() - t0
        err.seek(0)
        text = err.read().decode(errors="replace")
    return os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss / 1024, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=4, help="processes driving the simulated sessions")
    ap.add_argument("--size-mib", type=float, default=1.0, help="the package's extra file (plus the demo model)")
    ap.add_argument("--chunk-kb", type=int, default=64)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--max-queued", type=int, default=100000, help="mosquitto's max_queued_messages (the shipped edged.conf's)"
    )
    ap.add_argument("--skip-plain", action="store_true", help="only `edged push` as shipped")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-push-"))
    port = 20000 + os.getpid() % 20000
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages {args.max_queued}\n")
    broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[mp.Process] = []
    stop = mp.Event()
    try:
        pkg = build_package(tmp, args.size_mib)
        time.sleep(0.5)
        ready = mp.Semaphore(0)
        ids = [f"sim-{i:04}" for i in range(args.devices)]
        for k in range(args.procs):
            share = ids[k :: args.procs]
            p = mp.Process(target=worker, args=(share, port, args.chunk_kb * 1024, args.window, ready, stop))
            p.start()
            procs.append(p)
        for _ in procs:
            if not ready.acquire(timeout=120):
                raise SystemExit("the simulated devices did not all connect within 120 s")
        print(f"fleet_push: {args.devices} simulated devices connected; package {pkg.stat().st_size / 2**20:.1f} MiB")
        host = ["--host", "127.0.0.1", "--port", str(port)]
        runs = [
            (
                "edged push (rollout, bounded queue)",
                [
                    sys.executable,
                    "-m",
                    "edged",
                    "push",
                    str(pkg),
                    "--group",
                    GROUP,
                    *host,
                    "--timeout",
                    str(args.timeout),
                    "--state",
                    str(tmp / "rollout.json"),
                ],
            )
        ]
        if not args.skip_plain:
            runs.append(
                (
                    "plain Pusher (unbounded queue)",
                    [sys.executable, "-c", PLAIN, str(pkg), str(port), str(args.timeout)],
                )
            )
        rows = []
        for name, cmd in runs:
            code, seconds, rss, err = run_pusher(cmd, args.timeout + 60)
            found = next((ln for ln in err.splitlines() if "group 'fleet'" in ln), "?")
            ok = next((ln for ln in err.splitlines() if "device(s) succeeded" in ln), "?")
            rows.append((name, rss))
            print(f"{name}: exit {code}, {seconds:.1f} s, peak RSS {rss:.0f} MiB\n  {found.strip()}\n  {ok.strip()}")
        if len(rows) == 2:
            print(f"fleet_push: peak RSS ratio plain/bounded = {rows[1][1] / rows[0][1]:.2f}")
        return 0
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
