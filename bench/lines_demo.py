#!/usr/bin/env python3
"""Lines on the demo video: the daemon's crossings against the ground truth's, and the tracker's ID switches
(a benchmark script, not a test; tests/test_lines.py holds the daemon to what it writes).

A real daemon (`edged run`, the demo model, BlazeFace on ONNX Runtime, tracking min_hits 3 / max_age 5, not
real time: every frame) reads the video through to its end and publishes results and events to a local
mosquitto. Two cases, each run --repeats times:

    whole  the whole demo video (300 frames, 5 truth appearances) with tests/test_lines.py's DEMO_LINES:
           door and sill (pixels), aisle (normalised), ramp (slanted), floor (normalised, uncrossed)
    gap    its frames 60-134 with 90-104 cut out: the astronaut's box jumps 100 px between two frames and
           his one appearance gets a second track id (the switch counting's own check), door and sill

Per case: the truth's crossings (plain geometry on the truth boxes' anchors) and the daemon's object_crossed
events, (appearance, line, direction, frame), their counts by line and direction; per truth appearance the
track ids its frames matched (IoU >= 0.5) and the ID switches between them; the crossings plain segment
intersection (no hysteresis) finds on the same published tracks.

    python bench/lines_demo.py [--repeats 2] [--out bench/results/lines_demo.json]
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common_rig import REPO, parser, write_results

from edged.models.demo import default_dir, fetch_demo
from tests.conftest import Broker, Subscriber, base_config, write_config
from tests.test_events import appearances
from tests.test_lines import (
    DEMO_LINES,
    GAP,
    LINES,
    TRACKING,
    crossing_report,
    demo_camera,
    gap_video,
    renumbered,
    same_crossings,
)


def run_daemon(broker: Broker, cfg: dict[str, Any], work: Path, tag: str) -> tuple[list[Any], list[Any]]:
    """`edged run` until the video's end: (results, events) as published."""
    sub = Subscriber(broker.host, broker.port, f"edged/{cfg['device_id']}/#")
    path = write_config(work / f"{tag}.yaml", cfg)
    log = work / f"{tag}.log"
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "edged", "run", "-c", str(path)], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            timeout=600, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"the daemon failed ({tag}): {log.read_text()[-3000:]}")
    deadline = time.monotonic() + 10
    while not any(m.json()["state"] == "stopped" for m in sub.on("status")) and time.monotonic() < deadline:
        time.sleep(0.05)  # everything it published is in once its stopped status is
    results = [m.json() for m in sub.messages if "/results/" in m.topic]
    events = [m.json() for m in sub.messages if m.topic.endswith("/events")]
    sub.close()
    return results, events


def counts(crossings: list[Any], lines: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Crossings by line (every one, in the config's order) and direction."""
    out = {n["name"]: {"in": 0, "out": 0} for n in lines}
    for _, line, direction, _ in crossings:
        out[line][direction] += 1
    return out


def main() -> int:
    ap = parser(__doc__, "lines_demo.json")
    ap.set_defaults(repeats=2)
    args = ap.parse_args()
    demo = fetch_demo(default_dir())
    truth = appearances(json.loads(demo.ground_truth.read_text())["frames"])
    load0 = os.getloadavg()[0]
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_start": round(load0, 1),
        "note": "the machine was shared with other engineers' test runs; these figures do not depend on its speed "
        "(not real time: every frame is inferred)",
        "tracking": TRACKING,
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory(prefix="edged-bench-lines-") as tmp:
        work = Path(tmp)
        video, frames = gap_video(demo.video, work / "gap.mp4")
        cases = {
            "whole": (f"file://{demo.video}", DEMO_LINES, truth),
            "gap": (f"file://{video}", LINES, renumbered(truth, frames)),
        }
        broker = Broker(work)
        broker.start()
        try:
            for case, (uri, lines, apps) in cases.items():
                reports = []
                for rep in range(args.repeats):
                    cfg = base_config(broker, demo, work, [demo_camera(uri, lines)], device_id=f"lines-{case}-{rep}")
                    cfg["state_dir"] = str(work / f"state-{case}-{rep}")
                    results, events = run_daemon(broker, cfg, work, f"{case}-{rep}")
                    report = crossing_report(results, events, apps, lines)
                    print(f"{case} #{rep + 1}: {report}", flush=True)
                    reports.append(report)
                first = reports[0]
                same = all(r["events"] == first["events"] and r["id_switches"] == first["id_switches"] for r in reports)
                out[case] = {
                    "video": "the demo video, 300 frames" if case == "whole" else f"demo frames 60-134 less {GAP}",
                    "lines": lines,
                    "truth_crossings": [list(c) for c in first["truth"]],
                    "events": [list(c) for c in first["events"]],
                    "truth_counts": counts(first["truth"], lines),
                    "event_counts": counts(first["events"], lines),
                    "crossings_match": all(same_crossings(r) for r in reports),
                    "tracks_per_appearance": {str(k): v for k, v in first["tracks"].items()},
                    "truth_frames": {str(k): v for k, v in first["truth_frames"].items()},
                    "matched_frames": {str(k): v for k, v in first["matched_frames"].items()},
                    "id_switches": {str(k): max(r["id_switches"][k] for r in reports) for k in first["id_switches"]},
                    "id_switches_total": max(sum(r["id_switches"].values()) for r in reports),
                    "naive_crossings": [r["naive"] for r in reports],
                    "naive_by_line": first["naive_by_line"],
                    "repeats_identical": same,
                }
        finally:
            broker.stop()
    out["load_average_end"] = round(os.getloadavg()[0], 1)
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
