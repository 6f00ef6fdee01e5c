"""Liveness that means serving (daemon/liveness.py): dead once no camera has offered a frame, or no batch
has run while frames are offered, for inference.serving_timeout_s; never while paused (the clock starts
again at the resume), never once every camera has ended, off at 0. Real cameras (not started: their
counters are what a running one moves) and the real Throttle; the loop is read through the `Batches`
seam. The daemon and the watchdog end to end: tests/test_health.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edged.daemon.camera_config import MotionConfig
from edged.daemon.capture import Camera, Throttle
from edged.daemon.config import CameraConfig, load_config
from edged.daemon.inference import InferenceStats
from edged.daemon.liveness import Liveness
from edged.daemon.motion import MotionGate
from edged.daemon.preprocess import Preprocessor
from edged.errors import ConfigError
from edged.models.demo import DemoAssets

from .conftest import base_config, write_config
from .test_capture import SPEC

BOUND = 10.0


@dataclass
class Loop:
    stats: InferenceStats = field(default_factory=InferenceStats)
    gates: dict[str, MotionGate] = field(default_factory=dict)


def cameras(*names: str) -> list[Camera]:
    cond, stop = threading.Condition(), threading.Event()
    return [Camera(CameraConfig(name=n, uri=f"rtsp://127.0.0.1:1/{n}"), Preprocessor(SPEC), cond, stop) for n in names]


def test_no_frame_from_any_camera_for_the_bound_is_dead_and_says_which() -> None:
    cams, loop = cameras("door", "lobby"), Loop()
    live = Liveness(BOUND, cams, loop, Throttle())
    assert live.check(100.0) == ""  # the clock starts at the first check (the daemon ready)
    cams[0].stats.state, cams[0].stats.last_error = "down", "rtsp://127.0.0.1:1/door: connection refused"
    cams[1].stats.state = "down"
    assert live.check(100.0 + BOUND) == ""
    dead = live.check(100.0 + BOUND + 0.5)
    assert dead.startswith("serving: no camera has delivered a frame for 10 s"), dead
    assert "inference.serving_timeout_s 10" in dead and "lobby down" in dead
    assert "door down (rtsp://127.0.0.1:1/door: connection refused)" in dead
    cams[1].stats.frames += 1  # one camera delivering is serving
    cams[1].stats.state = "up"
    assert live.check(200.0) == ""
    assert live.check(200.0 + BOUND + 1) != ""


def test_frames_with_no_batch_for_the_bound_is_dead_and_a_gate_judging_frames_is_not() -> None:
    cams, loop = cameras("door"), Loop()
    live = Liveness(BOUND, cams, loop, Throttle())
    live.check(0.0)
    for t in range(1, 13):  # frames keep coming from t=1, no batch takes them
        cams[0].stats.frames += 1
        got = live.check(float(t))
    assert got.startswith("serving: no batch has run for 11 s while cameras deliver frames"), got
    loop.stats.batches += 1
    assert live.check(13.0) == ""
    gate = loop.gates["door"] = MotionGate(MotionConfig())
    for t in range(14, 40):  # nothing moves: the gate skips every frame, which is judging them
        cams[0].stats.frames += 1
        gate.skipped += 1
        assert live.check(float(t)) == "", t


def test_a_pause_is_not_dead_and_the_resume_gets_the_whole_bound() -> None:
    cams, throttle = cameras("door"), Throttle()
    live = Liveness(BOUND, cams, Loop(), throttle)
    live.check(0.0)
    throttle.user_paused = True  # the `pause` command: cameras offer nothing
    assert live.check(50.0) == ""
    throttle.user_paused = False
    assert live.check(50.0 + BOUND) == ""
    assert live.check(50.0 + BOUND + 1) != ""
    throttle.governor_paused = True  # the governor's pause (heat) likewise
    assert live.check(100.0) == ""


def test_cameras_that_ended_are_not_dead_and_zero_is_off() -> None:
    cams = cameras("file")
    live = Liveness(BOUND, cams, Loop(), Throttle())
    live.check(0.0)
    cams[0].stats.state = "ended"
    assert live.check(1000.0) == ""
    off = Liveness(0, cameras("door"), Loop(), Throttle())
    off.check(0.0)
    assert off.check(1e6) == ""
    with pytest.raises(ValueError, match="bound_s must be 0"):
        Liveness(-1, cams, Loop(), Throttle())


def test_the_bound_is_checked_at_load(demo: DemoAssets, tmp_path: Path) -> None:
    class Broker:
        host, port = "127.0.0.1", 1883

    def doc(value: float) -> dict[str, object]:
        inference = {"max_wait_ms": 20, "serving_timeout_s": value}
        return base_config(Broker(), demo, tmp_path, [{"name": "c", "uri": "synthetic://"}], inference=inference)

    assert load_config(write_config(tmp_path / "ok.yaml", doc(0))).inference.serving_timeout_s == 0
    assert load_config(write_config(tmp_path / "ok2.yaml", doc(120))).inference.serving_timeout_s == 120
    with pytest.raises(ConfigError, match=r"inference\.serving_timeout_s.*0 \(off\) or at least 10"):
        load_config(write_config(tmp_path / "bad.yaml", doc(5)))
