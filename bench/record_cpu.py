#!/usr/bin/env python3
"""A camera's CPU per second with recording on and off (a benchmark script, not a test).

Each run is one child process holding one camera (capture/camera.py, preprocessing into a 256x256 row as the
demo model's, frames taken by a consumer thread as inference takes them) for --seconds after a warm-up; its
CPU (user + system, every thread: Python's and GStreamer's) per wall second is the figure. Sources:

    rtsp     tests/rtsp_server.py sends the demo video as H.264 (keyframe every second, 2 Mbit/s) without
             re-encoding it; recording copies the camera's own packets after the parser (no re-encode)
    encode   file:// of the demo video (MPEG-4 part 2, 960x540, 15 fps, played in real time, looped); recording
             encodes the decoder's frames with each H.264 encoder present (x264enc, openh264enc, nvv4l2h264enc)
    opencv   the same file read by OpenCV (backend: opencv): frames arrive as the camera thread's BGR arrays,
             which recording encodes (the path of sources without a GStreamer decoder: raw v4l2, MJPEG,
             snapshots, synthetic)

--daemon runs the real daemon instead (`edged run`: the demo model, BlazeFace on ONNX Runtime, tracking and
object events to a local mosquitto, clips cut 1 s before and after each event, muxed and stored) and reads
the daemon process's CPU from /proc/PID/stat over --seconds after it serves and a warm-up; the window's
object events and clip_ready events (clips really muxed) are counted (results: record_cpu.daemon.json).

Within each repeat every variant runs once, interleaved; every figure is the median over --repeats, and the
on/off ratios are taken within a repeat, then their median. The load average is kept at the start and end.

    python bench/record_cpu.py [--seconds 8] [--repeats 3] [--daemon] [--out bench/results]
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
sys.path.insert(0, str(REPO))  # tests.conftest: the Broker and Subscriber the tests use (--daemon)
WARMUP_S = 2.0
DAEMON_WARMUP_S = 3.0  # past the daemon's first batches
DEVICE = "bench-rec"


def child(uri: str, record: dict[str, Any] | None, seconds: float, backend: str = "auto") -> None:
    """One camera for `seconds` after the warm-up; prints one JSON line with its CPU per second."""
    from edged.daemon.capture.camera import Camera
    from edged.daemon.capture.preprocess import Preprocessor
    from edged.daemon.config import CameraConfig
    from edged.models.package import InputSpec

    cond, stop = threading.Condition(), threading.Event()
    cfg: dict[str, Any] = {"name": "bench", "uri": uri, "loop": uri.startswith("file://"), "reconnect_min_s": 0.2}
    cfg["backend"] = backend
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


def run_child(uri: str, record: dict[str, Any] | None, seconds: float, backend: str = "auto") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", uri, "--record", json.dumps(record), "--seconds", str(seconds)]
    cmd += ["--backend", backend]
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


# --- --daemon: the real daemon (`edged run`) -------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """The process's CPU (user + system, every thread) so far, in seconds, from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def daemon_variant(broker: Any, demo: Any, work: Path, cam: dict[str, Any], seconds: float, tag: str) -> dict[str, Any]:
    """One `edged run` of the demo model on one camera: its CPU per second over `seconds` after it serves and
    a warm-up, the frames it took, and the events and clips it made in that window."""
    import yaml

    from tests.conftest import Subscriber

    state = work / f"state-{tag}"
    device = f"{DEVICE}-{tag}"  # its own topics: no retained document of an earlier run read as this one's
    cfg = {
        "device_id": device,
        "state_dir": str(state),
        "mqtt": {"host": broker.host, "port": broker.port},
        "model": {"package": str(demo.packages["blazeface-back"].root), "onnxruntime": {"threads": 1}},
        "cameras": [cam],
        "inference": {"max_wait_ms": 20},
        "detection": {"score_threshold": 0.7},
        "telemetry": {"interval_s": 1},
        "clips": {"max_mb": 64},
    }
    cfg_path = work / f"{tag}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    sub = Subscriber(broker.host, broker.port, f"edged/{device}/#")
    log_path = work / f"daemon-{tag}.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "edged", "run", "-c", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
    try:

        def telemetry() -> list[dict[str, Any]]:
            return [m.json() for m in sub.on("telemetry")]

        deadline = time.monotonic() + 180
        while not any(t["cameras"][cam["name"]]["frames"] > 0 for t in telemetry()):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not serve ({tag}): {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        time.sleep(DAEMON_WARMUP_S)
        n0, t0, c0 = len(sub.messages), time.monotonic(), proc_cpu_s(daemon.pid)
        tel0 = telemetry()[-1]
        time.sleep(seconds)
        t1, c1 = time.monotonic(), proc_cpu_s(daemon.pid)
        tel1 = telemetry()[-1]
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited ({tag}): {log_path.read_text()[-3000:]}")
        window = [m for m in sub.messages[n0:] if m.topic.endswith("/events")]
        kinds = [m.json()["type"] for m in window]
        ready = [m.json()["clip"] for m in window if m.json()["type"] == "clip_ready"]
        frames = tel1["cameras"][cam["name"]]["frames"] - tel0["cameras"][cam["name"]]["frames"]
        dt_tel = max(1e-9, wall(tel1["ts"]) - wall(tel0["ts"]))
        said = [x.split("edged.daemon.", 1)[-1] for x in log_path.read_text(errors="replace").splitlines()]
        paths = [x for x in said if any(k in x for k in ("capture path", "recording through", "record:"))]
        return {
            "daemon_says": list(dict.fromkeys(paths))[:4],  # its log: the capture path, the encoder or none
            "cpu_per_s": (c1 - c0) / (t1 - t0),
            "fps": frames / dt_tel,
            "inference_rows_per_s": (tel1["inference"]["rows"] - tel0["inference"]["rows"]) / dt_tel,
            "object_events": sum(1 for k in kinds if k.startswith("object_")),
            "clips_ready": len(ready),
            "clip_bytes": sum(int(c["bytes"]) for c in ready),
            "clips_written_total": (tel1.get("clips") or {}).get("written"),
        }
    finally:
        daemon.terminate()
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)
        sub.close()


