#!/usr/bin/env python3
"""What the live view costs inference: one real daemon (the demo video read as fast as inference takes it,
BlazeFace on ONNX Runtime, the live view on) against a private mosquitto on 127.0.0.1, measured in phases
that alternate nobody watching and one viewer on the MJPEG stream (``/live/stream``, at ``live_max_fps``):
inference results per second (``edged_inference_results_total`` from /metrics), the daemon's CPU seconds
per second (/proc), views encoded (``/live/state``) and parts the viewer received.

    python bench/liveview.py [--seconds 10] [--rounds 2] [--fps 5] [--out bench/results/liveview.txt]

The viewer's drawing and encoding run on its HTTP thread; with inference CPU-bound, what it takes shows as
a lower inference rate in the viewer's phases. Each phase starts after a second's settling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from edged.models.demo import fetch_demo  # noqa: E402
from tests.conftest import Broker, free_port  # noqa: E402  (the tests' mosquitto, as bench/swap.py uses it)


def results_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("edged_inference_results_total "):
                return float(line.split()[1])
    raise RuntimeError("no edged_inference_results_total in /metrics")


def live_state(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/live/state", timeout=10) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Viewer:
    """One MJPEG viewer on its own thread: reads parts until stopped, counting them."""

    def __init__(self, port: int) -> None:
        self.parts = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self.thread.start()

    def _run(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/live/stream?camera=lobby", timeout=10) as r:
            while not self.stop.is_set():
                line = r.readline()
                if not line:
                    return
                if line.startswith(b"Content-Length:"):
                    r.readline()
                    r.read(int(line.split(b":")[1]))
                    self.parts += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def view_cost_ms(video: Path) -> float:
    """The median time to draw one view (boxes, a zone) and encode it, on a frame of the demo video, in ms."""
    import cv2

    from edged.daemon.scene.draw import Shape, draw_scene, encode_jpeg

    cap = cv2.VideoCapture(str(video))
    cap.set(cv2.CAP_PROP_POS_FRAMES, 100)
    ok, frame = cap.read()
    cap.release()
    if not ok:
        raise RuntimeError(f"cannot read {video}")
    dets = [{"box": [413, 137, 507, 235], "label": "face", "score": 0.95, "track_id": 1}]
    zone = [Shape("hall", [(0.05, 0.06), (0.95, 0.06), (0.95, 0.94), (0.05, 0.94)], normalized=True)]
    took = []
    for _ in range(60):
        t0 = time.perf_counter()
        encode_jpeg(draw_scene(frame, dets, zone, max_width=960), 70)
        took.append(time.perf_counter() - t0)
    return 1000 * statistics.median(took[10:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of phases (nobody, one viewer)")
    ap.add_argument("--fps", type=float, default=5.0, help="health.live_max_fps")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    demo = fetch_demo()
    work = Path(tempfile.mkdtemp(prefix="edged-liveview-"))
    (work / "broker").mkdir()
    broker = Broker(work / "broker")
    broker.start()
    port = free_port()
    cfg = {
        "device_id": "bench-01",
        "state_dir": str(work / "state"),
        "mqtt": {"host": broker.host, "port": broker.port},
        "model": {"package": str(demo.packages["blazeface-back"].root), "onnxruntime": {"threads": 1}},
        "cameras": [{"name": "lobby", "uri": f"file://{demo.video}", "loop": True, "realtime": False}],
        "inference": {"max_wait_ms": 20},
        "detection": {"score_threshold": 0.7},
        "telemetry": {"interval_s": 1},
        "health": {"enabled": True, "port": port, "live_view": True, "live_max_fps": args.fps},
    }
    (work / "edged.yaml").write_text(yaml.safe_dump(cfg))
    log = open(work / "daemon.log", "wb")  # noqa: SIM115  (open for the daemon's whole life)
    proc = subprocess.Popen([sys.executable, "-m", "edged", "run", "-c", str(work / "edged.yaml")], stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
    rows: list[tuple[str, float, float, int, int]] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if results_total(port) > 50:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the daemon did not serve; its log: {work / 'daemon.log'}")
            time.sleep(0.5)
        assert live_state(port)["encoded"] == 0, "views were encoded before anyone watched"
        for _ in range(args.rounds):
            for phase in ("nobody", "one viewer"):
                viewer = Viewer(port) if phase == "one viewer" else None
                time.sleep(1.0)  # settle
                n0, c0, e0, t0 = results_total(port), cpu_s(proc.pid), live_state(port)["encoded"], time.monotonic()
                p0 = viewer.parts if viewer else 0
                time.sleep(args.seconds)
                n1, c1, e1, t1 = results_total(port), cpu_s(proc.pid), live_state(port)["encoded"], time.monotonic()
                parts = (viewer.parts - p0) if viewer else 0
                if viewer:
                    viewer.close()
                rows.append((phase, (n1 - n0) / (t1 - t0), (c1 - c0) / (t1 - t0), e1 - e0, parts))
    finally:
        proc.terminate()
        proc.wait(30)
        broker.stop()
    lines = [
        f"live view cost: demo video read as fast as inference takes it, BlazeFace batch 4 on ONNX Runtime "
        f"(1 thread), live_max_fps {args.fps:g}, {args.seconds:g} s phases, {os.cpu_count()} CPUs",
        f"{'phase':<12} {'results/s':>10} {'daemon CPU s/s':>15} {'encoded':>8} {'parts sent':>11}",
    ]
    lines += [f"{p:<12} {r:>10.1f} {c:>15.2f} {e:>8d} {n:>11d}" for p, r, c, e, n in rows]
    none = statistics.median(r for p, r, *_ in rows if p == "nobody")
    one = statistics.median(r for p, r, *_ in rows if p == "one viewer")
    enc = [e for p, _, _, e, _ in rows if p == "nobody"]
    lines.append(
        f"median results/s: nobody {none:.1f}, one viewer {one:.1f} ({100 * (one - none) / none:+.1f} %); "
        f"views encoded while nobody watched: {sum(enc)}"
    )
    ms = view_cost_ms(demo.video)
    lines.append(
        f"one view drawn and encoded (960x540, a box, a zone, quality 70): {ms:.1f} ms median, so one viewer at "
        f"{args.fps:g} fps costs about {ms * args.fps / 1000:.3f} CPU s/s, on the viewer's HTTP thread"
    )
    report = "\n".join(lines)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
