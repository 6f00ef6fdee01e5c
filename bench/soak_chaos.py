#!/usr/bin/env python3
"""Chaos soak: the daemon under a seeded schedule of faults, every result counted, its resources watched.

The daemon runs as its own process with a looping file camera (the demo video: a loop wrap every 20 s)
and an RTSP camera (tests/rtsp_server.py), against a real mosquitto with persistence on 127.0.0.1
(soak_rig.py). After a warm-up, a schedule drawn from --seed does, in a shuffled order spread over the
run: SIGKILL the broker and start it again on the same port; SIGSTOP the daemon and SIGCONT it; SIGHUP it
(a config reload); kill the camera server and start it again; `edged push` a newer signed version of the
model (a hot swap). A QoS 1 subscriber with a persistent session records every result (soak_watch.py).

Reported: lost results (a seq missing within a boot), duplicates (against the daemon's MQTT disconnects:
QoS 1 redelivers what was in flight), loop wraps; the daemon's RSS, fds, threads, spool bytes and state
directory bytes after warm-up and at the end, and their growth per hour (least squares after warm-up).
A table while it runs, a summary at the end; --out PREFIX writes PREFIX.json and PREFIX.txt.

    python bench/soak_chaos.py [--minutes 10] [--seed 1] [--broker-kills N] [--stops N] [--hups N]
                               [--camera-restarts N] [--pushes N] [--out bench/results/soak-chaos]

Counts left out scale with --minutes (per 10 minutes: 3 broker kills, 2 stops, 1 SIGHUP, 2 camera
restarts, 1 push; at least one each).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported by the tests

import soak_rig as rig
from soak_watch import HEADER, Results, Sampler, growth, row, tally

from edged.models.demo import default_dir, fetch_demo

KINDS = ("broker_kill", "stop_cont", "sighup", "camera_restart", "ota_push")
PER_10_MIN = {"broker_kill": 3, "stop_cont": 2, "sighup": 1, "camera_restart": 2, "ota_push": 1}
FLAGS = {
    "broker_kill": "broker-kills",
    "stop_cont": "stops",
    "sighup": "hups",
    "camera_restart": "camera-restarts",
    "ota_push": "pushes",
}
RECOVER_S = 180.0  # a camera's results after its server's restart, a pushed version's results
HOLD_S = {"broker_kill": (1.0, 6.0), "stop_cont": (2.0, 15.0), "camera_restart": (1.0, 5.0)}


@dataclass(frozen=True)
class Action:
    at_s: float  # not before this, from the end of the start-up (the first results)
    kind: str
    hold_s: float  # broker or camera down, or daemon stopped, for this long


def schedule(seed: int, start_s: float, end_s: float, counts: dict[str, int]) -> list[Action]:
    """The actions, shuffled by `seed`, one in each of equal slots of [start_s, end_s], at a random point in
    the first half of its slot."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS for _ in range(counts.get(k, 0))]
    rng.shuffle(kinds)
    slot = (end_s - start_s) / max(1, len(kinds))
    out = []
    for i, kind in enumerate(kinds):
        lo, hi = HOLD_S.get(kind, (0.0, 0.0))
        out.append(Action(round(start_s + i * slot + rng.uniform(0, slot / 2), 1), kind, round(rng.uniform(lo, hi), 1)))
    return out


@dataclass
class Plan:
    minutes: float = 10.0
    seed: int = 1
    warmup_s: float = 60.0  # after the first results from both cameras: not measured against
    base_s: float = 30.0  # the windows whose medians are "after warm-up" and "at the end"
    cooldown_s: float = 45.0  # after the last action, with nothing done
    sample_s: float = 5.0
    print_s: float = 30.0
    counts: dict[str, int] = field(default_factory=dict)
    # done at once after the start-up, inside the warm-up (so before the "after warm-up" window): e.g. an
    # ota_push, whose side-by-side swap raises RSS once (+20-35 MB here), which is not what a short run
    # should measure its growth against
    in_warmup: tuple[str, ...] = ()

    def resolved_counts(self) -> dict[str, int]:
        scaled = {k: max(1, round(n * self.minutes / 10)) for k, n in PER_10_MIN.items()}
        return {**scaled, **self.counts}


@dataclass
class Done:
    t_s: float
    kind: str
    hold_s: float
    took_s: float
    detail: str = ""
    ok: bool = True