def wall(ts: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def main_daemon(args: argparse.Namespace, encoders: list[str], demo: Any, rtsp: str, work: Path) -> None:
    from tests.conftest import Broker

    rec = {"pre_s": 1.0, "post_s": 1.0, "max_clip_s": 10.0}
    det = {"tracking": {"min_hits": 3, "max_age": 5}, "publish": "events"}
    file_cam = {"name": "cam", "uri": f"file://{demo.video}", "loop": True, "detection": det}
    variants: dict[str, dict[str, Any]] = {
        "rtsp off": {"name": "cam", "uri": rtsp, "detection": det},
        "rtsp on": {"name": "cam", "uri": rtsp, "detection": det, "record": rec},
        "file off": file_cam,
    }
    for name in encoders:
        variants[f"file on {name}"] = {**file_cam, "record": {**rec, "encoder": name}}
    variants["file opencv off"] = {**file_cam, "backend": "opencv"}
    for name in encoders:
        variants[f"file opencv on {name}"] = {**file_cam, "backend": "opencv", "record": {**rec, "encoder": name}}
    broker = Broker(work)
    broker.start()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for rep in range(args.repeats):
            for v, cam in variants.items():
                r = daemon_variant(broker, demo, work, cam, args.seconds, f"{v.replace(' ', '-')}-{rep}")
                runs[v].append(r)
                print(
                    f"  repeat {rep + 1} {v:<28} cpu {r['cpu_per_s']:.3f} s/s  fps {r['fps']:.1f}  "
                    f"object events {r['object_events']}  clips {r['clips_ready']} ({r['clip_bytes'] / 1e3:.0f} kB)"
                    + (f"\n    {r['daemon_says']}" if rep == 0 else ""),
                    flush=True,
                )
    finally:
        broker.stop()
    pairs = {"rtsp on": "rtsp off"}
    pairs.update({f"file on {n}": "file off" for n in encoders})
    pairs.update({f"file opencv on {n}": "file opencv off" for n in encoders})
    report(args, runs, pairs, "record_cpu.daemon.json", extra={"mode": "daemon", "record": rec, "detection": det})


def report(
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    pairs: dict[str, str],
    name: str,
    extra: dict[str, Any],
) -> None:
    """Medians per variant, the on/off ratios (within each repeat, then their median), the load average at the
    start and the end; printed and written to args.out / name."""
    table: dict[str, Any] = {}
    for v, rs in runs.items():
        row = {k: median([float(r[k]) for r in rs]) for k in rs[0] if isinstance(rs[0][k], int | float)}
        if "ring" in rs[0]:
            row["record_path"] = rs[-1]["record_path"]
            row["ring_bytes_per_s"] = median(
                [r["ring"]["bytes"] / max(r["ring"]["span_s"], 1e-9) for r in rs if r["ring"] and r["ring"]["packets"]]
                or [0.0]
            )
        table[v] = row

    def ratio(on: str, off: str) -> float:
        return median([a["cpu_per_s"] / b["cpu_per_s"] for a, b in zip(runs[on], runs[off], strict=True)])

    def per_frame(on: str, off: str) -> float:
        a, b = ([r["cpu_per_s"] / max(r["fps"], 1e-9) for r in runs[v]] for v in (on, off))
        return median([x / y for x, y in zip(a, b, strict=True)])

    ratios = {f"{on} / off": ratio(on, off) for on, off in pairs.items()}
    # CPU per frame taken: the same ratio where a loaded machine made a variant take fewer frames
    ratios.update({f"{on} / off, per frame": per_frame(on, off) for on, off in pairs.items()})
    cols = [k for k in next(iter(table.values())) if k not in ("cpu_per_s", "record_path")]
    lines = [f"{'variant':<28} {'CPU s/s':>8} " + " ".join(f"{c[:14]:>14}" for c in cols)]
    for v, row in table.items():
        cells = " ".join(f"{row[c]:>14.1f}" for c in cols)
        lines.append(f"{v:<28} {row['cpu_per_s']:>8.3f} {cells}  {row.get('record_path', '')}")
    lines += [f"{k:<46} {v:>8.2f}" for k, v in ratios.items()]
    load1 = os.getloadavg()[0]
    load0 = args.load0
    lines.append(f"load average {load0:.1f} at the start, {load1:.1f} at the end ({os.cpu_count()} cores)")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    res = {
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "note": "the machine was shared with other engineers' test runs while this ran: read the ratios",
        "load_average_start": load0,
        "load_average_end": load1,
        "seconds": args.seconds,
        "repeats": args.repeats,
        **extra,
        "medians": table,
        "ratios": ratios,
        "runs": runs,
    }
    (args.out / name).write_text(json.dumps(res, indent=1) + "\n")
    (args.out / name.replace(".json", ".txt")).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / name}")


