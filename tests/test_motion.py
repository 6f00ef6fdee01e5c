"""Motion-gated inference: the gate on synthetic rows, then a real daemon on a still scene where a face
appears, and on the demo video (share of frames skipped, recall kept)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edged.daemon.capture.motion import MotionGate, small_grey
from edged.daemon.config import MotionConfig
from edged.models.demo import DemoAssets

from .conftest import base_config, write_config
from .test_daemon import score

FPS = 15


def test_a_still_scene_is_inferred_at_the_keepalive_rate_and_motion_at_once() -> None:
    rng = np.random.default_rng(1)
    still = rng.random((3, 128, 128), dtype=np.float32)
    gate = MotionGate(MotionConfig(keepalive_s=5, hold_s=1))
    inferred = [
        k for k in range(60 * FPS) if gate.wants(still + rng.normal(0, 0.01, still.shape).astype(np.float32), k / FPS)
    ]
    # the first frame (nothing to compare with) and the hold after it, then one every 5 s
    after_hold = [k / FPS for k in inferred if k / FPS > 1.0]
    assert all(b - a >= 5 - 1e-9 for a, b in itertools.pairwise(after_hold))
    assert len(after_hold) == 11 and gate.skipped == 60 * FPS - len(inferred)
    moved = still.copy()
    moved[:, 40:80, 40:80] = 1.0  # an object appears: that very frame is inferred, and the hold after it
    seq = [gate.wants(moved, 60.0 + k / FPS) for k in range(5 * FPS)]
    quiet = seq.index(False)  # it stays: it fades into the background, then the hold ends
    assert seq[0] and quiet / FPS <= 3 and not any(seq[quiet:]), (quiet, seq)


def test_small_grey_takes_either_layout() -> None:
    hwc = np.zeros((256, 256, 3), np.uint8)
    hwc[:128] = 255
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    a, b = small_grey(hwc), small_grey(chw)
    assert a.shape == b.shape == (64, 64) and np.allclose(a, b) and a.max() == 1.0 and a.min() == 0.0


def still_video(demo: DemoAssets, path: Path, appear: int, n: int) -> list[float]:
    """A still scene (the demo's frame 10: no one there) where a face (from frame 100) is pasted from
    frame `appear` on; returns the face's box."""
    cap = cv2.VideoCapture(str(demo.video))
    frames = []
    for _ in range(101):
        frames.append(cap.read()[1])
    cap.release()
    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    x1, y1, x2, y2 = (round(v) for v in truth[100][0])
    bg = frames[10]
    out = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (bg.shape[1], bg.shape[0]))
    with_face = bg.copy()
    with_face[y1:y2, x1:x2] = frames[100][y1:y2, x1:x2]
    for k in range(n):
        out.write(with_face if k >= appear else bg)
    out.release()
    return [x1, y1, x2, y2]


def test_daemon_on_a_still_scene_then_a_face(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    appear, n = 150, 225  # 10 s of nothing, then a face for 5 s
    video = tmp_path / "still.avi"
    still_video(demo, video, appear, n)
    sub = subscribe(broker, "edged/#")
    cam = {
        "name": "hall",
        "uri": f"file://{video}",
        # as fast as inference takes it: the gate's seconds are the video's all the same (and no frame is
        # dropped, whatever the machine's load)
        "realtime": False,
        "detection": {"motion": {"keepalive_s": 2, "hold_s": 0.5}},
    }
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, [cam])))
    assert d.proc.wait(120) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    results = sub.results()
    tel = [m.json() for m in sub.on("telemetry")][-1]
    still = [r["frame"] for r in results if r["frame"] < appear]
    first_face = min(r["frame"] for r in results if r["detections"])
    skipped = tel["cameras"]["hall"]["skipped"]
    assert tel["cameras"]["hall"]["drops"] == 0 and tel["cameras"]["hall"]["frames"] == n
    print(
        f"\nstill scene: {len(still)} of {appear} frames inferred in {appear / FPS:.0f} s "
        "(keep-alive 2 s, hold 0.5 s), "
        f"{skipped} skipped in all; the face appeared on frame {appear}, first detected on frame {first_face}"
    )
    # the first frame and its hold (0.5 s: 8 frames), then one every 2 s: 10 s -> about 5 more
    assert len(still) <= 8 + 6 + 1
    assert first_face - appear <= 1, "detected within one frame interval of the motion"
    assert skipped >= appear - 16


@pytest.mark.slow
def test_gated_demo_video_keeps_recall(broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    faces = sum(len(v) for v in truth.values())

    def run(name: str, motion: dict[str, Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        sub = subscribe(broker, f"edged/{name}/#")
        # every frame offered (none dropped under load: only the gate decides), gated in the video's seconds
        cam: dict[str, Any] = {"name": "lobby", "uri": f"file://{demo.video}", "realtime": False}
        if motion is not None:
            cam["detection"] = {"motion": motion}
        doc = base_config(broker, demo, tmp_path / name, [cam], device_id=name)
        d = start_daemon(write_config(tmp_path / f"{name}.yaml", doc))
        assert d.proc.wait(180) == 0, d.output()[-3000:]
        sub.wait_stopped(10)
        return sub.results(), [m.json() for m in sub.on("telemetry")][-1]["cameras"]["lobby"]

    def recall(results: list[dict[str, Any]]) -> float:  # a face on a frame not inferred is missed
        r, _, _ = score(results, truth)
        found = round(r * sum(len(truth[x["frame"]]) for x in results))
        return found / faces

    plain, plain_cam = run("plain", None)
    gated, cam = run("gated", {})  # the defaults
    assert plain_cam["drops"] == cam["drops"] == 0 and len(plain) == plain_cam["frames"]
    assert len(gated) == cam["frames"] - cam["skipped"], "every frame the gate let through has its result"
    share = cam["skipped"] / cam["frames"]
    kept = recall(gated) / recall(plain)
    print(
        f"\ndemo video gated: {share:.1%} of frames skipped, recall {recall(gated):.3f} vs {recall(plain):.3f} "
        f"ungated ({kept:.3f} kept)"
    )
    assert kept >= 0.98