class Soak:
    def __init__(self, plan: Plan, work: Path, say: Callable[[str], None] = print) -> None:
        self.plan, self.work, self.say = plan, work, say
        self.demo = fetch_demo(default_dir())
        video = rig.h264_video(self.demo.video, default_dir().parent / "soak" / "gate.h264.mp4")
        (work / "broker").mkdir(parents=True, exist_ok=True)
        self.broker = rig.Broker(work / "broker", persistence=True)
        self.camera = rig.Camera(video, work / "camera.log")
        self.broker.start()
        try:
            self.camera.start()
            self.packages = rig.Packages(self.demo, work)
            self.cfg = rig.daemon_config(self.demo, work, self.broker, self.camera, self.packages.trusted)
            self.version = 1
            r = rig.edged("model", "install", str(self.packages.build(1)), "-c", str(self.cfg), work=work)
            if r.returncode != 0:
                raise RuntimeError(f"edged model install: {r.stderr}")
            self.results = Results(self.broker.host, self.broker.port, rig.DEVICE)
        except BaseException:
            self.camera.kill()
            self.broker.stop()
            raise
        self.daemon = rig.Daemon(self.cfg, work / "daemon.log")
        self.done: list[Done] = []
        self.t0 = time.monotonic()
        self.sampler: Sampler | None = None
        self._printed = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        self.say(f"{self.now():7.0f}  -- {text}")

    def alive(self) -> None:
        if self.daemon.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {self.daemon.proc.returncode}:\n{self.daemon.output()[-3000:]}")

    def wait(self, pred: Callable[[], bool], limit_s: float, what: str) -> None:
        end = time.monotonic() + limit_s
        while not pred():
            self.alive()
            self.tick()
            if time.monotonic() > end:
                raise TimeoutError(f"timed out after {limit_s:g} s waiting for {what}")
            time.sleep(0.2)

    def tick(self) -> None:
        """Print a row of the table every print_s."""
        if self.sampler is None or self.now() - self._printed < self.plan.print_s:
            return
        s = self.sampler.sample()
        if s is not None:
            self._printed = self.now()
            self.say(row(s))

    def delivering(self, camera: str, after: int) -> bool:
        return any(r.camera == camera for r in self.results.snapshot()[after:])

    def start(self) -> None:
        self.say(f"soak: waiting for the daemon to serve both cameras (log {self.daemon.log})")
        for cam in ("lobby", "gate"):
            self.wait(lambda cam=cam: self.delivering(cam, 0), 600, f"results from camera {cam}")  # type: ignore[misc]
        self.t0 = time.monotonic()
        self.sampler = Sampler(self.daemon.pid, self.work / "state", self.results, self.t0, self.plan.sample_s)
        self.say(HEADER)

    def recovered(self, pred: Callable[[], bool], what: str) -> tuple[bool, str]:
        """Wait up to RECOVER_S for `pred`; past it, a finding (the daemon's threads' stacks saved with
        py-spy where installed), not the end of the run."""
        try:
            self.wait(pred, RECOVER_S, what)
            return True, ""
        except TimeoutError:
            return False, f"{what} within {RECOVER_S:g} s; {rig.stacks(self.daemon.pid, self.work)}"

    def act(self, a: Action) -> Done:
        t = self.now()
        mark = self.results.count()
        detail, ok = "", True
        if a.kind == "broker_kill":
            rig.broker_kill(self.broker)
            time.sleep(a.hold_s)
            self.broker.start()
        elif a.kind == "stop_cont":
            self.daemon.signal(signal.SIGSTOP)
            time.sleep(a.hold_s)
            self.daemon.signal(signal.SIGCONT)
        elif a.kind == "sighup":
            self.daemon.signal(signal.SIGHUP)
        elif a.kind == "camera_restart":
            self.camera.kill()
            time.sleep(a.hold_s)
            self.camera.start()
            ok, detail = self.recovered(lambda: self.delivering("gate", mark), "camera gate: no result")
        elif a.kind == "ota_push":
            self.version += 1
            tar = self.packages.build(self.version)
            host = ["--host", self.broker.host, "--port", str(self.broker.port)]
            args = ["push", str(tar), "--device", rig.DEVICE, *host, "--timeout", "300"]
            r = rig.edged(*args, work=self.work, timeout=400)
            ok = r.returncode == 0
            detail = (r.stderr.strip().splitlines() or [""])[-1]
            if ok:
                v = self.version
                ok, more = self.recovered(
                    lambda: any(x.version == v for x in self.results.snapshot()[mark:]), f"no v{v} result"
                )
                detail = f"{detail}; {more}" if more else detail
        return Done(round(t, 1), a.kind, a.hold_s, round(self.now() - t, 1), detail, ok)

    def run(self) -> dict[str, Any]:
        plan = self.plan
        total_s = plan.minutes * 60
        first_s = plan.warmup_s + plan.base_s
        actions = schedule(plan.seed, first_s, max(first_s + 1, total_s - plan.cooldown_s), plan.resolved_counts())
        try:
            self.start()
            for kind in plan.in_warmup:
                self.event(f"{kind} (in the warm-up)")
                self.done.append(self.act(Action(0.0, kind, 0.0)))
            for a in actions:
                self.wait(lambda a=a: self.now() >= a.at_s, total_s * 3, "the next action")  # type: ignore[misc]
                self.event(f"{a.kind}" + (f" for {a.hold_s:g} s" if a.hold_s else ""))
                self.done.append(self.act(a))
                if self.done[-1].detail:
                    self.event(f"{a.kind}: {self.done[-1].detail}")
            end_s = max(total_s, self.now() + plan.cooldown_s)
            self.wait(lambda: self.now() >= end_s, end_s + 60, "the end of the run")
            assert self.sampler is not None
            self.sampler.sample()
            end_s = self.now()
            self.event("stopping the daemon (SIGTERM)")
            rc = self.daemon.stop()
            last = -1
            while (n := self.results.count()) != last:  # the spool's last results, sent at the stop
                last = n
                time.sleep(3)
            return self.report(actions, end_s, rc)
        finally:
            self.close()

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.daemon.proc.poll() is None:
            self.daemon.stop(30)
        self.results.close()
        self.camera.kill()
        self.broker.stop()

    def report(self, actions: list[Action], end_s: float, rc: int) -> dict[str, Any]:
        assert self.sampler is not None
        samples = self.sampler.snapshot()
        t = tally(self.results.snapshot(), "lobby")
        log = self.daemon.output()
        tel = self.results.last_telemetry() or {}
        mqtt_stats = tel.get("mqtt", {})
        produced = (
            mqtt_stats.get("results", 0) - mqtt_stats.get("dropped_queue_full", 0) - mqtt_stats.get("oversized", 0)
        )
        highest = max((b["highest_seq"] for b in t["boots"].values()), default=0)
        p = self.plan
        res: dict[str, Any] = {
            "seed": p.seed,
            "minutes_planned": p.minutes,
            "measured_s": round(end_s, 1),
            "warmup_s": p.warmup_s,
            "in_warmup": list(p.in_warmup),
            "schedule": [asdict(a) for a in actions],
            "actions": [asdict(d) for d in self.done],
            "action_counts": {k: sum(1 for d in self.done if d.kind == k) for k in KINDS},
            "daemon_exit": rc,
            "mqtt_disconnects": log.count("mqtt: disconnected"),
            "daemon_connects": mqtt_stats.get("connects"),
            "tracebacks_in_log": log.count("Traceback"),
            "results": t,
            "daemon_results": produced,
            "unreceived_tail": produced - highest,
            "camera_reconnects": {n: c.get("reconnects") for n, c in tel.get("cameras", {}).items()},
            "growth": {
                k: growth(samples, k, p.warmup_s, p.base_s, end_s)
                for k in ("rss_mb", "fds", "threads", "spool_bytes", "state_bytes")
            },
            "samples": [asdict(s) for s in samples],
        }
        return res


