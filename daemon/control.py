"""The verbs the daemon executes on command. The channel (strict parsing, replies, expiry, one command at a
time) is commands.py; this is what each verb does to the running daemon.

    status     publish the retained status again; reply with a summary                    idempotent
    snapshot   one camera's last frame with its detections drawn, as a JPEG on
               ``…/snapshot/<camera>`` (at most one every SNAPSHOT_MIN_INTERVAL_S per camera)
    pause      stop offering frames to inference (the cameras keep reading); with
               {"camera": NAME}, that camera's only                                       idempotent
    resume     offer them again                                                           idempotent
    rollback   serve the previous version, then roll the store back
    reload     read the config file again (the remote overlay in force over it): apply what can change
               live, name what needs a restart (SIGHUP does the same, off the main thread)
    ota        an OTA offer (ota.py), or ``not_supported`` with the reason
    cancel     stop the running OTA transfer and drop its files (``edged push --cancel``)
    diagnose   doctor, the newest log lines, the config without secrets, spool and store, in parts
               (diagnose.py; ``edged diagnose``)
    clips      the clip store's list (record/store.py), newest first: camera, since, limit    idempotent
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from edged.errors import Code, ConfigError, EdgedError
from edged.protocol import topics
from edged.protocol.commands import CLIPS_VERB, DIAGNOSE_VERB, ClipsArgs
from edged.protocol.ota import CANCEL_VERB

from .capture.camera import Camera
from .config import Config, load_config
from .config.remote import load_with_overlay
from .delivery.commands import CommandError, Commands, NoArgs
from .delivery.publisher import MAX_PAYLOAD_BYTES, Publisher
from .diagnose import Diagnose, DiagnoseArgs
from .host.systemd import monotonic_usec, notify
from .inference import InferenceLoop, Result
from .lifecycle.ota import MAX_OFFER_BYTES, CancelArgs, OfferArgs, OtaReceiver
from .lifecycle.remote import RemoteConfig
from .parts import Parts
from .record.store import ClipStore, clips_reply
from .scene.draw import draw, fit_jpeg
from .scene.scenes import decode_options
from .telemetry import Telemetry

logger = logging.getLogger(__name__)

SNAPSHOT_MIN_INTERVAL_S = 2.0
# What a reload never changes in the running daemon: a change to one of these applies at the next start
# (cameras change live unless their names, their order or a max_frame_pixels changes).
RESTART_KEYS = (
    "device_id",
    "state_dir",
    "mqtt",
    "spool",
    "model",
    "stages",
    "inference",
    "ota",
    "groups",
    "homeassistant",
    "health",
    "remote_config",
    "clips",
)


class SnapshotArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    camera: str


class ResumeArgs(BaseModel):
    """`resume`: the whole daemon, or with `camera` that camera alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    camera: str | None = None


