"""The governor: every `interval_s`, read thermals, power and memory, and act on them.

Thermal levels, with hysteresis and a minimum dwell (DESIGN.md §7):

    normal ──(hottest watched zone ≥ warm_c)──> warm: frame rate × warm_fps_scale
    warm   ──(≥ hot_c)──> hot: inference paused, cameras keep reading (their health still shows)
    hot    ──(≥ critical_c)──> critical: the configured action (pause, or exit for systemd to handle)

A level is entered at once when its threshold is reached; it is left only after `min_dwell_s` in it
and once the temperature is `hysteresis_c` below the threshold, so a noisy sensor cannot make it
flap. A power cap (`power_cap_w`) scales the frame rate by cap / power while the total power is over
it and lets it recover slowly below 90 % of it. Memory: the model must fit `memory.budget_mb` at
start (`admit`), a swap runs side by side when both models fit and stop-the-world otherwise
(`plan_swap`). The memory spent (RSS, plus nvmap on a Jetson) over `memory.throttle_pct` of the
budget halves the frame rate -- a throttle: it cuts CPU/GPU load and heat, and frees no memory, since
frame buffers and model memory are preallocated; over `memory.hard_limit_pct` it stops the daemon with
the reason (systemd restarts it with a fresh heap). Transitions go to `…/events`; readings to
`…/telemetry`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

import numpy as np

from edged.errors import EngineLoadError, SwapError

from ..capture.camera import Throttle
from ..config import GovernorConfig, MemoryConfig
from .sensors import Reading, Sensors

logger = logging.getLogger(__name__)

MEMORY_FPS_SCALE = 0.5  # the frame rate while memory is over memory.throttle_pct


class Level(IntEnum):
    NORMAL = 0
    WARM = 1
    HOT = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


def admit(model: str, model_mb: float, buffers_mb: float, in_use_mb: float, budget_mb: float) -> None:
    """Refuse a model that does not fit the memory budget, naming both numbers."""
    need = in_use_mb + model_mb + buffers_mb
    if need > budget_mb:
        raise EngineLoadError(
            f"model {model} does not fit the memory budget: {model_mb:.1f} MB (weights, I/O and activations) + "
            f"{buffers_mb:.1f} MB of frame buffers on top of {in_use_mb:.1f} MB in use = {need:.1f} MB, "
            f"over memory.budget_mb {budget_mb:.0f} MB",
            code="over_budget",
        )


def plan_swap(
    current_mb: float, new_mb: float, in_use_mb: float, budget_mb: float
) -> Literal["side_by_side", "stop_the_world"]:
    """How a model swap fits the budget: both models at once if they fit, else unload the old one
    first (it stays on disk to reload); refused when even that does not fit."""
    if in_use_mb + new_mb <= budget_mb:
        return "side_by_side"
    if in_use_mb - current_mb + new_mb <= budget_mb:
        return "stop_the_world"
    raise SwapError(
        f"the new model needs {new_mb:.1f} MB; with the current one unloaded {in_use_mb - current_mb:.1f} MB "
        f"stay in use, over the {budget_mb:.0f} MB budget",
        code="over_budget",
    )


@dataclass
class Decision:
    level: Level
    fps_scale: float
    paused: bool
    events: list[dict[str, Any]]
    stop_reason: str = ""


class Policy:
    """Pure policy: readings and times in, level and frame-rate scale out. No I/O."""

    def __init__(self, cfg: GovernorConfig, mem: MemoryConfig) -> None:
        self.cfg = cfg
        self.mem = mem
        self.level = Level.NORMAL
        self.since = -1e18
        self.power_scale = 1.0
        self.memory_scale = 1.0
        self.oc_last: dict[str, int] = {}
        self.thresholds = {Level.WARM: cfg.warm_c, Level.HOT: cfg.hot_c, Level.CRITICAL: cfg.critical_c}

    def reconfigure(self, cfg: GovernorConfig, mem: MemoryConfig) -> None:
        """New thresholds and limits (a reload); the current level is kept and re-evaluated next sample."""
        self.cfg, self.mem = cfg, mem
        self.thresholds = {Level.WARM: cfg.warm_c, Level.HOT: cfg.hot_c, Level.CRITICAL: cfg.critical_c}

    def _level_for(self, temp: float) -> Level:
        level = Level.NORMAL
        for lv, threshold in self.thresholds.items():
            if temp >= threshold:
                level = lv
        return level

    def watched_temp(self, r: Reading) -> tuple[str, float] | None:
        temps = r.governed_temps_c(self.cfg.zones)
        if not temps:
            return None
        name = max(temps, key=lambda k: temps[k])
        return name, temps[name]

    def update(self, r: Reading, now: float) -> Decision:
        events: list[dict[str, Any]] = []
        watched = self.watched_temp(r)
        if watched is not None:
            zone, temp = watched
            target = self._level_for(temp)
            new = self.level
            if target > self.level:
                new = target
            elif target < self.level and now - self.since >= self.cfg.min_dwell_s:
                new = max(target, self._level_for(temp + self.cfg.hysteresis_c))
            if new != self.level:
                events.append(
                    {
                        "type": "throttle",
                        "from": self.level.label,
                        "to": new.label,
                        "reason": f"{zone} {temp:.1f} °C",
                        "temp_c": round(temp, 1),
                    }
                )
                self.level, self.since = new, now
        events += self._power(r)
        events += self._over_current(r)
        stop_reason = ""
        mem_events, stop_reason = self._memory(r)
        events += mem_events
        paused = self.level >= Level.HOT
        if self.level == Level.CRITICAL and self.cfg.critical_action == "exit":
            stop_reason = stop_reason or "critical temperature: exiting for systemd to handle"
        level_scale = self.cfg.warm_fps_scale if self.level == Level.WARM else 1.0
        scale = level_scale * self.power_scale * self.memory_scale
        return Decision(self.level, 0.0 if paused else scale, paused, events, stop_reason)

    def _power(self, r: Reading) -> list[dict[str, Any]]:
        cap = self.cfg.power_cap_w
        if cap is None or r.power_w is None:
            return []
        before = self.power_scale
        if r.power_w > cap:
            self.power_scale = max(0.1, self.power_scale * cap / r.power_w)
        elif r.power_w < 0.9 * cap:
            self.power_scale = min(1.0, self.power_scale * 1.1)
        if (before >= 1.0) != (self.power_scale >= 1.0):
            capped = self.power_scale < 1.0
            return [
                {
                    "type": "power_cap",
                    "state": "capped" if capped else "released",
                    "power_w": round(r.power_w, 2),
                    "cap_w": cap,
                    "fps_scale": round(self.power_scale, 3),
                }
            ]
        return []

    def _over_current(self, r: Reading) -> list[dict[str, Any]]:
        events = []
        for name, count in r.oc_events.items():
            last = self.oc_last.get(name)
            if last is not None and count > last:
                events.append({"type": "over_current", "counter": name, "new_events": count - last, "total": count})
            self.oc_last[name] = count
        return events

    def _memory(self, r: Reading) -> tuple[list[dict[str, Any]], str]:
        spent = r.spent_mb  # RSS, plus this process's nvmap (GPU) memory on a Jetson
        if spent is None or r.rss_mb is None:
            return [], ""
        budget = self.mem.budget_mb
        hard, soft = budget * self.mem.hard_limit_pct / 100, budget * self.mem.throttle_pct / 100
        gpu = f" + GPU (nvmap) {r.gpu_mb:.0f} MB" if r.gpu_mb else ""
        if spent >= hard:
            event = {"type": "memory", "state": "hard_limit", "rss_mb": r.rss_mb, "limit_mb": round(hard, 1)}
            if r.gpu_mb is not None:
                event["gpu_mb"] = r.gpu_mb
            return [event], (
                f"memory: RSS {r.rss_mb:.0f} MB{gpu} is over the hard limit {hard:.0f} MB ({budget:.0f} MB budget)"
            )
        throttled = spent >= soft
        if throttled != (self.memory_scale < 1.0):
            self.memory_scale = MEMORY_FPS_SCALE if throttled else 1.0
            state = "throttled" if throttled else "normal"
            event = {
                "type": "memory",
                "state": state,
                "rss_mb": r.rss_mb,
                "soft_limit_mb": round(soft, 1),
                "fps_scale": self.memory_scale,
            }
            if r.gpu_mb is not None:
                event["gpu_mb"] = r.gpu_mb
            return [event], ""
        return [], ""


class Governor:
    """Samples the sensors every `interval_s` on its own thread and applies the policy."""

    def __init__(
        self,
        cfg: GovernorConfig,
        mem: MemoryConfig,
        sensors: Sensors,
        throttle: Throttle,
        publish_event: Callable[[dict[str, Any]], None],
        request_stop: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.mem = mem
        self.sensors = sensors
        self.policy = Policy(cfg, mem)
        self.throttle = throttle
        self.publish_event = publish_event
        self.request_stop = request_stop
        self.last: Reading | None = None
        self.samples = 0
        self.cpu_s = 0.0
        self.started = time.monotonic()
        self.rss: deque[tuple[float, float]] = deque(maxlen=3600)  # appended by the governor's thread
        self._rss_lock = threading.Lock()  # ...read by telemetry's (a deque mutated while iterated raises)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governor", daemon=True)
        if sensors.missing:
            logger.info("governor: this machine has no %s sensors; running without them", ", ".join(sensors.missing))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.interval_s):
            c0 = time.thread_time()
            try:
                self.step(time.monotonic())
            except Exception:  # a loop boundary: log, count, keep governing
                logger.exception("governor: a sample failed")
            self.cpu_s += time.thread_time() - c0

    def step(self, now: float) -> Decision:
        r = self.sensors.read()
        self.last = r
        self.samples += 1
        if r.rss_mb is not None:
            with self._rss_lock:
                self.rss.append((now, r.rss_mb))
        d = self.policy.update(r, now)
        self.throttle.set(d.fps_scale, d.paused)
        for e in d.events:
            logger.warning("governor: %s", e)
            self.publish_event(e)
        if d.stop_reason:
            self.request_stop(d.stop_reason)
        return d

    def rss_slope_mb_per_min(self, window_s: float = 600.0) -> float | None:
        with self._rss_lock:
            rss = list(self.rss)
        pts = [(t, v) for t, v in rss if t >= (rss[-1][0] - window_s)] if rss else []
        if len(pts) < 10 or pts[-1][0] - pts[0][0] < 30:
            return None
        t = np.array([p[0] for p in pts])
        v = np.array([p[1] for p in pts])
        return round(float(np.polyfit(t - t[0], v, 1)[0]) * 60.0, 3)

    def telemetry(self) -> dict[str, Any]:
        r = self.last
        wall = max(1e-6, time.monotonic() - self.started)
        out: dict[str, Any] = {
            "level": self.policy.level.label,
            "fps_scale": round(self.throttle.fps_scale, 3),
            "paused": self.throttle.paused,
            "power_scale": round(self.policy.power_scale, 3),
            "memory_fps_scale": self.policy.memory_scale,  # 0.5 while memory is over memory.throttle_pct
            "samples": self.samples,
            "cpu_pct": round(100.0 * self.cpu_s / wall, 3),
            "rss_slope_mb_per_min": self.rss_slope_mb_per_min(),
        }
        if r is not None:
            out["sensors"] = r.to_json()
        return out
