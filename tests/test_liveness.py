"""Liveness that means serving (daemon/liveness.py): dead once no camera has offered a frame, or no batch
has run while frames are offered, for inference.serving_timeout_s; never while paused (the clock starts
again at the resume), never once every camera has ended, off at 0. Real cameras (not started: their
counters are what a running one moves) and the real Throttle; the loop is read through the `Batches`
seam. The daemon and the watchdog end to end: tests/test_health.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from edged.daemon.capture.camera import Camera, Throttle
from edged.daemon.capture.motion import MotionGate
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.config import CameraConfig, load_config
from edged.daemon.config.cameras import MotionConfig
from edged.daemon.inference import InferenceStats
from edged.daemon.liveness import Liveness
from edged.errors import ConfigError
from edged.models.demo import DemoAssets

from .conftest import base_config, wait_until, write_config
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


class Wedged:
    """A source that gives frames, then wedges inside `read` (or `close`) as a thread stuck in GStreamer or
    FFmpeg does: nothing times it out, only `release` (the test) lets it return."""

    fps = 25.0
    scaled_from: tuple[int, int] | None = None

    def __init__(self, where: str, after: int = 3) -> None:
        self.where, self.after, self.reads = where, after, 0
        self.wedged, self.release = threading.Event(), threading.Event()

    def read(self) -> np.ndarray | None:
        self.reads += 1
        if self.where == "read" and self.reads > self.after:
            self._wedge()
        if self.where == "close" and self.reads > self.after:
            return None  # a stall: the camera closes the source, and the close wedges
        return np.full((48, 64, 3), 90, np.uint8)

    def close(self) -> None:
        if self.where == "close":
            self._wedge()

    def _wedge(self) -> None:
        self.wedged.set()
        self.release.wait(60)


@pytest.mark.parametrize("where", ["read", "close"])
def test_a_camera_stuck_in_a_source_call_is_dead_though_another_serves(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One camera's thread wedged inside its source (read, or close after a stall) while the other delivers
    frames and batches run: today's counters look healthy. The stuck camera is named (its stack logged once)
    as soon as its call outlives any bound a call has, and the daemon is dead once that lasts the bound."""
    cond, stop = threading.Condition(), threading.Event()
    source = Wedged(where)
    cfg = CameraConfig(name="gate", uri="rtsp://127.0.0.1:1/gate", stall_timeout_s=0.2, reconnect_min_s=0.1)
    stuck = Camera(cfg, Preprocessor(SPEC), cond, stop, opener=lambda _c: source)
    other = cameras("door")[0]
    loop = Loop()
    live = Liveness(60.0, [other, stuck], loop, Throttle())
    stuck.start()
    try:
        assert source.wedged.wait(20), "the source wedged"
        t0 = time.monotonic()
        assert stuck.in_call(t0)[0] == where
        assert live.check(t0) == "" and stuck.stuck(t0) == ""  # within any call's bound: not stuck yet
        later = t0 + stuck.stuck_after_s + 1
        other.stats.frames += 1
        loop.stats.batches += 1
        assert live.check(later) == ""  # stuck, not yet for the bound: named, its stack logged
        assert f"stuck in its source's {where}() for" in stuck.stuck(later)
        logged = [r.getMessage() for r in caplog.records if "camera gate: stuck" in r.getMessage()]
        assert len(logged) == 1 and "_wedge" in logged[0], logged
        dead_at = t0 + 60 + 1
        other.stats.frames += 1
        loop.stats.batches += 1
        dead = live.check(dead_at)
        assert dead.startswith(f"serving: camera gate is stuck in its source's {where}() for"), dead
        assert "inference.serving_timeout_s 60" in dead
        assert len([r for r in caplog.records if "camera gate: stuck" in r.getMessage()]) == 1, "logged once"
        # as telemetry, /readyz and /metrics show it (they read the clock now): `stuck`, never `up`
        assert stuck.shown_state()[0] != "stuck"
        stuck.stuck_after_s = 0.2
        wait_until(lambda: bool(stuck.stuck()), 10, "the camera to count as stuck")
        shown, reason = stuck.shown_state()
        assert shown == "stuck" and reason.startswith(f"stuck in its source's {where}() for"), (shown, reason)
        assert stuck.stats.state == "up" and not stuck.live  # it went in up (a close follows a stall before `down`)
    finally:
        source.release.set()
        stop.set()
        stuck.join(10)
    assert not stuck._thread.is_alive()
    assert stuck.in_call()[0] == "" and live.check(time.monotonic()) == ""