class PauseArgs(ResumeArgs):
    """`pause`: as `resume`; ``"paused": false`` resumes (Home Assistant's switch sends both to one topic)."""

    paused: bool = True


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
        self._reload_lock = threading.RLock()
        # the remote overlay in force (lifecycle/remote.py), merged over the file at each reload; None: none
        self.overlay: Callable[[], dict[str, Any]] | None = None
        self.on_event: Callable[[dict[str, Any]], None] | None = None  # object events a scene swap ends
        self.clips: ClipStore | None = None  # the clip store, where a camera records (app.py sets it)

    def register(self, commands: Commands, ota: OtaReceiver | None) -> None:
        """Every verb on `commands`; `ota`: the receiver of pushed models, None where this daemon takes none."""
        commands.register("status", NoArgs, self.status, idempotent=True)
        commands.register("snapshot", SnapshotArgs, self.snapshot, idempotent=False)
        commands.register("reload", NoArgs, self.reload, idempotent=False)
        commands.register("pause", PauseArgs, self.pause, idempotent=True)
        commands.register("resume", ResumeArgs, self.resume, idempotent=True)
        commands.register("rollback", NoArgs, self.rollback, idempotent=False)
        offer = ota.offer if ota is not None else self._no_ota
        commands.register("ota", OfferArgs, offer, idempotent=False, max_bytes=MAX_OFFER_BYTES)
        commands.register(CANCEL_VERB, CancelArgs, ota.cancel if ota is not None else self._no_ota, idempotent=False)
        # doctor, the newest log lines, the config in force without secrets, spool and store, in parts (diagnose.py)
        commands.register(DIAGNOSE_VERB, DiagnoseArgs, Diagnose(self.parts).run, idempotent=False)
        commands.register(CLIPS_VERB, ClipsArgs, self.clips_list, idempotent=True)

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
            "paused_cameras": sorted(p.throttle.paused_cameras),
            "level": p.governor.policy.level.label if p.governor else "off",
            "cameras": {c.name: c.stats.state for c in p.cameras},
            "spool_rows": p.publisher.spool.rows,
        }

    def pause(self, args: PauseArgs | None = None) -> dict[str, Any]:
        return self._pause(args.paused if args is not None else True, args.camera if args is not None else None)

    def resume(self, args: ResumeArgs | None = None) -> dict[str, Any]:
        return self._pause(False, args.camera if args is not None else None)

    def _pause(self, pause: bool, camera: str | None = None) -> dict[str, Any]:
        throttle = self.parts.throttle
        if camera is not None:
            names = [c.name for c in self.parts.cameras]
            if camera not in names:
                raise CommandError("unknown_camera", f"no camera {camera!r}; cameras: {', '.join(names)}")
            # replaced, never changed in place: the camera threads and /readyz read it without a lock
            was = throttle.paused_cameras
            throttle.paused_cameras = was | {camera} if pause else was - {camera}
            logger.info("camera %s %s by command", camera, "paused" if pause else "resumed")
            return {"camera": camera, "paused": camera in throttle.paused_cameras or throttle.paused}
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

    def clips_list(self, args: ClipsArgs) -> dict[str, Any]:
        """`clips`: the stored clips' sidecars (record/store.py), newest first."""
        if self.clips is None:
            raise CommandError("not_supported", "this device records no clips: no camera with record: has a ring")
        return clips_reply(self.clips, args)

    def _no_ota(self, _: OfferArgs | CancelArgs) -> dict[str, Any]:
        why = (
            "ota.enabled is false"
            if self.parts.host.cfg.model.name is not None
            else "it runs model.package, not the store (model.name)"
        )
        raise CommandError("not_supported", f"this device takes no pushed models: {why}")

    # --- reload ----------------------------------------------------------------------------------
    def reload(self, _: NoArgs | None = None) -> dict[str, Any]:
        """Read the config file again (with the remote overlay in force over it: `overlay`); apply what can
        change live, name what needs a restart."""
        if self.config_path is None:
            raise CommandError("not_supported", "this daemon was not started from a config file")
        with self._reload_lock:
            notify(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=reloading the config")
            try:
                overlay = self.overlay() if self.overlay is not None else {}
                new = load_with_overlay(self.config_path, overlay) if overlay else load_config(self.config_path)
            except ConfigError as exc:
                notify(f"READY=1\nSTATUS=config reload refused, running on the old one: {exc}")
                raise CommandError("config_invalid", str(exc)) from exc
            out = self._apply(new, f"config reloaded from {self.config_path}")
            out["model"] = self._apply_store_current()
            notify(f"READY=1\nSTATUS={self.telemetry.status_line()}")
            return out

    def apply(self, new: Config, why: str) -> dict[str, Any]:
        """Put `new` in force as a reload does (a remote document's config, or the last good one back)."""
        with self._reload_lock:
            out = self._apply(new, why)
            notify(f"STATUS={self.telemetry.status_line()}")
            return out

    def _apply(self, new: Config, why: str) -> dict[str, Any]:
        """What can change live: detection settings, each camera's scene (detection, zones, masks, tracking,
        publish, motion) and its source (a camera whose uri, fps_max or other capture key changed reopens);
        the governor's thresholds, memory limits, telemetry, log level. The rest is named as needing a restart."""
        p = self.parts
        host, governor = p.host, p.governor
        old = host.cfg
        names = [c.name for c in old.cameras]
        cameras_live = [c.name for c in new.cameras] == names and all(
            a.max_frame_pixels == b.max_frame_pixels for a, b in zip(old.cameras, new.cameras, strict=True)
        )
        cameras = new.cameras if cameras_live else old.cameras
        p.loop.opts = decode_options(new.detection, cameras)
        ended = p.scenes.reconfigure(new.detection, cameras)
        reopened = []
        for cam, c in zip(p.cameras, cameras, strict=True):
            # the frames inference took stay kept for whoever reads them: event crops, the live view, labelling,
            # the second stages' crops and a running shadow evaluation
            staged = any(s.cameras is None or cam.name in s.cameras for s in old.stages)
            cam.keep_taken = (
                p.scenes.crops(cam.name)
                or old.health.live_view
                or old.labelling.sampling
                or staged
                or p.models.shadow is not None
            )
            if cam.cfg.model_copy(update={"detection": None}) != c.model_copy(update={"detection": None}):
                cam.reconfigure(c)
                reopened.append(cam.name)
            else:
                cam.cfg = c
        if self.on_event is not None:
            for ev in ended:
                self.on_event(ev)
        if governor is not None:
            governor.policy.reconfigure(new.governor, new.memory)
        live = ["detection", "cameras' scenes", "governor thresholds", "memory limits", "telemetry", "log_level"]
        restart = [k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k)]
        if not cameras_live:
            restart.append("cameras (names, order or max_frame_pixels)")
        if governor is not None and (
            old.governor.enabled,
            old.governor.interval_s,
            old.governor.sysfs_root,
        ) != (new.governor.enabled, new.governor.interval_s, new.governor.sysfs_root):
            restart.append("governor.enabled/interval_s/sysfs_root")
        logging.getLogger().setLevel(new.log_level.upper())
        host.cfg = new.model_copy(update={"cameras": cameras, **{k: getattr(old, k) for k in RESTART_KEYS}})
        logger.info(
            "%s; cameras reopened: %s; restart needed for: %s",
            why,
            ", ".join(reopened) or "none",
            ", ".join(restart) or "nothing",
        )
        return {"applied": live, "reopened": reopened, "restart_needed": restart}

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


