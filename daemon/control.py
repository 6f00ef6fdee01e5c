"""The verbs the daemon executes on command. The channel (strict parsing, replies, expiry, one command at a
time) is commands.py; this is what each verb does to the running daemon.

    status     publish the retained status again; reply with a summary                    idempotent
    snapshot   one camera's last frame with its detections drawn, as a JPEG on
               ``…/snapshot/<camera>`` (at most one every SNAPSHOT_MIN_INTERVAL_S per camera)
    pause      stop offering frames to inference (the cameras keep reading)               idempotent
    resume     offer them again                                                           idempotent
    rollback   serve the previous version, then roll the store back
    reload     read the config file again: apply what can change live, name what needs a restart
               (SIGHUP does the same, off the main thread)
    ota        an OTA offer (ota.py), or ``not_supported`` with the reason
    cancel     stop the running OTA transfer and drop its files (``edged push --cancel``)
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from edged.errors import Code, ConfigError, EdgedError
from edged.protocol import topics
from edged.protocol.ota import CANCEL_VERB

from .config import load_config
from .decoders import DecodeOptions
from .delivery.commands import CommandError, Commands, NoArgs
from .delivery.publisher import MAX_PAYLOAD_BYTES
from .host.systemd import monotonic_usec, notify
from .inference import Result
from .lifecycle.ota import MAX_OFFER_BYTES, CancelArgs, OfferArgs, OtaReceiver
from .parts import Parts
from .scene.draw import draw, fit_jpeg
from .telemetry import Telemetry

logger = logging.getLogger(__name__)

SNAPSHOT_MIN_INTERVAL_S = 2.0
# What a reload never changes in the running daemon: a change to one of these applies at the next start.
RESTART_KEYS = (
    "device_id",
    "state_dir",
    "mqtt",
    "spool",
    "model",
    "cameras",
    "inference",
    "ota",
    "groups",
    "homeassistant",
    "health",
)


class SnapshotArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    camera: str


class Control:
    """The verbs of the module docstring, on the running parts. `parts.host` holds the config in force, which
    `reload` replaces; `telemetry`: its status line goes to systemd after a reload; `config_path`: the file
    `reload` reads again (None: reload is not supported)."""

    def __init__(self, parts: Parts, telemetry: Telemetry, config_path: Path | None) -> None:
        self.parts = parts
        self.telemetry = telemetry
        self.config_path = config_path
        self.last_dets: dict[str, list[dict[str, Any]]] = {}  # per camera: its last result's, for snapshots
        self._last_snapshot: dict[str, float] = {}
        self._reload_lock = threading.Lock()

    def register(self, commands: Commands, ota: OtaReceiver | None) -> None:
        """Every verb on `commands`; `ota`: the receiver of pushed models, None where this daemon takes none."""
        commands.register("status", NoArgs, self.status, idempotent=True)
        commands.register("snapshot", SnapshotArgs, self.snapshot, idempotent=False)
        commands.register("reload", NoArgs, self.reload, idempotent=False)
        commands.register("pause", NoArgs, self.pause, idempotent=True)
        commands.register("resume", NoArgs, self.resume, idempotent=True)
        commands.register("rollback", NoArgs, self.rollback, idempotent=False)
        offer = ota.offer if ota is not None else self._no_ota
        commands.register("ota", OfferArgs, offer, idempotent=False, max_bytes=MAX_OFFER_BYTES)
        commands.register(CANCEL_VERB, CancelArgs, ota.cancel if ota is not None else self._no_ota, idempotent=False)

    def record(self, r: Result) -> None:
        """A result's detections, which a snapshot of its camera draws."""
        self.last_dets[r.camera] = [d.to_json() for d in r.detections]

    # --- verbs -----------------------------------------------------------------------------------
    def status(self, _: NoArgs) -> dict[str, Any]:
        p = self.parts
        p.publisher.publish_status("online")
        return {
            "state": "online",
            "boot_id": p.boot_id,
            "model": p.models.package.ref,
            "paused": p.throttle.paused,
            "level": p.governor.policy.level.label if p.governor else "off",
            "cameras": {c.name: c.stats.state for c in p.cameras},
            "spool_rows": p.publisher.spool.rows,
        }

    def pause(self, _: NoArgs) -> dict[str, Any]:
        return self._pause(True)

    def resume(self, _: NoArgs) -> dict[str, Any]:
        return self._pause(False)

    def _pause(self, pause: bool) -> dict[str, Any]:
        self.parts.throttle.user_paused = pause
        logger.info("inference %s by command", "paused" if pause else "resumed")
        return {"paused": self.parts.throttle.paused}

    def rollback(self, _: NoArgs) -> dict[str, Any]:
        """Serve the previous version, then roll the store back; a refusal (no previous, another input spec,
        does not load) changes neither, and the reply carries its code."""
        try:
            return self.parts.models.rollback("rolled back by command", code=Code.BY_COMMAND)
        except EdgedError as exc:
            raise CommandError(exc.code, str(exc)) from exc

    def snapshot(self, args: SnapshotArgs) -> dict[str, Any]:
        cameras, publisher = self.parts.cameras, self.parts.publisher
        cam = next((c for c in cameras if c.name == args.camera), None)
        if cam is None:
            raise CommandError(
                "unknown_camera", f"no camera {args.camera!r}; cameras: {', '.join(c.name for c in cameras)}"
            )
        now = time.monotonic()
        if now - self._last_snapshot.get(cam.name, -1e9) < SNAPSHOT_MIN_INTERVAL_S:
            raise CommandError("rate_limited", f"at most one snapshot of a camera every {SNAPSHOT_MIN_INTERVAL_S:g} s")
        frame = cam.last_frame
        if frame is None:
            raise CommandError("no_frame", f"camera {cam.name!r} has no frame yet (state {cam.stats.state})")
        self._last_snapshot[cam.name] = now
        # a 4K frame's JPEG is over the message cap: lower the quality, then scale down, until it fits
        jpg = fit_jpeg(draw(frame, self.last_dets.get(cam.name, [])), MAX_PAYLOAD_BYTES)
        topic = topics.snapshot(publisher.root, cam.name)
        if not publisher.publish_direct(topic, jpg.data, qos=0):
            raise CommandError("not_sent", f"the snapshot ({len(jpg.data)} bytes) could not be published")
        return {
            "topic": topic,
            "bytes": len(jpg.data),
            "quality": jpg.quality,
            "scale": jpg.scale,
            "width": jpg.width,
            "height": jpg.height,
            "source": {"width": frame.shape[1], "height": frame.shape[0]},
            "detections": len(self.last_dets.get(cam.name, [])),
        }

    def _no_ota(self, _: OfferArgs | CancelArgs) -> dict[str, Any]:
        why = (
            "ota.enabled is false"
            if self.parts.host.cfg.model.name is not None
            else "it runs model.package, not the store (model.name)"
        )
        raise CommandError("not_supported", f"this device takes no pushed models: {why}")

    # --- reload ----------------------------------------------------------------------------------
    def reload(self, _: NoArgs | None = None) -> dict[str, Any]:
        """Read the config file again; apply what can change live, name what needs a restart."""
        if self.config_path is None:
            raise CommandError("not_supported", "this daemon was not started from a config file")
        with self._reload_lock:
            notify(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=reloading the config")
            try:
                new = load_config(self.config_path)
            except ConfigError as exc:
                notify(f"READY=1\nSTATUS=config reload refused, running on the old one: {exc}")
                raise CommandError("config_invalid", str(exc)) from exc
            host, governor = self.parts.host, self.parts.governor
            old = host.cfg
            d = new.detection
            self.parts.loop.opts = DecodeOptions(
                d.score_threshold, d.iou_threshold, d.max_detections, frozenset(d.labels)
            )
            if governor is not None:
                governor.policy.reconfigure(new.governor, new.memory)
            live = ["detection", "governor thresholds", "memory limits", "telemetry", "log_level"]
            restart = [k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k)]
            if governor is not None and (
                old.governor.enabled,
                old.governor.interval_s,
                old.governor.sysfs_root,
            ) != (new.governor.enabled, new.governor.interval_s, new.governor.sysfs_root):
                restart.append("governor.enabled/interval_s/sysfs_root")
            logging.getLogger().setLevel(new.log_level.upper())
            host.cfg = new.model_copy(update={k: getattr(old, k) for k in RESTART_KEYS})
            logger.info(
                "config reloaded from %s; restart needed for: %s", self.config_path, ", ".join(restart) or "nothing"
            )
            swapped = self._apply_store_current()
            notify(f"READY=1\nSTATUS={self.telemetry.status_line()}")
            return {"applied": live, "restart_needed": restart, "model": swapped}

    def _apply_store_current(self) -> dict[str, Any] | None:
        """A reload also serves the store's `current` when `edged model install` changed it."""
        try:
            return self.parts.models.apply_store_current()
        except (EdgedError, OSError) as exc:
            logger.error("reload: the store's current model was not taken: %s", exc)
            code = exc.code if isinstance(exc, EdgedError) else Code.FAILED
            return {"error": {"code": code, "message": str(exc)}}

    def reload_in_background(self) -> None:
        """SIGHUP once ready: reload off the main thread (which keeps ticking the watchdog)."""
        threading.Thread(target=self._reload_logged, name="reload", daemon=True).start()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except CommandError as exc:
            logger.error("SIGHUP: config not reloaded, the running one stays: %s", exc)
