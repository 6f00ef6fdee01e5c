#!/usr/bin/env python3
"""Where the camera side's CPU goes, folded and unfolded, with and without the copy out of GStreamer's buffer
(a benchmark script, not a test; the measuring is bench/pipeline_cpu.py's, its stages and its "camera side":
capture + preprocess + gather, the camera and gather threads' CPU per frame inferred).

Four cameras decode the demo video (960x540) through the GStreamer path, BlazeFace 256x256 at batch 4, the
sleeping 4 ms/image stand-in engine, results counted at a subscriber on a private mosquitto. Variants, run
interleaved within each repeat (the order alternates), medians over --repeats, ratios taken within a repeat:

  copy     each frame copied out of its buffer by PyGObject's map (a new ``bytes`` a frame), as before
  view     each frame a view of GStreamer's mapped buffer (``gstreamer/mapping.py``): no copy
  scaled   view, and scaled to the model's size inside the pipeline (videoscale in GStreamer's streaming
           thread, before videoconvert, camera ``scale_in_pipeline: true``): the CPU moves out of the camera
           thread (see "native" and "process CPU", which count it)

    python bench/pipeline_copies.py [--seconds 8] [--repeats 3] [--out bench/out]
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

sys.path.insert(0, str(Path(__file__).parent))  # its sibling modules, also in spawned children (they unpickle)
from pipeline_cpu import batch_for, engine_table, packages, stand_in
from pipeline_cpu_probe import cpu_child
from pipeline_rig import Counter, median, run_child, start_broker, write_config
from pipeline_stages import raw_throughput

from edged.daemon.backends import OnnxRuntimeBackend
from edged.models.demo import fetch_demo


def copy_child(*args: Any) -> None:
    """cpu_child with frames copied out of their buffers (PyGObject's map), as before the views."""
    from edged.daemon.capture.gstreamer import pipeline

    pipeline.libgst = lambda: None  # type: ignore[assignment]  # GstSource then maps through PyGObject
    cpu_child(*args)


VARIANTS = (  # (name, package, copy out of the buffer, scale in the pipeline)
    ("unfolded copy", "unfolded", True, False),
    ("unfolded view", "unfolded", False, False),
    ("folded copy", "folded", True, False),
    ("folded view", "folded", False, False),
    ("folded scaled", "folded", False, True),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sleep-ms", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    assets = fetch_demo(progress=lambda m: None)
    demo = assets.packages["blazeface-back"]
    work = Path(tempfile.mkdtemp(prefix="edged-bench-copies-"))
    broker, port = start_broker(work)
    counter = Counter(port)
    load0 = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load0:.1f} at the start")
    res: dict[str, Any] = {"variants": [v[0] for v in VARIANTS], "repeats": args.repeats, "load_start": load0}
    runs: dict[str, list[dict[str, Any]]] = {v[0]: [] for v in VARIANTS}
    try:
        pkgs = packages(demo.root, work, "yes")
        ort_be = OnnxRuntimeBackend(demo.model_path, threads=1)
        name0, batch0 = batch_for(demo.root, assets.video)
        npz = work / "outputs.npz"
        import numpy as np

        np.savez(npz, **ort_be.infer({name0: batch0}))
        ort_be.close()
        feeds = {key: batch_for(root, assets.video) for key, root in pkgs.items()}
        cfgs = {}
        for variant, key, _copy, scaled in VARIANTS:
            cams = [
                {"name": f"cam{i}", "uri": f"file://{assets.video}", "realtime": False, "loop": True}
                | ({"scale_in_pipeline": True} if scaled else {})
                for i in range(batch0.shape[0])
            ]
            cfgs[variant] = write_config(work / f"{variant.replace(' ', '-')}.yaml", port, pkgs[key], cams, work / "s")
        for rep in range(args.repeats):
            for variant, key, copy, _scaled in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                name, batch = feeds[key]
                maker = functools.partial(stand_in, str(npz), args.sleep_ms, name, batch.shape, str(batch.dtype))
                out = work / "acc.json"
                out.unlink(missing_ok=True)
                child = copy_child if copy else cpu_child
                run_child(child, (str(cfgs[variant]), args.seconds, 3.0, maker, str(out)), counter, args.seconds + 90)
                acc = json.loads(out.read_text())
                acc["e2e"] = counter.rate(skip_s=3.0, tail_s=1.0)
                be = maker()
                acc["raw"] = raw_throughput(be, name, batch, 100)
                be.close()
                acc["eta"] = acc["e2e"] / acc["raw"]
                runs[variant].append(acc)
                print(
                    f"  repeat {rep + 1} {variant:>14}: {acc['e2e']:6.1f} img/s, eta {acc['eta']:.3f}, camera side "
                    f"{acc['camera_side_ms']:.2f} ms/frame, process {acc['process_ms']:.2f} ms/frame",
                    flush=True,
                )
    finally:
        counter.close()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    res["runs"] = runs
    res["load_end"] = os.getloadavg()[0]

    def ratio(a: str, b: str, key: str) -> float:
        return median([x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True)])

    res["ratios"] = {
        f"{a} / {b}": {k: ratio(a, b, k) for k in ("camera_side_ms", "process_ms")}
        for a, b in (
            ("unfolded copy", "folded copy"),
            ("unfolded view", "folded view"),
            ("unfolded copy", "folded view"),
            ("folded copy", "folded view"),
            ("unfolded copy", "folded scaled"),
            ("unfolded view", "folded scaled"),
        )
    }
    lines = [f"load average {load0:.1f} at the start, {res['load_end']:.1f} at the end (a shared machine)"]
    lines.append(f"\nsleep {args.sleep_ms:g} ms: CPU ms per frame inferred, by stage (wall ms where wrapped)")
    lines += engine_table(runs, list(runs))
    lines.append("\nwithin-repeat ratios (medians): camera side, process CPU")
    for k, v in res["ratios"].items():
        lines.append(f"  {k:<32} {v['camera_side_ms']:.2f}x   {v['process_ms']:.2f}x")
    text = "\n".join(lines)
    print("\n" + text)
    (args.out / "pipeline-copies.txt").write_text(text + "\n")
    (args.out / "pipeline-copies.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
