#!/usr/bin/env python3
"""The daemon's own CPU per frame, by stage, folded and unfolded packages side by side (a benchmark script,
not a test).

Four cameras decode the demo video (960x540) as fast as inference takes frames; BlazeFace 256x256 at the
package's batch (4); results counted at an MQTT subscriber on a private mosquitto on 127.0.0.1. Engines:
the sleeping stand-in at each --sleep-ms (it sleeps per image with the GIL released, as a GPU engine
waits, and returns the real model's outputs) and ONNX Runtime (1 thread). Packages: the demo's as it
ships (unfolded: the camera side converts to float32) and, where ``edged.models.fold`` exists, the same
package with its preprocessing folded into the graph (uint8 pixels into the engine).

For each run the daemon's threads' CPU clocks give the CPU ms per frame inferred by stage
(bench/pipeline_cpu_probe.py says how each stage is taken), beside the wall time of the wrapped stages and
the pipeline's; bytes per frame handed to the engine; eta = end to end / the engine alone. Within each
repeat every (engine, package) pair runs once, interleaved; every figure is the median over --repeats and
the folded/unfolded ratios are taken within a repeat, then their median.

    python bench/pipeline_cpu.py [--seconds 8] [--repeats 3] [--sleep-ms 4,2] [--no-ort] [--fold auto|yes|no]
                                 [--out bench/out]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edged.daemon.backends import OnnxRuntimeBackend, TensorInfo
from edged.models.demo import fetch_demo
from edged.models.package import open_package

sys.path.insert(0, str(Path(__file__).parent))  # its sibling modules, also in spawned children (they unpickle)
from pipeline_batch import SleepBackend
from pipeline_cpu_probe import STAGES, cpu_child
from pipeline_rig import Counter, median, run_child, start_broker, write_config
from pipeline_stages import raw_throughput


def stand_in(npz: str, ms: float, name: str, shape: tuple[int, ...], dtype: str) -> SleepBackend:
    """The sleeping stand-in for a package whose input is (name, shape, dtype); made in the child."""
    data = np.load(npz)
    return SleepBackend({k: data[k] for k in data.files}, [TensorInfo(name, shape, dtype)], ms)


def packages(demo_pkg: Path, work: Path, fold: str) -> dict[str, Path]:
    out = {"unfolded": demo_pkg}
    if fold == "no":
        return out
    try:
        from edged.models.fold import fold_package  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        if fold == "yes":
            raise SystemExit("--fold yes: edged.models.fold is not there") from None
        print("(no edged.models.fold in this tree: the unfolded package only)\n")
        return out
    out["folded"] = Path(fold_package(demo_pkg, work / "folded"))
    return out


def batch_for(pkg_root: Path, video: Path) -> tuple[str, np.ndarray]:
    """A real batch in the package's own input (its dtype and layout), preprocessed as the daemon does."""
    from pipeline_stages import real_batch

    from edged.daemon.capture.preprocess import Preprocessor

    m = open_package(pkg_root).manifest
    batch, _ = real_batch(video, Preprocessor(m.input), list(m.input.shape))
    return m.input.name, batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each run (the first 3 s are warm-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sleep-ms", type=lambda t: [float(x) for x in t.split(",") if x], default=[4.0, 2.0])
    ap.add_argument("--no-ort", action="store_true", help="the sleeping stand-ins only")
    ap.add_argument("--fold", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    assets = fetch_demo(progress=lambda m: None)
    demo = assets.packages["blazeface-back"]
    work = Path(tempfile.mkdtemp(prefix="edged-bench-cpu-"))
    broker, port = start_broker(work)
    counter = Counter(port)
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.1f} at the start")
    versions = f"onnxruntime {ort.__version__} (1 intra-op thread), numpy {np.__version__}"
    print(f"python {platform.python_version()}, {versions}")
    print(f"model {demo.ref}, four cameras decoding {assets.video.name} (960x540); median of {args.repeats} runs")
    print(f"of {args.seconds:.0f} s each, measured over [3 s, {args.seconds - 1:.0f} s] of each run\n")
    engines = [f"sleep {ms:g} ms" for ms in args.sleep_ms] + ([] if args.no_ort else ["onnxruntime"])
    res: dict[str, Any] = {"engines": engines, "repeats": args.repeats, "seconds": args.seconds, "runs": {}}
    try:
        pkgs = packages(demo.root, work, args.fold)
        res["packages"] = list(pkgs)
        ort_be = OnnxRuntimeBackend(demo.model_path, threads=1)
        name0, batch0 = batch_for(demo.root, assets.video)
        npz = work / "outputs.npz"
        outputs: dict[str, Any] = ort_be.infer({name0: batch0})
        np.savez(npz, **outputs)
        ort_be.close()
        feeds = {key: batch_for(root, assets.video) for key, root in pkgs.items()}
        cams = [
            {"name": f"cam{i}", "uri": f"file://{assets.video}", "realtime": False, "loop": True}
            for i in range(batch0.shape[0])
        ]
        cfgs = {key: write_config(work / f"{key}.yaml", port, root, cams, work / "state") for key, root in pkgs.items()}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {e: {k: [] for k in pkgs} for e in engines}
        for rep in range(args.repeats):
            for engine in engines:
                order = list(pkgs) if rep % 2 == 0 else list(pkgs)[::-1]
                for key in order:
                    name, batch = feeds[key]
                    if engine == "onnxruntime":
                        be: Any = OnnxRuntimeBackend(open_package(pkgs[key]).model_path, threads=1)
                        maker = None
                    else:
                        ms = float(engine.split()[1])
                        maker = functools.partial(stand_in, str(npz), ms, name, batch.shape, str(batch.dtype))
                        be = maker()
                    out = work / "acc.json"
                    out.unlink(missing_ok=True)
                    child_args = (str(cfgs[key]), args.seconds, 3.0, maker, str(out))
                    run_child(cpu_child, child_args, counter, args.seconds + 90)
                    acc = json.loads(out.read_text())
                    acc["e2e"] = counter.rate(skip_s=3.0, tail_s=1.0)
                    acc["raw"] = raw_throughput(be, name, batch, 40 if engine == "onnxruntime" else 100)
                    acc["eta"] = acc["e2e"] / acc["raw"]
                    be.close()
                    runs[engine][key].append(acc)
                    print(
                        f"  repeat {rep + 1} {engine:>12} {key:>9}: {acc['e2e']:6.1f} img/s, eta {acc['eta']:.3f}, "
                        f"camera side {acc['camera_side_ms']:.2f} ms/frame",
                        flush=True,
                    )
        res["runs"] = runs
    finally:
        counter.close()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    res["load_average_end"] = os.getloadavg()[0]
    lines = summarise(res)
    text = "\n".join(lines)
    print("\n" + text)
    (args.out / "pipeline-cpu.txt").write_text(text + "\n")
    (args.out / "pipeline-cpu.json").write_text(json.dumps(res, indent=1))
    print(f"\nwrote {args.out / 'pipeline-cpu.txt'} and pipeline-cpu.json")
    return 0


def med(rows: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in rows:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return median(vals)


def publish_parts(rows: list[dict[str, Any]]) -> str:
    return " / ".join(f"{med(rows, 'publish_parts_ms', p):.3f}" for p in ("spool_one", "commit", "deliver"))


def engine_table(by_pkg: dict[str, list[dict[str, Any]]], pk: list[str]) -> list[str]:
    """One engine's table: the stages' CPU ms/frame for each package, the totals, bytes, eta."""

    def row(label: str, key: str, fmt: str = ".3f") -> str:
        return f"  {label:<40}" + "".join(f"{med(by_pkg[k], key):>24{fmt}}" for k in pk)

    lines = [f"  {'stage':<40}" + "".join(f"{k:>24}" for k in pk)]
    for stage in STAGES:
        cells = []
        for k in pk:
            cpu = med(by_pkg[k], "cpu_ms", stage)
            wall = med(by_pkg[k], "wall_ms", stage) if stage in by_pkg[k][0]["wall_ms"] else None
            cells.append(f"{cpu:8.3f}" + (f" (wall {wall:6.3f})" if wall is not None else " " * 14))
        lines.append(f"  {stage:<40}" + "".join(f"{c:>24}" for c in cells))
    lines += [
        row("camera side (capture, preprocess, gather)", "camera_side_ms"),
        f"  {'  publish: spool_one / commit / deliver':<40}" + "".join(f"{publish_parts(by_pkg[k]):>24}" for k in pk),
        row("all threads", "threads_ms"),
        row("process CPU", "process_ms"),
        f"  {'wall ms per frame (1 / frames per s)':<40}"
        + "".join(f"{1000 / med(by_pkg[k], 'frames_per_s'):>24.3f}" for k in pk),
        f"  {'bytes per frame to the engine':<40}"
        + "".join(f"{by_pkg[k][0]['engine_bytes_per_frame']:>24d}" for k in pk),
        row("end to end, img/s", "e2e", ".1f"),
        row("the engine alone, img/s", "raw", ".1f"),
        row("eta", "eta"),
    ]
    if "folded" in pk:
        ratios = [
            (u["camera_side_ms"] / f["camera_side_ms"], u["process_ms"] / f["process_ms"], f["eta"] / u["eta"])
            for u, f in zip(by_pkg["unfolded"], by_pkg["folded"], strict=True)
        ]
        cam, proc, eta = (median([r[i] for r in ratios]) for i in range(3))
        b = by_pkg["unfolded"][0]["engine_bytes_per_frame"] / by_pkg["folded"][0]["engine_bytes_per_frame"]
        lines.append(
            f"  unfolded / folded, within each repeat: camera side {cam:.2f}x, process CPU {proc:.2f}x, "
            f"bytes {b:.1f}x; eta folded / unfolded {eta:.3f}"
        )
    return lines


def summarise(res: dict[str, Any]) -> list[str]:
    """The printed tables, one per engine."""
    lines = [f"load average {res['load_average_end']:.1f} at the end (a shared machine: read ratios, not times)"]
    for engine, by_pkg in res["runs"].items():
        lines.append(f"\n{engine}: CPU ms per frame inferred, by stage (wall ms in the stage where wrapped)")
        lines += engine_table(by_pkg, res["packages"])
    return lines


if __name__ == "__main__":
    sys.exit(main())
