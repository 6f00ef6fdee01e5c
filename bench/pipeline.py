#!/usr/bin/env python3
"""How much of the engine's speed survives the pipeline (a benchmark script, not a test).

In one run, with the same model (BlazeFace 256x256 at the package's fixed batch B):

  raw        the backend alone on preallocated batches: the engine's own ceiling
  e2e        the daemon (real video decode, preprocessing, inference, decoding, JSON, MQTT QoS 1)
             counted at an MQTT subscriber on 127.0.0.1; eta = e2e / raw
  sleep      the same two with a stand-in backend that sleeps a fixed service time per image
             (releasing the GIL) at Jetson-like timings (4 and 2 ms/img): what the pipeline leaves on
             the table when the engine is fast; and with one that returns at once (what the cameras'
             decoding and the rest of the pipeline deliver without an engine)
  one camera the real engine and the sleeping one with one camera, on the batch-B package, the 1,B
             package (edged model init --batch 1,B) and a batch-1 package (pipeline_batch.py)
  naive      the loop a user writes by hand: read -> preprocess -> infer -> publish, one frame at a
             time (with the same fixed-batch engine, and with a batch-1 engine of the same per-image cost)
  overload   frames offered at 2x the measured capacity: delivered / capacity; and capture-to-publish
             latency p50 / p99 at half the capacity
  stages     each stage's cost per frame, measured alone, for the plot

Every figure is the median over --repeats runs; the machine and thread settings are printed.
Results go to --out (JSON and a PNG plot of the stage breakdown).

    python bench/pipeline.py [--seconds 8] [--repeats 3] [--sleep-ms 4,2] [--out bench/out]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from edged.daemon.app import Daemon
from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture import FrameMeta
from edged.daemon.config import load_config
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.daemon.inference import Result
from edged.daemon.preprocess import Preprocessor
from edged.daemon.publish import result_payload
from edged.models.demo import fetch_demo
from edged.protocol.client import make_client

sys.path.insert(0, str(Path(__file__).parent))  # its sibling module, also in spawned children (they unpickle)
from pipeline_batch import SleepBackend, SleepSpec, load_sleep, make_packages, one_camera_lines, sleep_backend

DEVICE = "bench-01"


# --- helpers ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n")
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("mosquitto did not start")


class Counter:
    """Subscribes to results and telemetry; keeps (receive time, payload) for later parsing."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[float, bytes]] = []
        self.telemetry: list[bytes] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-{port}-{time.time_ns()}", protocol=mqtt.MQTTv5
        )
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(
            [(f"edged/{DEVICE}/results/+", 1), (f"edged/{DEVICE}/telemetry", 0)]
        )
        self.c.on_subscribe = lambda *a: self.ready.set()
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.ready.wait(10)

    def _on(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        now = time.time()
        with self.lock:
            if m.topic.endswith("/telemetry"):
                self.telemetry.append(bytes(m.payload))
            else:
                self.got.append((now, bytes(m.payload)))

    def reset(self) -> None:
        with self.lock:
            self.got, self.telemetry = [], []

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def rate(self, skip_s: float = 2.0, tail_s: float = 0.5) -> float:
        """Results per second at the subscriber over the steady part of the run."""
        with self.lock:
            times = [t for t, _ in self.got]
        if len(times) < 10:
            return 0.0
        t0, t1 = times[0] + skip_s, times[-1] - tail_s
        n = sum(1 for t in times if t0 <= t <= t1)
        return n / max(1e-6, t1 - t0)

    def latencies_ms(self, skip_s: float = 2.0) -> list[float]:
        with self.lock:
            got = list(self.got)
        if not got:
            return []
        start = got[0][0] + skip_s
        out = []
        for t, payload in got:
            if t < start:
                continue
            doc = json.loads(payload)
            captured = dt.datetime.fromisoformat(doc["captured_at"].replace("Z", "+00:00")).timestamp()
            out.append((t - captured) * 1000.0)
        return out

    def peak_rss_mb(self) -> float:
        with self.lock:
            docs = [json.loads(p) for p in self.telemetry]
        return max((d["memory"].get("peak_rss_mb", 0.0) for d in docs), default=0.0)


def write_config(path: Path, port: int, package: Path, cameras: list[dict[str, Any]], state: Path) -> Path:
    doc = {
        "device_id": DEVICE,
        "state_dir": str(state),
        "log_level": "warning",
        "mqtt": {"host": "127.0.0.1", "port": port},
        "model": {"package": str(package), "onnxruntime": {"threads": 1}},
        "cameras": cameras,
        "inference": {"max_wait_ms": 30, "warmup_batches": 3},
        "detection": {"score_threshold": 0.7},
        "telemetry": {"interval_s": 1},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


# --- child processes (spawned: a fresh interpreter, like the daemon on a device) ---------------------


def daemon_child(cfg_path: str, seconds: float, sleep: SleepSpec | None) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    cfg = load_config(cfg_path)
    backend = sleep_backend(sleep) if sleep is not None else None
    Daemon(cfg, backend).run(duration_s=seconds, install_signals=False)


def naive_child(
    video: str,
    package: str,
    port: int,
    seconds: float,
    kind: str,
    engine_batch: int,
    sleep: SleepSpec | None,
) -> None:
    """read -> preprocess -> infer -> decode -> publish, one frame at a time."""
    from edged.models.package import open_package

    pkg = open_package(package)
    m = pkg.manifest
    if kind == "sleep" and sleep is not None:
        backend: Any = load_sleep(sleep[0], sleep[1], engine_batch, sleep[2])
    else:
        backend = OnnxRuntimeBackend(pkg.model_path, threads=1)
    spec = m.input.model_copy(update={"shape": [engine_batch, *m.input.shape[1:]]})
    decoder = build_decoder(m.decoder, spec, m.labels, {o.name: o.shape for o in backend.outputs})
    pre = Preprocessor(spec)
    batch = np.zeros(spec.shape, np.float32)
    client = make_client(load_config_stub(port), "bench-naive")
    client.connect("127.0.0.1", port)
    client.loop_start()
    cap = cv2.VideoCapture(video)
    opts = DecodeOptions(score_threshold=0.7)
    seq, n, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        ok, frame = cap.read()
        if not ok:
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            continue
        captured, mono = time.time(), time.monotonic()
        t = pre.run(frame, batch[0])
        t0 = time.perf_counter()
        out = backend.infer({spec.name: batch})
        infer_ms = (time.perf_counter() - t0) * 1000
        dets = decoder.decode(out, [t], opts)[0]
        seq += 1
        r = Result("cam0", FrameMeta(n, captured, mono, t), dets, infer_ms, time.monotonic(), m.name, m.version)
        client.publish(f"edged/{DEVICE}/results/cam0", json.dumps(result_payload(r, DEVICE, "0" * 32, seq)), qos=1)
        n += 1
    client.disconnect()
    client.loop_stop()


def load_config_stub(port: int) -> Any:
    from edged.daemon.config import MqttConfig

    return MqttConfig(host="127.0.0.1", port=port, max_inflight=1000)


def load_child(video: str, package: str, stop: Any) -> None:
    """The camera side's work alone, flat out on one core: decode the video and preprocess it."""
    from edged.models.package import open_package

    pre = Preprocessor(open_package(package).manifest.input)
    row = pre.new_row()
    cap = cv2.VideoCapture(video)
    while not stop.is_set():
        ok, frame = cap.read()
        if not ok:
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            continue
        pre.run(frame, row)


def run_child(target: Any, args: tuple[Any, ...], counter: Counter, timeout: float) -> None:
    counter.reset()
    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        raise SystemExit(f"{target.__name__} did not finish in {timeout} s")
    if p.exitcode != 0:
        raise SystemExit(f"{target.__name__} failed with exit code {p.exitcode}")
    time.sleep(0.3)  # the last PUBACKed messages reach the subscriber


# --- measurements -------------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def real_batch(video: Path, pre: Preprocessor, shape: list[int]) -> tuple[np.ndarray, list[Any]]:
    cap = cv2.VideoCapture(str(video))
    batch = np.zeros(shape, np.float32)
    transforms = []
    cap.set(cv2.CAP_PROP_POS_FRAMES, 150)  # two people in view
    for i in range(shape[0]):
        _, frame = cap.read()
        transforms.append(pre.run(frame, batch[i]))
    cap.release()
    return batch, transforms


def raw_throughput(backend: Any, name: str, batch: np.ndarray, n: int) -> float:
    for _ in range(3):
        backend.infer({name: batch})
    t0 = time.perf_counter()
    for _ in range(n):
        backend.infer({name: batch})
    return batch.shape[0] * n / (time.perf_counter() - t0)


def stage_costs(video: Path, pkg: Any, backend: OnnxRuntimeBackend, port: int) -> dict[str, float]:
    """Each stage alone, ms per frame (inference: per image, at the fixed batch)."""
    m = pkg.manifest
    cap = cv2.VideoCapture(str(video))
    frames = []
    t0 = time.perf_counter()
    for _ in range(120):
        _, f = cap.read()
        frames.append(f)
    read_ms = (time.perf_counter() - t0) * 1000 / 120
    pre = Preprocessor(m.input)
    row = pre.new_row()
    t0 = time.perf_counter()
    transforms = [pre.run(f, row) for f in frames]
    pre_ms = (time.perf_counter() - t0) * 1000 / len(frames)
    batch, tfs = real_batch(video, pre, m.input.shape)
    t0 = time.perf_counter()
    for _ in range(20):
        out = backend.infer({m.input.name: batch})
    infer_ms = (time.perf_counter() - t0) * 1000 / (20 * m.input.batch)
    decoder = build_decoder(m.decoder, m.input, m.labels, {o.name: o.shape for o in backend.outputs})
    opts = DecodeOptions(score_threshold=0.7)
    t0 = time.perf_counter()
    for _ in range(50):
        dets = decoder.decode(out, tfs, opts)
    post_ms = (time.perf_counter() - t0) * 1000 / (50 * len(tfs))
    client = make_client(load_config_stub(port), "bench-stages")
    client.connect("127.0.0.1", port)
    client.loop_start()
    r = Result(
        "cam0",
        FrameMeta(0, time.time(), time.monotonic(), transforms[0]),
        dets[0],
        1.0,
        time.monotonic(),
        m.name,
        m.version,
    )
    t0 = time.perf_counter()
    infos = [
        client.publish(f"edged/{DEVICE}/stage", json.dumps(result_payload(r, DEVICE, "0" * 32, i)), qos=1)
        for i in range(500)
    ]
    pub_ms = (time.perf_counter() - t0) * 1000 / 500
    for i in infos:
        i.wait_for_publish(5)
    client.disconnect()
    client.loop_stop()
    return {"read": read_ms, "preprocess": pre_ms, "infer": infer_ms, "postprocess": post_ms, "publish": pub_ms}


def plot(path: Path, stages: dict[str, float], rows: dict[str, float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    left = 0.0
    colours = ["#8da0cb", "#66c2a5", "#fc8d62", "#e78ac3", "#a6d854"]
    for (name, ms), colour in zip(stages.items(), colours, strict=True):
        ax.barh("stages, one frame\n(sequential sum)", ms, left=left, color=colour, label=f"{name} {ms:.2f} ms")
        left += ms
    for label, ms in rows.items():
        ax.barh(label, ms, color="#999999")
        ax.text(ms, label, f" {ms:.2f} ms", va="center")
    ax.set_xlabel("ms per frame")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def one_camera(
    assets: Any, pkg: Any, work: Path, port: int, counter: Counter, args: argparse.Namespace, sleep: SleepSpec
) -> dict[str, dict[str, float]]:
    """One camera's throughput on the batch-B package, the 1,B package and a batch-1 package (real engine and
    sleeping stand-in), runs interleaved: medians."""
    packages = {"single": pkg.root, **make_packages(assets.root, work, pkg.manifest.input.batch)}
    batches = {"single": sleep[3], "multi": (1, *sleep[3]), "b1": (1,)}
    cam = [{"name": "cam0", "uri": f"file://{assets.video}", "realtime": False, "loop": True}]
    runs: dict[str, dict[str, list[float]]] = {"onnxruntime": {k: [] for k in packages}, "sleep": {}}
    runs["sleep"] = {k: [] for k in packages}
    for _ in range(args.repeats):
        for engine, by_key in runs.items():
            for key, root in packages.items():
                cfg = write_config(work / f"one-{key}.yaml", port, root, cam, work / "state")
                stand_in = (*sleep[:3], batches[key]) if engine == "sleep" else None
                run_child(daemon_child, (str(cfg), args.seconds, stand_in), counter, args.seconds + 60)
                by_key[key].append(counter.rate())
    return {engine: {k: median(v) for k, v in by_key.items()} for engine, by_key in runs.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each end-to-end run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--sleep-ms",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[4.0, 2.0],
        help="the stand-in backend's service times per image (4,2); the naive and overload runs use the first",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    assets = fetch_demo(progress=lambda m: None)
    pkg = assets.packages["blazeface-back"]
    m = pkg.manifest
    B = m.input.batch
    work = Path(tempfile.mkdtemp(prefix="edged-bench-"))
    broker, port = start_broker(work)
    counter = Counter(port)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}")
    print(
        f"python {platform.python_version()}, onnxruntime {ort.__version__} (1 intra-op thread), "
        f"opencv {cv2.__version__} ({cv2.getNumThreads()} threads), numpy {np.__version__}"
    )
    print(f"model {pkg.ref}: {m.input.shape} {m.input.layout}, batch {B}; video {assets.video.name} 960x540")
    print(f"each figure: median of {args.repeats} runs; end-to-end runs {args.seconds:.0f} s each\n")
    ms0 = args.sleep_ms[0]
    res: dict[str, Any] = {"batch": B, "sleep_ms_per_image": ms0, "repeats": args.repeats}
    try:
        backend = OnnxRuntimeBackend(pkg.model_path, threads=1)
        pre = Preprocessor(m.input)
        batch, _ = real_batch(assets.video, pre, m.input.shape)
        outputs = backend.infer({m.input.name: batch})
        npz = work / "outputs.npz"
        np.savez(npz, **outputs)
        info = (m.input.name, tuple(m.input.shape))

        res["raw_ort"] = median([raw_throughput(backend, m.input.name, batch, 40) for _ in range(args.repeats)])
        # The same, while the other core decodes and preprocesses video as the camera threads do: on a
        # small machine the engine shares caches and memory bandwidth with the camera side.
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        loader = ctx.Process(target=load_child, args=(str(assets.video), str(pkg.root), stop))
        loader.start()
        time.sleep(1.0)
        res["raw_ort_loaded"] = median([raw_throughput(backend, m.input.name, batch, 40) for _ in range(args.repeats)])
        stop.set()
        loader.join(10)
        res["sleep"] = {}
        for ms in args.sleep_ms:
            sleep_be = SleepBackend(outputs, backend.inputs, ms)
            raw = median([raw_throughput(sleep_be, m.input.name, batch, 100) for _ in range(args.repeats)])
            res["sleep"][ms] = {"raw": raw}
        res["raw_sleep"] = res["sleep"][ms0]["raw"]
        res["stages_ms"] = stage_costs(assets.video, pkg, backend, port)
        backend.close()

        files = [
            {"name": f"cam{i}", "uri": f"file://{assets.video}", "realtime": False, "loop": True} for i in range(B)
        ]
        cfg = write_config(work / "e2e.yaml", port, pkg.root, files, work / "state")
        runs: dict[str, list[float]] = {
            "e2e_ort": [],
            **{f"e2e_sleep_{ms:g}": [] for ms in args.sleep_ms},
            "e2e_free": [],
            "naive_sleep": [],
            "naive_sleep_b1": [],
            "naive_ort": [],
        }
        rss: list[float] = []
        for _ in range(args.repeats):
            run_child(daemon_child, (str(cfg), args.seconds, None), counter, args.seconds + 60)
            runs["e2e_ort"].append(counter.rate())
            rss.append(counter.peak_rss_mb())
            for ms in (*args.sleep_ms, 0.0):  # 0: a backend that returns at once, what the rest delivers
                stand_in: SleepSpec = (str(npz), ms, info, (B,))
                run_child(daemon_child, (str(cfg), args.seconds, stand_in), counter, args.seconds + 60)
                runs[f"e2e_sleep_{ms:g}" if ms else "e2e_free"].append(counter.rate())
                rss.append(counter.peak_rss_mb())
            for key, kind, eb in (("naive_sleep", "sleep", B), ("naive_sleep_b1", "sleep", 1), ("naive_ort", "ort", B)):
                run_child(
                    naive_child,
                    (str(assets.video), str(pkg.root), port, args.seconds, kind, eb, (str(npz), ms0, info, (B,))),
                    counter,
                    args.seconds + 60,
                )
                runs[key].append(counter.rate(skip_s=1.0))
        for k, v in runs.items():
            res[k] = median(v)
        for ms in args.sleep_ms:
            res["sleep"][ms]["e2e"] = res.pop(f"e2e_sleep_{ms:g}")
        res["e2e_sleep"] = res["sleep"][ms0]["e2e"]
        res["peak_rss_mb"] = max(rss)
        res["one_camera"] = one_camera(assets, pkg, work, port, counter, args, (str(npz), ms0, info, (B,)))

        # Overload and latency on synthetic cameras paced at a chosen rate (960x540, like the video).
        cap_rate = res["e2e_sleep"]
        over, lat50, lat99, delivered = [], [], [], []
        for _ in range(args.repeats):
            for factor, sink in ((2.0, "over"), (0.5, "lat")):
                fps = cap_rate * factor / B
                cams = [
                    {
                        "name": f"cam{i}",
                        "uri": f"synthetic://?width=960&height=540&fps={fps:.1f}",
                        "fps_max": min(240, fps * 1.5),
                    }
                    for i in range(B)
                ]
                c2 = write_config(work / f"{sink}.yaml", port, pkg.root, cams, work / "state")
                run_child(
                    daemon_child, (str(c2), args.seconds, (str(npz), ms0, info, (B,))), counter, args.seconds + 60
                )
                if sink == "over":
                    delivered.append(counter.rate())
                    over.append(counter.rate() / cap_rate)
                else:
                    lats = counter.latencies_ms()
                    lat50.append(float(np.percentile(lats, 50)))
                    lat99.append(float(np.percentile(lats, 99)))
        res["overload_delivered_per_s"] = median(delivered)
        res["overload_ratio"] = median(over)
        res["latency_half_load_p50_ms"] = median(lat50)
        res["latency_half_load_p99_ms"] = median(lat99)
    finally:
        counter.close()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    eta_ort = res["e2e_ort"] / res["raw_ort"]
    eta_sleep = res["e2e_sleep"] / res["raw_sleep"]
    res["eta_ort"], res["eta_sleep"] = eta_ort, eta_sleep
    res["eta_ort_loaded"] = res["e2e_ort"] / res["raw_ort_loaded"]
    for fig in res["sleep"].values():
        fig["eta"] = fig["e2e"] / fig["raw"]
        fig["eta_of_supply"] = fig["e2e"] / min(fig["raw"], res["e2e_free"])
    res["e2e_vs_naive_sleep"] = res["e2e_sleep"] / res["naive_sleep"]
    res["e2e_vs_naive_sleep_b1"] = res["e2e_sleep"] / res["naive_sleep_b1"]
    s = res["stages_ms"]
    lines = [
        ("raw backend, ONNX Runtime 1 thread", f"{res['raw_ort']:.1f} img/s", ""),
        (
            "raw backend, the other core decoding video",
            f"{res['raw_ort_loaded']:.1f} img/s",
            f"{res['raw_ort_loaded'] / res['raw_ort']:.3f} of raw",
        ),
        (
            "end to end, ONNX Runtime",
            f"{res['e2e_ort']:.1f} img/s",
            f"eta {eta_ort:.3f} ({res['e2e_ort'] / res['raw_ort_loaded']:.3f} of the loaded engine); "
            f"overhead {1000 / res['e2e_ort'] - 1000 / res['raw_ort']:.2f} ms/frame",
        ),
        (
            "naive loop, ONNX Runtime (batch-B engine)",
            f"{res['naive_ort']:.1f} img/s",
            f"e2e / naive {res['e2e_ort'] / res['naive_ort']:.2f}x",
        ),
        *(
            line
            for ms, fig in res["sleep"].items()
            for line in (
                (f"raw backend, sleeping {ms:g} ms/img", f"{fig['raw']:.1f} img/s", ""),
                (
                    f"end to end, sleeping {ms:g} ms/img",
                    f"{fig['e2e']:.1f} img/s",
                    f"eta {fig['eta']:.3f} ({fig['eta_of_supply']:.3f} of min(engine, no-engine pipeline)); "
                    f"overhead {1000 / fig['e2e'] - 1000 / fig['raw']:.2f} ms/frame",
                ),
            )
        ),
        (
            "end to end, a backend that returns at once",
            f"{res['e2e_free']:.1f} img/s",
            "what the cameras and the pipeline deliver with no engine time",
        ),
        (
            "naive loop, sleeping (batch-B engine)",
            f"{res['naive_sleep']:.1f} img/s",
            f"e2e / naive {res['e2e_vs_naive_sleep']:.2f}x",
        ),
        (
            "naive loop, sleeping (batch-1 engine)",
            f"{res['naive_sleep_b1']:.1f} img/s",
            f"e2e / naive {res['e2e_vs_naive_sleep_b1']:.2f}x",
        ),
        (
            "2x overload, sleeping",
            f"{res['overload_delivered_per_s']:.1f} img/s",
            f"delivered / capacity {res['overload_ratio']:.3f}",
        ),
        (
            "capture-to-publish at 0.5x load, sleeping",
            f"p50 {res['latency_half_load_p50_ms']:.1f} ms",
            f"p99 {res['latency_half_load_p99_ms']:.1f} ms",
        ),
        *one_camera_lines(res, B),
        ("peak RSS of the daemon", f"{res['peak_rss_mb']:.0f} MB", ""),
        ("stages alone, ms/frame", " ".join(f"{k} {v:.2f}" for k, v in s.items()), ""),
    ]
    width = max(len(a) for a, _, _ in lines)
    for a, b, c in lines:
        print(f"{a:<{width}}  {b:<22} {c}")
    (args.out / "pipeline.json").write_text(json.dumps(res, indent=2))
    plot(
        args.out / "pipeline.png",
        s,
        {
            "engine alone (ONNX Runtime)": 1000 / res["raw_ort"],
            "pipeline (ONNX Runtime)": 1000 / res["e2e_ort"],
            "naive loop (ONNX Runtime)": 1000 / res["naive_ort"],
        },
        f"BlazeFace-256, batch {B}, ONNX Runtime 1 thread, {os.cpu_count()} cores",
    )
    print(f"\nwrote {args.out / 'pipeline.json'} and {args.out / 'pipeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
