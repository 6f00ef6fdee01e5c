#!/usr/bin/env python3
"""How much of the engine's speed survives the pipeline (a benchmark script, not a test).

In one run, with the same model (BlazeFace 256x256 at the package's fixed batch B):

  raw        the backend alone on preallocated batches: the engine's own ceiling; also while another
             process decodes and preprocesses the video, flat out, and (each repeat) at the rate the
             end-to-end run reached: the engine sharing the machine with the camera side's work
  e2e        the daemon (real video decode, preprocessing, inference, decoding, JSON, MQTT QoS 1)
             counted at an MQTT subscriber on 127.0.0.1; eta = e2e / raw. The daemon's own median batch
             time gives the engine's speed inside it, and e2e / that = how busy the pipeline kept it;
             the same with inference.dedicated_core (the inference thread alone on a core)
  sleep      the same two with a stand-in backend that sleeps a fixed service time per image
             (releasing the GIL) at Jetson-like timings (4 and 2 ms/img): what the pipeline leaves on
             the table when the engine is fast; and with one that returns at once (what the cameras'
             decoding and the rest of the pipeline deliver without an engine). Each also with cameras
             that need no decoding (synthetic 960x540 frames, at most 240 fps each), the stand-in for a
             Jetson's hardware decoder: two cores decoding four videos supply only about the 2 ms/img
             engine's rate, which then bounds eta
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
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor
from edged.models.demo import fetch_demo

sys.path.insert(0, str(Path(__file__).parent))  # its sibling modules, also in spawned children (they unpickle)
from pipeline_batch import SleepBackend, SleepSpec, make_packages
from pipeline_report import add_ratios, write_report
from pipeline_rig import Counter, median, run_child, start_broker, write_config
from pipeline_stages import daemon_child, loaded_throughput, naive_child, raw_throughput, real_batch, stage_costs


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
    backend = OnnxRuntimeBackend(pkg.model_path, threads=1)
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
        pre = Preprocessor(m.input)
        batch, _ = real_batch(assets.video, pre, m.input.shape)
        outputs = backend.infer({m.input.name: batch})
        npz = work / "outputs.npz"
        np.savez(npz, **outputs)
        info = (m.input.name, tuple(m.input.shape))

        res["raw_ort"] = median([raw_throughput(backend, m.input.name, batch, 40) for _ in range(args.repeats)])
        # The same, while the other core decodes and preprocesses video flat out: on a small machine the
        # engine shares caches and memory bandwidth with the camera side. (The end-to-end runs below also
        # measure it with that work paced at the rate the pipeline reached: the fair yardstick.)
        res["raw_ort_loaded"] = median(
            [loaded_throughput(backend, m.input.name, batch, 40, assets.video, pkg.root) for _ in range(args.repeats)]
        )
        res["sleep"] = {}
        for ms in args.sleep_ms:
            sleep_be = SleepBackend(outputs, backend.inputs, ms)
            raw = median([raw_throughput(sleep_be, m.input.name, batch, 100) for _ in range(args.repeats)])
            res["sleep"][ms] = {"raw": raw}
        res["raw_sleep"] = res["sleep"][ms0]["raw"]
        res["stages_ms"] = stage_costs(assets.video, pkg, backend, port)

        files = [
            {"name": f"cam{i}", "uri": f"file://{assets.video}", "realtime": False, "loop": True} for i in range(B)
        ]
        cfg = write_config(work / "e2e.yaml", port, pkg.root, files, work / "state")
        cfg_dc = write_config(work / "e2e-dc.yaml", port, pkg.root, files, work / "state", dedicated_core=True)
        # The same cameras without decoding (a paced synthetic 960x540 pattern, at most 240 fps each): the
        # stand-in for a hardware decoder, so that the sleeping backend's eta is the pipeline's, not
        # bounded by what two cores can decode.
        synth = [
            {"name": f"cam{i}", "uri": "synthetic://?width=960&height=540&fps=240", "fps_max": 240} for i in range(B)
        ]
        cfg_hw = write_config(work / "e2e-nodecode.yaml", port, pkg.root, synth, work / "state")
        runs: dict[str, list[float]] = {
            "e2e_ort": [],
            "eta_ort_paced": [],
            "raw_ort_paced": [],
            "engine_in_daemon": [],
            "engine_busy": [],
            "eta_ort_run": [],
            "e2e_ort_dc": [],
            "engine_in_daemon_dc": [],
            "engine_busy_dc": [],
            "eta_ort_dc_run": [],
            **{f"e2e_sleep_{ms:g}": [] for ms in args.sleep_ms},
            "e2e_free": [],
            **{f"e2e_nodecode_{ms:g}": [] for ms in args.sleep_ms},
            "e2e_nodecode_free": [],
            "naive_sleep": [],
            "naive_sleep_b1": [],
            "naive_ort": [],
        }
        rss: list[float] = []
        for rep in range(args.repeats):
            stats = work / "stats.json"
            pair = [("", cfg), ("_dc", cfg_dc)]  # _dc: inference.dedicated_core; which goes first alternates
            for suffix, c in pair if rep % 2 == 0 else pair[::-1]:
                stats.unlink(missing_ok=True)
                run_child(daemon_child, (str(c), args.seconds, None, str(stats)), counter, args.seconds + 60)
                runs[f"e2e_ort{suffix}"].append(e2e := counter.rate())
                rss.append(counter.peak_rss_mb())
                # The engine as it ran inside the daemon (its median batch time): how busy the pipeline kept it.
                p50 = json.loads(stats.read_text())["infer_ms"].get("p50") if stats.exists() else None
                if not p50:
                    raise SystemExit(f"the daemon ran no batch ({c}): no figure to report")
                inside = B * 1000 / p50
                runs[f"engine_in_daemon{suffix}"].append(inside)
                runs[f"engine_busy{suffix}"].append(e2e / inside)
                runs[f"eta_ort{suffix}_run"].append(e2e / raw_throughput(backend, m.input.name, batch, 40))
            e2e = runs["e2e_ort"][-1]
            # The engine while the camera side's work runs at the rate this run reached: eta of the
            # loaded engine, a ratio taken within one repeat.
            paced = loaded_throughput(backend, m.input.name, batch, 40, assets.video, pkg.root, rate=e2e)
            runs["raw_ort_paced"].append(paced)
            runs["eta_ort_paced"].append(e2e / paced)
            for ms in (*args.sleep_ms, 0.0):  # 0: a backend that returns at once, what the rest delivers
                stand_in: SleepSpec = (str(npz), ms, info, (B,))
                tag = f"{ms:g}" if ms else "free"
                for key, c in ((f"e2e_sleep_{tag}" if ms else "e2e_free", cfg), (f"e2e_nodecode_{tag}", cfg_hw)):
                    run_child(daemon_child, (str(c), args.seconds, stand_in), counter, args.seconds + 60)
                    runs[key].append(counter.rate())
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
            res["sleep"][ms]["e2e_nodecode"] = res.pop(f"e2e_nodecode_{ms:g}")
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
        backend.close()
        counter.close()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    add_ratios(res)
    write_report(args.out, res, B)
    return 0


if __name__ == "__main__":
    sys.exit(main())
