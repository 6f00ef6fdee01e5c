#!/usr/bin/env python3
"""Capture cost per stream: H.264 over RTSP, OpenCV/FFmpeg against GStreamer with in-pipeline scaling.

For 720p and 1080p, the demo video is encoded to H.264 once (openh264enc) and served, as it is, by a
real RTSP server (tests/rtsp_server.py, gst-rtsp-server, its own process: its CPU is not counted).
Each path opens the stream as a camera would (``open_source``) and, for --seconds, reads every frame
and preprocesses it into the model's input row (blazeface-back, 256x256 letterbox) as a camera thread
does. Reported per path and size:

  cpu_ms/frame   this process's CPU time (every thread: decoder, scaler, Python) per frame
  fps            frames read per second of wall time (the stream's own rate is 15)
  frames/s/core  frames per CPU-second: how many such frames one core could take

Only the software paths are measured here (no NVDEC/VIC on this machine). On a Jetson the GStreamer
path decodes on NVDEC and scales on VIC, leaving the CPU only the model-sized copy; the number of
streams NVDEC takes is the "Video Decode" row of NVIDIA's data sheet for the module (not measured here).

    python bench/capture.py [--seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIZES = {"720p": (1280, 720), "1080p": (1920, 1080)}


def encode(demo: Path, out: Path, w: int, h: int) -> None:
    if out.exists():
        return
    subprocess.run(
        [
            "gst-launch-1.0",
            "-q",
            "filesrc",
            f"location={demo}",
            "!",
            "qtdemux",
            "!",
            "decodebin",
            "!",
            "videoscale",
            "!",
            f"video/x-raw,width={w},height={h}",
            "!",
            "videoconvert",
            "!",
            "openh264enc",
            "bitrate=4000000",
            "complexity=low",
            "!",
            "h264parse",
            "!",
            "mp4mux",
            "!",
            "filesink",
            f"location={out}",
        ],
        check=True,
        capture_output=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def measure(uri: str, backend: str, seconds: float) -> dict[str, Any]:
    from edged.daemon.capture.camera import open_source
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.daemon.config import CameraConfig
    from edged.models.demo import default_dir, fetch_demo

    spec = fetch_demo(default_dir()).packages["blazeface-back"].manifest.input
    pre = Preprocessor(spec)
    row = pre.new_row()
    cam = CameraConfig(name="b", uri=uri, backend=backend, stall_timeout_s=10)  # type: ignore[arg-type]
    src = open_source(cam, pre.inner_size)
    try:
        for _ in range(5):  # past the open and the first key frame
            src.read()
        n, c0, t0 = 0, time.process_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            frame = src.read()
            if frame is None:
                break
            pre.run(frame, row, src.scaled_from)
            n += 1
        cpu, wall = time.process_time() - c0, time.monotonic() - t0
    finally:
        src.close()
    return {
        "frames": n,
        "cpu_ms_per_frame": round(1000 * cpu / max(n, 1), 2),
        "fps": round(n / wall, 1),
        "frames_per_core_s": round(n / cpu, 1) if cpu > 0 else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from edged.models.demo import default_dir, fetch_demo

    demo = fetch_demo(default_dir()).video
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (w, h) in SIZES.items():
            clip = Path(tmp) / f"{label}.mp4"
            encode(demo, clip, w, h)
            port = free_port()
            server = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "rtsp_server.py"), str(port), str(clip), "--h264"],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert server.stdout is not None
                if server.stdout.readline().strip() != "ready":
                    raise SystemExit("rtsp_server.py did not start")
                for backend in ("opencv", "gstreamer"):
                    r = measure(f"rtsp://127.0.0.1:{port}/cam", backend, args.seconds)
                    report[f"{label} {backend}"] = r
                    print(f"{label:6} {backend:10} {json.dumps(r)}", flush=True)
            finally:
                server.kill()
                server.wait()
                if server.stdout is not None:
                    server.stdout.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
