#!/usr/bin/env python3
"""A camera's CPU per second with recording on and off (a benchmark script, not a test).

Each run is one child process holding one camera (capture/camera.py, preprocessing into a 256x256 row as the
demo model's, frames taken by a consumer thread as inference takes them) for --seconds after a warm-up; its
CPU (user + system, every thread: Python's and GStreamer's) per wall second is the figure. Sources:

    rtsp     tests/rtsp_server.py sends the demo video as H.264 (keyframe every second, 2 Mbit/s) without
             re-encoding it; recording copies the camera's own packets after the parser (no re-encode)
    encode   file:// of the demo video (MPEG-4 part 2, 960x540, 15 fps, played in real time, looped); recording
             encodes the decoder's frames with each H.264 encoder present (x264enc, openh264enc, nvv4l2h264enc)

Within each repeat every variant runs once, interleaved; every figure is the median over --repeats, and the
on/off ratios are taken within a repeat, then their median.

    python bench/record_cpu.py [--seconds 8] [--repeats 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WARMUP_S = 2.0


def child(uri: str, record: dict[str, Any] | None, seconds: float) -> None:
    """One camera for `seconds` after the warm-up; prints one JSON line with its CPU per second."""
    from edged.daemon.capture.camera import Camera
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.daemon.config import CameraConfig
    from edged.models.package import InputSpec

    cond, stop = threading.Condition(), threading.Event()
    cfg: dict[str, Any] = {"name": "bench", "uri": uri, "loop": uri.startswith("file://"), "reconnect_min_s": 0.2}
    if record is not None:
        cfg["record"] = record
    spec = InputSpec(name="x", shape=[1, 256, 256, 3], layout="NHWC")
    cam = Camera(CameraConfig.model_validate(cfg), Preprocessor(spec), cond, stop)
    taken = [0]

    def consume() -> None:
        while not stop.is_set():
            with cond:
                got = cam.take_locked()
                if got:
                    taken[0] += 1
                    cam.release_locked(got[0])
                cond.wait(0.05)

    cam.start()
    threading.Thread(target=consume, daemon=True).start()
    time.sleep(WARMUP_S)
    t0, c0, f0 = time.monotonic(), os.times(), taken[0]
    time.sleep(seconds)
    t1, c1, f1 = time.monotonic(), os.times(), taken[0]
    ring = cam.ring
    out = {
        "cpu_per_s": ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0),
        "fps": (f1 - f0) / (t1 - t0),
        "state": cam.stats.state,
        "record_path": cam.record_path,
        "record_why": cam.record_why,
        "ring": ring.stats() if ring is not None else None,
    }
    print(json.dumps(out), flush=True)
    stop.set()
    cam.join(5)


def run_child(uri: str, record: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", uri, "--record", json.dumps(record), "--seconds", str(seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def h264_file(video: Path, work: Path) -> Path:
    out = work / "demo.h264.mp4"
    enc = "openh264enc complexity=low bitrate=2000000 gop-size=15 rate-control=bitrate"
    text = f"filesrc location={video} ! qtdemux ! decodebin ! videoconvert ! {enc} ! h264parse ! mp4mux"
    subprocess.run(["gst-launch-1.0", "-q", *text.split(), "!", "filesink", f"location={out}"], check=True, timeout=300)
    return out


def start_server(video: Path) -> tuple[subprocess.Popen[str], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = REPO / "tests" / "rtsp_server.py"
    cmd = [sys.executable, str(server), str(port), str(video), "--h264", "--protocols", "tcp"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("rtsp_server.py did not start")
    return proc, f"rtsp://127.0.0.1:{port}/cam"


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--record", default="null", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, json.loads(args.record), args.seconds)
        return 0

    from edged.daemon.capture.gstreamer.encode import ENCODERS
    from edged.daemon.capture.gstreamer.pipeline import has_element, version
    from edged.models.demo import default_dir, fetch_demo

    demo = fetch_demo(default_dir())
    load0 = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load0:.1f} at the start")
    print(f"python {platform.python_version()}, {version()}")
    encoders = [r.name for r in ENCODERS if has_element(r.name)]
    with tempfile.TemporaryDirectory(prefix="edged-record-cpu-") as tmp:
        h264 = h264_file(demo.video, Path(tmp))
        server, rtsp = start_server(h264)
        try:
            variants: dict[str, tuple[str, dict[str, Any] | None]] = {
                "rtsp off": (rtsp, None),
                "rtsp on": (rtsp, {}),
                "encode off": (f"file://{demo.video}", None),
            }
            for name in encoders:
                variants[f"encode on {name}"] = (f"file://{demo.video}", {"encoder": name})
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for rep in range(args.repeats):
                for v, (uri, rec) in variants.items():
                    r = run_child(uri, rec, args.seconds)
                    runs[v].append(r)
                    why = f" ({r['record_path'] or r['record_why']})" if rec is not None else ""
                    print(f"  repeat {rep + 1} {v:<24} cpu {r['cpu_per_s']:.3f} s/s  fps {r['fps']:.1f}{why}")
        finally:
            server.send_signal(signal.SIGTERM)
            server.kill()
            server.wait(10)
    table: dict[str, Any] = {}
    for v, rs in runs.items():
        table[v] = {
            "cpu_per_s": median([r["cpu_per_s"] for r in rs]),
            "fps": median([r["fps"] for r in rs]),
            "record_path": rs[-1]["record_path"],
            "ring_bytes_per_s": median(
                [r["ring"]["bytes"] / max(r["ring"]["span_s"], 1e-9) for r in rs if r["ring"] and r["ring"]["packets"]]
                or [0.0]
            ),
        }

    def ratio(on: str, off: str) -> float:
        return median([a["cpu_per_s"] / b["cpu_per_s"] for a, b in zip(runs[on], runs[off], strict=True)])

    ratios = {"rtsp on / off": ratio("rtsp on", "rtsp off")}
    for name in encoders:
        ratios[f"encode on {name} / off"] = ratio(f"encode on {name}", "encode off")
    lines = [f"{'variant':<26} {'CPU s/s':>8} {'fps':>6} {'ring kB/s':>10}  path"]
    for v, row in table.items():
        kbs = row["ring_bytes_per_s"] / 1000
        lines.append(f"{v:<26} {row['cpu_per_s']:>8.3f} {row['fps']:>6.1f} {kbs:>10.0f}  {row['record_path']}")
    lines += [f"{k:<26} {v:>8.2f}" for k, v in ratios.items()]
    load1 = os.getloadavg()[0]
    lines.append(f"load average {load0:.1f} at the start, {load1:.1f} at the end ({os.cpu_count()} cores)")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    res = {
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_average_start": load0,
        "load_average_end": load1,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "medians": table,
        "ratios": ratios,
        "runs": runs,
    }
    (args.out / "record_cpu.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out / 'record_cpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