class Serving(Protocol):
    """What the readiness after a remote config document reads (the daemon)."""

    cfg: Config
    cameras: list[Camera]
    loop: InferenceLoop


def remote_config(cfg: Config, path: Path, publisher: Publisher, stop: threading.Event, host: Serving) -> RemoteConfig:
    """The receiver of signed config documents (lifecycle/remote.py), subscribed to the device's document and
    its groups' at every connect; ready after an apply: every camera up (or at the end of its file), a batch
    served since, the broker connected."""

    def ready(before: int) -> str:
        down = [f"camera {c.name}: {c.stats.state} ({c.stats.last_error or 'no frame yet'})"
                for c in host.cameras if c.stats.state not in ("up", "ended")]  # fmt: skip
        if down:
            return "; ".join(down)
        if host.loop.stats.batches <= before:
            return "no batch served since the change"
        return "" if publisher.connected else "the broker is not connected"

    remote = RemoteConfig(cfg, path, publisher, stop, lambda: host.cfg, lambda: host.loop.stats.batches, ready)

    def status_again() -> None:  # the retained status names the versions in force
        if publisher.connected:
            publisher.publish_status("online")

    remote.on_change = status_again
    prefix = cfg.mqtt.topic_prefix
    publisher.inbox.route_topic(topics.config_desired(cfg.topic_root), remote.on_message)
    for group in cfg.groups:
        publisher.inbox.route_topic(topics.config_group(prefix, group), remote.on_message)
    return remote
