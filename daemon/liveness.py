"""Liveness that means serving: frames come in and batches run.

The watchdog (systemd) and ``/healthz`` fail when one of the daemon's threads stops making progress. A
daemon whose threads all turn while it serves nothing looked healthy: every camera down for good (a
process out of file descriptors, a wedged driver), or frames offered that no batch ever takes. Here it
is unhealthy once, with inference not paused and some camera neither ended nor stopped, no camera has
offered a frame for ``inference.serving_timeout_s``, or frames were offered and no batch ran (and no
motion gate judged a frame) for that long. The time counts from the first check (the daemon ready) and
again from each resume after a pause, so a boot and a resume each get the whole bound. systemd then
restarts the daemon (docs/operator.md, "Health endpoint").

A camera whose thread is stuck inside one source call (``Camera.stuck``: wedged in GStreamer or FFmpeg,
where no timeout reaches) serves nothing however well the others do, and only a restart frees it: its
stack is logged once as soon as it counts as stuck, and once it has been stuck for the bound the daemon is
unhealthy, naming it, whatever the other cameras deliver and even while paused.

Counters, not timestamps: a camera's ``frames`` and the loop's ``batches`` (and the gates' ``skipped``)
are sampled at each check, from the run loop several times a second and from ``/healthz``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

from .capture.camera import Camera, Throttle
from .capture.motion import MotionGate
from .inference import InferenceStats

logger = logging.getLogger(__name__)

FINISHED = ("ended", "stopped")  # a camera in these states is not expected to deliver


class Batches(Protocol):
    """What is read of the inference loop (`InferenceLoop`)."""

    @property
    def stats(self) -> InferenceStats: ...

    @property
    def gates(self) -> Mapping[str, MotionGate]: ...


class Liveness:
    def __init__(self, bound_s: float, cameras: Sequence[Camera], loop: Batches, throttle: Throttle) -> None:
        """`bound_s`: how long without a frame offered, or without a batch while frames are, is dead (0: off)."""
        if bound_s < 0:
            raise ValueError(f"bound_s must be 0 (off) or positive, not {bound_s}")
        self.bound_s = bound_s
        self._cameras, self._loop, self._throttle = cameras, loop, throttle
        self._lock = threading.Lock()
        self._frames = self._judged = self._frames_judged = 0
        self._frames_at: float | None = None  # when a camera last offered a frame (or the clock restarted)
        self._owed_since: float | None = None  # since when frames offered wait for a batch (None: none wait)
        self._logged: set[tuple[str, float]] = set()  # (camera, call start) whose stuck thread's stack was logged

    def stuck(self, now: float) -> str:
        """'' unless a camera's thread has been stuck in one source call for the bound: then which, a sentence.
        `now` is the monotonic clock (a camera times its calls by it)."""
        if not self.bound_s:
            return ""
        dead = ""
        for c in self._cameras:
            why = c.stuck(now)
            if not why:
                continue
            spent = c.in_call(now)[1]
            key = (c.name, round(now - spent, 3))  # once per stuck call, for whoever reads the journal
            if key not in self._logged:
                self._logged.add(key)
                logger.error("camera %s: %s; its thread's stack:\n%s", c.name, why, c.stack())
            if spent > self.bound_s and not dead:
                dead = (
                    f"serving: camera {c.name} is {why}; only a restart frees a thread stuck in a library "
                    f"(inference.serving_timeout_s {self.bound_s:g})"
                )
        return dead

    def check(self, now: float) -> str:
        """'' while serving (or off, paused, every camera finished); else which part is dead, a sentence."""
        if not self.bound_s:
            return ""
        stuck = self.stuck(now)
        if stuck:
            return stuck
        frames = sum(c.stats.frames for c in self._cameras)
        judged = self._loop.stats.batches + sum(g.skipped for g in self._loop.gates.values())
        paused = self._throttle.paused
        with self._lock:
            first = self._frames_at is None
            frames_at = self._frames_at
            if frames_at is None or paused or frames != self._frames:
                self._frames, self._frames_at = frames, now
                frames_at = now
            if first or paused or judged != self._judged:  # a batch ran (or a gate judged): nothing is owed
                self._judged, self._frames_judged, self._owed_since = judged, frames, None
            elif frames != self._frames_judged and self._owed_since is None:
                self._owed_since = now  # frames came since the last batch: from now, one is owed
            no_frame_s = now - frames_at
            no_batch_s = 0.0 if self._owed_since is None else now - self._owed_since
        if paused or all(c.stats.state in FINISHED for c in self._cameras):
            return ""
        if no_frame_s > self.bound_s:
            states = ", ".join(
                f"{c.name} {c.stats.state}" + (f" ({c.stats.last_error})" if c.stats.last_error else "")
                for c in self._cameras
            )
            return (
                f"serving: no camera has delivered a frame for {no_frame_s:.0f} s "
                f"(inference.serving_timeout_s {self.bound_s:g}; cameras: {states})"
            )
        if no_batch_s > self.bound_s:
            return (
                f"serving: no batch has run for {no_batch_s:.0f} s while cameras deliver frames "
                f"(inference.serving_timeout_s {self.bound_s:g})"
            )
        return ""
