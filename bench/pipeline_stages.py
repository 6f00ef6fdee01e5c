"""The measurements of bench/pipeline.py: the engine alone (raw_throughput on a real batch), each stage
alone (stage_costs), and what runs in spawned children (a fresh interpreter, like the daemon on a device):
the daemon (daemon_child), the hand-written loop (naive_child), and the camera side's load (load_child)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pipeline_batch import SleepSpec, load_sleep, sleep_backend
from pipeline_rig import DEVICE

from edged.daemon.app import Daemon
from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.camera import FrameMeta
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import load_config
from edged.daemon.decoders import DecodeOptions, build_decoder
from edged.daemon.delivery.publisher import result_payload
from edged.daemon.inference import Result
from edged.protocol.client import make_client


def daemon_child(cfg_path: str, seconds: float, sleep: SleepSpec | None, stats_out: str = "") -> None:
    """The daemon for `seconds`; with `stats_out`, its inference loop's counters there (JSON) at the end."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    cfg = load_config(cfg_path)
    backend = sleep_backend(sleep) if sleep is not None else None
    daemon = Daemon(cfg, backend)
    daemon.run(duration_s=seconds, install_signals=False)
    if stats_out:
        s = daemon.loop.stats
        figures = {"batches": s.batches, "rows": s.rows, "padded_rows": s.padded_rows}
        Path(stats_out).write_text(json.dumps({**figures, "infer_ms": s.infer_ms.percentiles((50,))}))


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
    batch = np.zeros(spec.shape, pre.new_row().dtype)
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
        r = Result("cam0", FrameMeta(n, captured, mono, t, mono), dets, infer_ms, time.monotonic(), m.name, m.version)
        client.publish(f"edged/{DEVICE}/results/cam0", json.dumps(result_payload(r, DEVICE, "0" * 32, seq)), qos=1)
        n += 1
    client.disconnect()
    client.loop_stop()


def load_config_stub(port: int) -> Any:
    from edged.daemon.config import MqttConfig

    return MqttConfig(host="127.0.0.1", port=port, max_inflight=1000)


def load_child(video: str, package: str, stop: Any, ready: Any, rate: float = 0.0) -> None:
    """The camera side's work alone: decode the video and preprocess it, flat out (rate 0) or `rate`
    frames a second (what the pipeline decodes at the throughput it reached). Sets `ready` once going."""
    from edged.models.package import open_package

    pre = Preprocessor(open_package(package).manifest.input)
    row = pre.new_row()
    cap = cv2.VideoCapture(video)
    due = time.monotonic()
    while not stop.is_set():
        ok, frame = cap.read()
        if not ok:
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            continue
        pre.run(frame, row)
        ready.set()
        if rate > 0:
            due += 1.0 / rate
            lag = due - time.monotonic()
            if lag > 0:
                time.sleep(lag)
            elif lag < -1.0:  # cannot keep up: do not burst to catch up
                due = time.monotonic()


def loaded_throughput(
    backend: Any, name: str, batch: np.ndarray, n: int, video: Path, package: Path, rate: float = 0.0
) -> float:
    """The engine alone while another process does the camera side's work (load_child at `rate`)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Event()
    loader = ctx.Process(target=load_child, args=(str(video), str(package), stop, ready, rate))
    loader.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the camera-side load did not start")
        time.sleep(0.3)  # past its first frames
        return raw_throughput(backend, name, batch, n)
    finally:
        stop.set()
        loader.join(10)


def real_batch(video: Path, pre: Preprocessor, shape: list[int]) -> tuple[np.ndarray, list[Any]]:
    cap = cv2.VideoCapture(str(video))
    batch = np.zeros(shape, pre.new_row().dtype)  # the package's input: float32, or uint8 when folded
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
        FrameMeta(0, time.time(), time.monotonic(), transforms[0], time.monotonic()),
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
