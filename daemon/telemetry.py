"""Telemetry: the retained ``<prefix>/<device>/telemetry`` document and systemd's one-line ``STATUS=``.

The daemon publishes `Telemetry.document()` every ``telemetry.interval_s`` (QoS 0, retained) and once more
at a clean stop; rates (fps) are over the time since the previous document. `status_line()` is what
``systemctl status`` shows, with the frame rate of the last interval. `summary()`: what a run did, once it
has stopped (`edged run` prints it).

    {"schema": "edged.telemetry/1", "device", "boot_id", "ts", "uptime_s",
     "cameras": {<name>: {state, fps, frames, drops, reconnects, stalls, errors, frames_refused,
                          capture_to_result_ms,
                          [events, events_dropped, snapshots_dropped: cameras that publish object events],
                          [crossings: {line: {in|out: {label: n}}}: cameras with lines]}},
     "inference": {backend, model, swaps, batch, fps, batches, rows, padded_rows, errors, infer_ms, ...},
     "mqtt": {...}, "memory": {rss_mb, peak_rss_mb, model_mb, budget_mb, ...}, "governor": {...},
     "sensors": {...}, "ota": {...} | null,
     [clips: {clips, bytes, written_bytes, removed_age, removed_bytes, ...}: where a camera records]}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edged.protocol.schemas import TELEMETRY_SCHEMA

from .delivery.publisher import iso
from .host.sensors import process_memory_mb
from .inference import Result, Window
from .parts import Parts


@dataclass
class RunSummary:
    results: int  # results produced by inference
    batches: int
    peak_rss_mb: float
    seconds: float
    stop_reason: str = ""  # set when the governor stopped the daemon (hard memory limit, critical heat)
    spooled: int = 0  # messages (results and events) written to the spool
    delivered: int = 0  # messages the broker acknowledged (PUBACK), or sent at QoS 0; deleted from the spool
    left_in_spool: int = 0  # messages in the spool file after stop, sent at the next start
    lost: int = 0  # messages dropped: spool bounds, queue full, oversized, not writable, a corrupt spool
    failure: str = ""  # set when a thread died and the daemon stopped for systemd to restart it
    events_dropped: int = 0  # object events over a camera's max_events_per_s, never made into messages


class Telemetry:
    """Assembles the telemetry document and the status line from the running parts; keeps the per-camera
    capture-to-result latency windows (`record`, for every result) and the rates' previous sample."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.cam_latency = {c.name: Window() for c in parts.cameras}
        self._last = (time.monotonic(), 0, {c.name: 0 for c in parts.cameras})  # when, rows, frames per camera
        self.fps = 0.0  # results per second over the last interval, for the status line
        # remote configuration (lifecycle/remote.py's summary: the versions in force by source), when on
        self.remote_config: Callable[[], dict[str, Any]] | None = None
        self.clips: Callable[[], dict[str, Any]] | None = None  # the clip planner's counters (record/), when on
        self.uploads: Callable[[], dict[str, int]] | None = None  # the uploader's counters, with upload:
        self.labelling: Callable[[], dict[str, int]] | None = None  # the frames worth labelling, when on
        self.stages: Callable[[], dict[str, Any]] | None = None  # the cascade's counters per stage, with stages:

    def record(self, r: Result) -> None:
        self.cam_latency[r.camera].add(r.capture_to_result_ms)

    def status_line(self) -> str:
        parts = self.parts
        st = parts.loop.stats
        package = parts.models.package
        up = sum(1 for c in parts.cameras if c.live)
        level = parts.governor.policy.level.label if parts.governor else "off"
        p = parts.publisher
        return (
            f"{self.fps:.1f} fps, {up}/{len(parts.cameras)} cameras up, batch {package.manifest.input.batch}, "
            f"{package.ref} on {parts.backend_name}, broker {'up' if p.connected else 'down'}, thermal {level}, "
            f"spool {p.spool.rows}{'' if p.spool_state == 'ok' else ' (failing)'}, {st.errors} errors"
        )

    def document(self) -> dict[str, Any]:
        """The telemetry document now; its rates are over the time since the previous one."""
        parts = self.parts
        cfg = parts.host.cfg
        now = time.monotonic()
        t0, rows0, frames0 = self._last
        dt_s = max(1e-6, now - t0)
        st = parts.loop.stats
        cams = {}
        for c in parts.cameras:
            s = c.stats
            shown, reason = c.shown_state()  # `stuck` while its thread is stuck in a source call
            cams[c.name] = {
                "state": shown,
                "fps": round((s.frames - frames0.get(c.name, 0)) / dt_s, 2),
                "frames": s.frames,
                "drops": s.drops,
                "reconnects": s.reconnects,
                "stalls": s.stalls,
                "errors": s.errors,
                "frames_refused": s.frames_refused,
                "capture_to_result_ms": self.cam_latency[c.name].percentiles(),
            }
            if c.name in parts.loop.gates:  # motion-gated: frames skipped while nothing moved
                cams[c.name]["skipped"] = parts.loop.gates[c.name].skipped
            if reason:
                cams[c.name]["last_error"] = reason
            cams[c.name].update(parts.scenes.counts(c.name) or {})
            if (crossings := parts.scenes.crossings(c.name)) is not None:
                cams[c.name]["crossings"] = crossings
        self._last = (now, st.rows, {c.name: c.stats.frames for c in parts.cameras})
        self.fps = (st.rows - rows0) / dt_s
        gov: dict[str, Any] = parts.governor.telemetry() if parts.governor else {"level": "off"}
        memory: dict[str, Any] = {
            **process_memory_mb(),
            "model_mb": round(self._model_bytes() / 2**20, 1),
            "budget_mb": cfg.memory.budget_mb,
            "rss_slope_mb_per_min": gov.pop("rss_slope_mb_per_min", None),
        }
        sensors: dict[str, Any] = gov.pop("sensors", {})
        for key in ("mem_available_mb", "nvmap_mb"):
            if key in sensors:
                memory[key] = sensors.pop(key)
        package = parts.models.package
        remote = self.remote_config() if self.remote_config is not None else {}
        return {
            "schema": TELEMETRY_SCHEMA,
            "device": cfg.device_id,
            "boot_id": parts.boot_id,
            "ts": iso(time.time()),
            "uptime_s": round(now - parts.started, 1),
            "cameras": cams,
            "inference": {
                "backend": parts.backend_name,
                "model": package.ref,
                "swaps": parts.models.swaps,
                "batch": package.manifest.input.batch,
                "fps": round((st.rows - rows0) / dt_s, 2),
                "batches": st.batches,
                "rows": st.rows,
                "padded_rows": st.padded_rows,
                "batch_runs": {str(b): n for b, n in sorted(st.by_batch.items())},  # batches run per fixed batch
                "errors": st.errors,
                "infer_ms": st.infer_ms.percentiles(),
                "capture_to_result_ms": st.capture_to_result_ms.percentiles(),
            },
            "mqtt": parts.publisher.stats(),
            "memory": memory,
            "governor": gov,
            "sensors": sensors,
            "ota": parts.ota.stats() if parts.ota is not None else None,
            **({"config": remote} if remote.get("versions") else {}),  # only with documents in force
            **({"clips": self.clips()} if self.clips is not None else {}),  # only where a camera records
            **({"uploads": self.uploads()} if self.uploads is not None else {}),
            **({"labelling": self.labelling()} if self.labelling is not None else {}),
            **({"stages": self.stages()} if self.stages is not None else {}),  # second-stage models (cascade/)
        }

    def summary(self, stop_reason: str, failure: str) -> RunSummary:
        """What the run did, once it has stopped and the publisher has given its last count."""
        st, p = self.parts.loop.stats, self.parts.publisher
        return RunSummary(
            st.rows,
            st.batches,
            process_memory_mb().get("peak_rss_mb", 0.0),
            time.monotonic() - self.parts.started,
            stop_reason,
            spooled=p.spooled,
            delivered=p.acked + p.sent_qos0,
            left_in_spool=p.left_in_spool,
            lost=p.spool.dropped + p.spool.dropped_unsaved + p.spool.lost + p.dropped_queue_full + p.oversized,
            failure=failure,
            events_dropped=self.parts.scenes.dropped,
        )

    def _model_bytes(self) -> int:
        active = self.parts.loop.active
        return active.backend.memory_bytes if active is not None else 0