def main_camera(args: argparse.Namespace, encoders: list[str], demo: Any, rtsp: str) -> None:
    file = f"file://{demo.video}"
    variants: dict[str, tuple[str, dict[str, Any] | None, str]] = {
        "rtsp off": (rtsp, None, "auto"),
        "rtsp on": (rtsp, {}, "auto"),
        "encode off": (file, None, "auto"),
    }
    for name in encoders:
        variants[f"encode on {name}"] = (file, {"encoder": name}, "auto")
    variants["opencv off"] = (file, None, "opencv")
    for name in encoders:
        variants[f"opencv on {name}"] = (file, {"encoder": name}, "opencv")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        for v, (uri, rec, backend) in variants.items():
            r = run_child(uri, rec, args.seconds, backend)
            runs[v].append(r)
            why = f" ({r['record_path'] or r['record_why']})" if rec is not None else ""
            print(f"  repeat {rep + 1} {v:<24} cpu {r['cpu_per_s']:.3f} s/s  fps {r['fps']:.1f}{why}", flush=True)
    pairs = {"rtsp on": "rtsp off"}
    pairs.update({f"encode on {n}": "encode off" for n in encoders})
    pairs.update({f"opencv on {n}": "opencv off" for n in encoders})
    report(args, runs, pairs, "record_cpu.json", extra={"mode": "camera"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=None, help="each window (8 s; --daemon: 20 s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--daemon", action="store_true", help="the real daemon (edged run) instead of one camera")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--record", default="null", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = 20.0 if args.daemon else 8.0
    if args.child:
        child(args.child, json.loads(args.record), args.seconds, args.backend)
        return 0

    from edged.daemon.capture.gstreamer.encode import ENCODERS
    from edged.daemon.capture.gstreamer.pipeline import has_element, version
    from edged.models.demo import default_dir, fetch_demo

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the server, broker and daemon
    demo = fetch_demo(default_dir())
    args.load0 = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {args.load0:.1f} at the start")
    print(f"python {platform.python_version()}, {version()}")
    encoders = [r.name for r in ENCODERS if has_element(r.name)]
    with tempfile.TemporaryDirectory(prefix="edged-record-cpu-") as tmp:
        h264 = h264_file(demo.video, Path(tmp))
        server, rtsp = start_server(h264)
        try:
            if args.daemon:
                main_daemon(args, encoders, demo, rtsp, Path(tmp))
            else:
                main_camera(args, encoders, demo, rtsp)
        finally:
            server.send_signal(signal.SIGTERM)
            server.kill()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