def summary(res: dict[str, Any]) -> str:
    r, g = res["results"], res["growth"]
    out = io.StringIO()
    with redirect_stdout(out):
        minutes = res["measured_s"] / 60
        print(f"seed {res['seed']}, {minutes:.1f} min measured after start-up; actions {res['action_counts']}")
        print(f"results: {r['unique']} unique of {r['received']} received; per camera {r['per_camera']}")
        print(f"  lost {r['lost']}, duplicates {r['duplicates']} (MQTT disconnects {res['mqtt_disconnects']})")
        print(f"  daemon counted {res['daemon_results']} results; not received at the end: {res['unreceived_tail']}")
        print(f"  loop wraps {r['loop_wraps']}; model versions in order {r['versions_in_order']}")
        print(f"  longest silence between a camera's results (s): {r['longest_silence_s']}")
        print(f"  camera reconnects {res['camera_reconnects']}; daemon exit {res['daemon_exit']}")
        print(f"{'':14}{'after warm-up':>14}{'end':>10}{'growth':>10}{'per hour':>10}{'peak':>10}")
        for k, v in g.items():
            scale, name = (2**20, k.replace("_bytes", "_mb")) if k.endswith("_bytes") else (1, k)
            cells = [round(v[c] / scale, 2) for c in ("after_warmup", "end", "growth", "per_hour", "peak")]
            print(f"{name:14}" + "".join(f"{c:>{w}g}" for c, w in zip(cells, (14, 10, 10, 10, 10), strict=True)))
        for d in res["actions"]:
            note = f"  {d['detail']}" if d["detail"] else ""
            print(f"  {d['t_s']:7.1f} s  {d['kind']:15} hold {d['hold_s']:5.1f} s  took {d['took_s']:6.1f} s{note}")
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--print-s", type=float, default=30.0)
    for kind, flag in FLAGS.items():
        ap.add_argument(f"--{flag}", dest=kind, type=int, default=None, help="how many (default: scaled)")
    ap.add_argument("--work", type=Path, help="keep the run's files here (default: a temporary folder)")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.txt")
    a = ap.parse_args(argv)
    counts = {k: getattr(a, k) for k in KINDS if getattr(a, k) is not None}
    plan = Plan(a.minutes, a.seed, a.warmup_s, sample_s=a.sample_s, print_s=a.print_s, counts=counts)
    work = a.work or Path(tempfile.mkdtemp(prefix="edged-soak-chaos-"))
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    res = Soak(plan, work, say).run()
    text = summary(res)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
        a.out.with_suffix(".txt").write_text("\n".join(lines) + "\n\n" + text)
    r = res["results"]
    return 0 if r["lost"] == 0 and res["daemon_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
