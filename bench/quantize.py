#!/usr/bin/env python3
"""INT8 against float in one run, at the same fixed batch (a benchmark script, not a test).

For each demo model (PicoDet layout, BlazeFace back) it quantizes with ``edged quantize`` (the CPU
target: u8u8 QDQ, heads in float, the float-block search) unless ``--reuse`` finds a package from an
earlier run, then times backend.infer on the same preprocessed batch, float and INT8 interleaved
run by run so machine noise hits both alike, with 1 thread and with every core. It prints medians,
the INT8/float throughput ratio and the model sizes, and writes JSON and a text table to --out.

    python bench/quantize.py [--repeats 15] [--out bench/out] [--reuse]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from edged.daemon.backends import OnnxRuntimeBackend
from edged.models.demo import fetch_demo
from edged.models.demo.documents import make_document_video
from edged.models.package import Package, verify_folder
from edged.quantize.frames import read_frames
from edged.quantize.int8 import calibration_batches
from edged.quantize.tool import quantize


def _int8(name: str, out: Path, reuse: bool, demo_root: Path) -> tuple[Package, str]:
    assets = fetch_demo(demo_root)
    dest = out / f"{name}-int8"
    if reuse and (dest / "manifest.json").is_file():
        return verify_folder(dest), "reused"
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    src = assets.packages[name].root
    if name == "picodet-layout":
        calib = out / "pages.mp4"
        if not calib.exists():
            make_document_video(demo_root / "raw", calib, calib.with_suffix(".json"), pages=8, first_page=5)
        outcome = quantize(src, calib, assets.documents, dest, force=True, progress=lambda m: print(f"  {m}"))
    else:
        outcome = quantize(
            src,
            assets.video,
            assets.video,
            dest,
            calib_frames=32,
            score_threshold=0.7,
            force=True,
            progress=lambda m: print(f"  {m}"),
        )
    verdict = "passed" if outcome.report else "FAILED (packaged with force for the timing only)"
    return verify_folder(
        dest
    ), f"gate {verdict}; {outcome.report.float_batch_ms:.0f}/{outcome.report.quant_batch_ms:.0f} ms"


def _time(float_pkg: Package, int8_pkg: Package, threads: int, repeats: int, frames_src: Path) -> dict[str, float]:
    spec = float_pkg.manifest.input
    batch = calibration_batches(spec, read_frames(frames_src, limit=spec.batch))[0]
    feeds = {spec.name: batch}
    with (
        OnnxRuntimeBackend(float_pkg.model_path, threads=threads) as f,
        OnnxRuntimeBackend(int8_pkg.model_path, threads=threads) as q,
    ):
        for be in (f, q):
            be.infer(feeds)
            be.infer(feeds)
        tf, tq = [], []
        for _ in range(repeats):
            for be, acc in ((f, tf), (q, tq)):
                start = time.perf_counter()
                be.infer(feeds)
                acc.append(time.perf_counter() - start)
    mf, mq = statistics.median(tf), statistics.median(tq)
    return {
        "float_ms": round(1000 * mf, 2),
        "int8_ms": round(1000 * mq, 2),
        "float_img_s": round(spec.batch / mf, 1),
        "int8_img_s": round(spec.batch / mq, 1),
        "ratio": round(mf / mq, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--reuse", action="store_true", help="reuse INT8 packages left in --out by an earlier run")
    ap.add_argument("--models", nargs="+", default=["picodet-layout", "blazeface-back"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    demo_root = Path(os.environ.get("EDGED_DEMO_DIR", "~/.cache/edged/demo")).expanduser()
    assets = fetch_demo(demo_root)
    cores = os.cpu_count() or 1
    rows = []
    for name in args.models:
        print(f"{name}: quantizing")
        int8_pkg, verdict = _int8(name, args.out, args.reuse, demo_root)
        float_pkg = assets.packages[name]
        frames = assets.documents if name == "picodet-layout" else assets.video
        for threads in sorted({1, cores}):
            t = _time(float_pkg, int8_pkg, threads, args.repeats, frames)
            rows.append(
                {
                    "model": name,
                    "batch": float_pkg.manifest.input.batch,
                    "threads": threads,
                    **t,
                    "float_mb": round(float_pkg.model_path.stat().st_size / 1e6, 2),
                    "int8_mb": round(int8_pkg.model_path.stat().st_size / 1e6, 2),
                    "float_nodes": len(int8_pkg.manifest.source["quantize"]["float_nodes"]),
                    "search": int8_pkg.manifest.source["quantize"]["search"],
                    "gate": verdict,
                }
            )
            print(f"  {threads} thread(s): {t}")
    header = f"{'model':16} {'B':>2} {'thr':>3} {'float ms':>9} {'int8 ms':>8} {'ratio':>6} {'MB float/int8':>14}"
    lines = [
        f"bench/quantize.py {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"{cores} cores, median of {args.repeats} interleaved runs",
        header,
    ]
    for r in rows:
        lines.append(
            f"{r['model']:16} {r['batch']:>2} {r['threads']:>3} {r['float_ms']:>9.1f} {r['int8_ms']:>8.1f} "
            f"{r['ratio']:>5.2f}x {r['float_mb']:>6.2f}/{r['int8_mb']:<6.2f}  ({r['search']}; {r['gate']})"
        )
    text = "\n".join(lines)
    print(text)
    (args.out / "quantize.txt").write_text(text + "\n")
    (args.out / "quantize.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
