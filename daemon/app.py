"""Wiring: config in, components built, threads started, ordered shutdown.

    camera threads ──(latest-frame slots)──> inference thread ──(bounded queue)──> publisher thread
    main thread: signals, telemetry every `telemetry.interval_s`, the run's duration, shutdown

Shutdown order: stop the cameras, let the inference thread finish its batch, publish what is
queued (bounded wait), announce ``stopped``, disconnect, close the backend.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from paho.mqtt.properties import Properties
from pydantic import BaseModel, ConfigDict

from edged.errors import (
    BackendError,
    CaptureError,
    ConfigError,
    DecoderError,
    EdgedError,
    EngineLoadError,
    PackageError,
    PublishError,
    StateDirError,
)
from edged.models.package import Package, open_package
from edged.models.store import Store, crash_at_env_step

from .annotate import draw, fit_jpeg
from .backends import Backend, open_backend, tensorrt_unavailable_reason
from .capture import Camera, Throttle
from .commands import CommandError, Commands, NoArgs
from .config import Config, load_config
from .decoders import DecodeOptions, Decoder, build_decoder
from .governor import Governor, admit
from .inference import ActiveModel, InferenceLoop, Result, Window
from .ota import MAX_OFFER_BYTES, OfferArgs, OtaReceiver
from .preprocess import Preprocessor
from .publish import MAX_PAYLOAD_BYTES, Publisher, iso
from .sensors import Sensors
from .spool import Spool
from .startup import Signals, StateLock, StoppedBeforeStart
from .swap import ModelManager, check_io, estimate_mb
from .systemd import Watchdog, monotonic_usec, notify, set_log_model

logger = logging.getLogger(__name__)

TELEMETRY_SCHEMA = "edged.telemetry/1"
SNAPSHOT_MIN_INTERVAL_S = 2.0
# A start that fails with one of these was not the model's doing: a model on probation is not blamed.
NOT_THE_MODEL: tuple[type[BaseException], ...] = (
    ConfigError,
    StateDirError,
    CaptureError,
    PublishError,
    StoppedBeforeStart,
    KeyboardInterrupt,
)
# What verifying the store's `current` raises when its files are damaged on disk (it is rolled back).
CORRUPT_CODES = frozenset({"hash_mismatch", "size_mismatch", "file_missing", "not_a_package", "manifest_invalid"})
RESTART_KEYS = ("device_id", "state_dir", "mqtt", "spool", "model", "cameras", "inference", "ota", "groups")


class SnapshotArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    camera: str


def resolve_package(cfg: Config) -> Package:
    """model.package (folder or tar), or model.name from the store: <state_dir>/models/<name>/current."""
    if cfg.model.package is not None:
        staging = cfg.state_dir / "staging"
        if cfg.model.package.is_file():
            staging.mkdir(parents=True, exist_ok=True)
        return open_package(cfg.model.package, scratch=staging)
    assert cfg.model.name is not None  # the config validator guarantees one of the two
    current = cfg.state_dir / "models" / cfg.model.name / "current"
    if not current.exists():
        raise PackageError(f"model.name {cfg.model.name!r}: no {current} in the model store", code="not_found")
    return open_package(current)


def _memory_mb() -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss_mb" if line.startswith("VmRSS") else "peak_rss_mb"
                    out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


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


class Daemon:
    def __init__(
        self,
        cfg: Config,
        backend: Backend | None = None,
        config_path: Path | None = None,
        signals: Signals | None = None,
        lock: StateLock | None = None,
    ) -> None:
        """`backend`: an already open backend for the package (benchmarks pass a stand-in); else one is opened.
        `config_path`: the file `reload` (the command, or SIGHUP) reads again. `signals`: handlers already
        installed (`edged run` installs them first thing), so a stop during start-up is a clean one.
        `lock`: the state directory's lock, when the caller took it; else it is taken here, before anything
        in the state directory is touched (StateDirError when another daemon holds it)."""
        self.cfg = cfg
        self.config_path = config_path
        self.boot_id = uuid.uuid4().hex
        self.signals = signals
        self.stop_event = signals.stop if signals is not None else threading.Event()
        self.cond = threading.Condition()
        self.started = time.monotonic()
        self.lock = lock or StateLock(cfg.state_dir)
        self.store: Store | None = None
        self._marked: str | None = None  # the model whose probation marker this run wrote
        self.restart_reason = ""  # set when the daemon stops for systemd to start it again
        try:
            self._start(backend)
        except BaseException as exc:
            self._start_failed(exc)
            raise
        if signals is not None:
            signals.on_stop(self.request_stop)

    def _start(self, backend: Backend | None) -> None:
        """Start-up work that no model can cause to fail comes first (state directory, store, spool); the
        probation marker is written just before the model is opened (see `_judge_crashes`)."""
        cfg = self.cfg
        shutil.rmtree(cfg.state_dir / "staging", ignore_errors=True)  # scratch, wiped at start
        self._start_events: list[dict[str, Any]] = []  # what happened before the publisher was there
        if cfg.model.name is not None:
            self.store = Store(cfg.state_dir, keep=cfg.model.keep_versions)
            for line in self.store.recover():
                logger.warning("model store: %s", line)
        self.spool = Spool(cfg.state_dir / "spool.db", int(cfg.spool.max_mb * 2**20), cfg.spool.max_age_s)
        if self.stop_event.is_set():  # a SIGTERM during the work above: no model opened, nothing to blame
            raise StoppedBeforeStart("stop requested before the model was opened")
        if cfg.model.name is not None:
            self._judge_crashes(cfg.model.name)
        try:
            package, backend, decoder = self._open_model(backend)
        except (EngineLoadError, DecoderError, PackageError) as exc:
            if not self._rollback_unloadable(exc):
                raise
            package, backend, decoder = self._open_model(None)
        m = package.manifest
        self.backend_name = backend.name
        d = cfg.detection
        self.opts = DecodeOptions(d.score_threshold, d.iou_threshold, d.max_detections, frozenset(d.labels))
        self.throttle = Throttle()
        self.cameras = [
            Camera(c, Preprocessor(m.input), self.cond, self.stop_event, throttle=self.throttle) for c in cfg.cameras
        ]
        self.cam_latency = {c.name: Window() for c in cfg.cameras}
        self.commands = Commands(cfg.topic_root, self._reply)
        self.loop = InferenceLoop(
            self.cameras,
            ActiveModel(backend, decoder, m.name, m.version),
            m.input,
            self.opts,
            cfg.inference.max_wait_ms / 1000.0,
            self._on_result,
            self.cond,
            self.stop_event,
        )
        self.models = ModelManager(
            cfg,
            self.store,
            self.loop,
            package,
            self.boot_id,
            lambda pkg: _open_model_backend(self.cfg, pkg),
            self._event,
            lambda doc: self.publisher.set_retained("model/state", doc),
            lambda: _memory_mb().get("rss_mb", 0.0),
            restart=self._restart,
        )
        self.publisher = Publisher(
            cfg.mqtt,
            cfg.spool,
            self.spool,
            cfg.device_id,
            cfg.topic_root,
            self.boot_id,
            self._status_extra,
            on_command=self.commands.on_message,
            on_event=self._event,
        )
        self.last_dets: dict[str, list[dict[str, Any]]] = {}
        self._last_snapshot: dict[str, float] = {}
        self._reload_lock = threading.Lock()
        self.commands.register("status", NoArgs, self._cmd_status, idempotent=True)
        self.commands.register("snapshot", SnapshotArgs, self._cmd_snapshot, idempotent=False)
        self.commands.register("reload", NoArgs, lambda _: self.reload(), idempotent=False)
        self.commands.register("pause", NoArgs, lambda _: self._cmd_pause(True), idempotent=True)
        self.commands.register("resume", NoArgs, lambda _: self._cmd_pause(False), idempotent=True)
        self.commands.register("rollback", NoArgs, lambda _: self._cmd_rollback(), idempotent=False)
        self.ota: OtaReceiver | None = None
        if self.store is not None and cfg.ota.enabled:
            self.ota = OtaReceiver(
                cfg.ota,
                self.store,
                cfg.model.keys_dir,
                lambda t, b, q, r: self.publisher.publish_direct(t, b, qos=q, retain=r),
                self.publisher.topic,
                self.models.install_staged,
                self.models.rejected,
                self.stop_event,
            )
            self.commands.register("ota", OfferArgs, self.ota.offer, idempotent=False, max_bytes=MAX_OFFER_BYTES)
            self.publisher.route("ota/data", self.ota.on_data)
        else:
            why = (
                "ota.enabled is false"
                if self.store is not None
                else "it runs model.package, not the store (model.name)"
            )
            self.commands.register(
                "ota", OfferArgs, lambda _: self._no_ota(why), idempotent=False, max_bytes=MAX_OFFER_BYTES
            )
        # the broker drops anything bigger than the largest message we take (the MQTT Maximum Packet Size)
        self.publisher.max_incoming_bytes = max(
            self.commands.max_bytes(), self.ota.max_message_bytes if self.ota else 0
        )
        self._last_tel = (time.monotonic(), 0, {c.name: 0 for c in self.cameras})
        self._last_status_fps = 0.0
        self.stop_reason = ""
        self.failure = ""
        self.governor: Governor | None = None
        if cfg.governor.enabled:
            sensors = Sensors(cfg.governor.sysfs_root)
            self.governor = Governor(cfg.governor, cfg.memory, sensors, self.throttle, self._event, self._fatal)

    @property
    def package(self) -> Package:
        """The package serving now (it changes with a swap)."""
        return self.models.package

    def _open_model(self, backend: Backend | None) -> tuple[Package, Backend, Decoder]:
        """The configured package, its backend (unless given), its decoder, admitted to the memory budget."""
        cfg = self.cfg
        package = resolve_package(cfg)
        m = package.manifest
        in_use_mb = _memory_mb().get("rss_mb", 0.0)
        row_mb = int(np.prod(m.input.shape[1:])) * np.dtype(m.input.dtype).itemsize / 2**20
        buffers_mb = row_mb * (3 * len(cfg.cameras) + m.input.batch)
        model_mb = estimate_mb(package)  # weights, I/O and activations: refused before anything is loaded
        admit(package.ref, model_mb, buffers_mb, in_use_mb, cfg.memory.budget_mb)
        backend = backend or _open_model_backend(cfg, package)
        try:
            check_io(package, backend)
            shapes = {o.name: o.shape for o in backend.outputs}
            decoder = build_decoder(m.decoder, m.input, m.labels, shapes)
            loaded_mb = max(model_mb, backend.memory_bytes / 2**20)  # an engine's device memory, as loaded
            admit(package.ref, loaded_mb, buffers_mb, in_use_mb, cfg.memory.budget_mb)
        except Exception:
            backend.close()
            raise
        return package, backend, decoder

    def _rollback_unloadable(self, exc: EdgedError) -> bool:
        """The store's current version cannot be opened: roll back to `previous` at once (no crash loop) and
        say so; False when that does not apply and the error stands. A current version whose files fail
        their sizes or hashes is rolled back whether or not it is on probation (`current_corrupt`: the
        intact previous serves rather than no model at all); one that verifies but does not load only while
        it is on probation (`load_failed`: a committed model has nothing older to blame)."""
        name = self.cfg.model.name
        if self.store is None or name is None:
            return False
        cur = self.store.pointer(name, "current")
        if cur is None:
            return False
        if isinstance(exc, PackageError) and exc.code in CORRUPT_CODES:
            return self._rollback_at_start(name, f"{name}@{cur} is corrupt on disk: {exc}", "current_corrupt")
        if self.store.state(name).pending != cur:
            return False
        return self._rollback_at_start(name, f"{name}@{cur} does not load: {exc}", "load_failed")

    def _rollback_at_start(self, name: str, reason: str, code: str) -> bool:
        """Roll the store back before anything is loaded; the event goes out once the publisher runs."""
        if self.store is None:
            raise ValueError("no model store")
        try:
            was, now = self.store.rollback(name, reason)
        except PackageError as exc:
            logger.error("model %s: %s, but it cannot be rolled back: %s", name, reason, exc)
            return False
        self._marked = None  # the rollback ended the probation, marker and all
        logger.error("model %s@%d rolled back to %d at start: %s", name, was, now, reason)
        self._start_events.append(
            {
                "type": "model_rolled_back",
                "model": {"name": name, "version": was},
                "to": now,
                "reason": reason,
                "code": code,
            }
        )
        return True

    def _judge_crashes(self, name: str) -> None:
        """Write the probation marker, just before the model is opened, and judge the crashes it counts.

        The marker (state.json `probation_boot`) says "a run is judging the version on probation". It is
        written only here, after the start-up work no model can make fail (lock, state directory, store
        recovery, spool), and cleared by every end the model did not cause: a clean stop, a SIGTERM or
        SIGINT in any phase (during the load or the warm-up too), a start that fails with a typed error
        that is not the model's (`NOT_THE_MODEL`). A run that leaves it behind died with the model loaded
        or loading (a SIGKILL, the OOM killer, a segfault in the runtime, the watchdog, an unexpected
        exception): the next run to reach this point counts that as a crash. A start refused earlier (a
        bad config, the lock held by another daemon, an unwritable state directory, a corrupt spool)
        never gets here, so it neither counts nor clears an earlier run's crash.

        A version on probation whose daemon died more than model.probation_max_crashes times is rolled
        back before it is loaded again (a crash loop never reaches the probation check)."""
        if self.store is None:
            raise ValueError("no model store")
        st = self.store.state(name)
        if st.pending is None or st.pending != self.store.pointer(name, "current"):
            return
        crashes = self.store.probation_run(name, self.boot_id)
        self._marked = name
        # test seam: a crash loop the daemon cannot judge itself (it counts, then dies before it can act;
        # edged-rollback.service, run by OnFailure=, finds the evidence and rolls back)
        crash_at_env_step("probation_start")
        limit = self.cfg.model.probation_max_crashes
        if crashes <= limit:
            if crashes:
                logger.warning(
                    "model %s@%d: %d crash(es) on probation (%d tolerated)", name, st.pending, crashes, limit
                )
            return
        reason = f"the daemon crashed {crashes} times while {name}@{st.pending} was on probation"
        self._rollback_at_start(name, reason, "probation_crashes")

    def _start_failed(self, exc: BaseException) -> None:
        """A start that ends in an error releases what it holds. The probation marker stays (a crash, at the
        next start) only when the model could have caused the failure."""
        if self._marked is not None and self.store is not None and isinstance(exc, NOT_THE_MODEL):
            logger.warning(
                "start failed for a reason that is not the model's (%s); not counted against %s on probation",
                getattr(exc, "code", type(exc).__name__),
                self._marked,
            )
            try:
                self.store.probation_run(self._marked, None)
            except StateDirError as clear_exc:
                logger.error("could not clear the probation marker: %s", clear_exc)
        spool = vars(self).get("spool")
        if isinstance(spool, Spool):
            spool.close()
        self.lock.release()

    # --- commands ------------------------------------------------------------------------------
    def _no_ota(self, why: str) -> dict[str, Any]:
        raise CommandError("not_supported", f"this device takes no pushed models: {why}")

    def _cmd_rollback(self) -> dict[str, Any]:
        """Serve the previous version, then roll the store back; a refusal (no previous, another input spec,
        does not load) changes neither, and the reply carries its code."""
        try:
            return self.models.rollback("rolled back by command", code="by_command")
        except EdgedError as exc:
            raise CommandError(exc.code, str(exc)) from exc

    def _reply(self, topic: str, payload: bytes, props: Properties | None) -> None:
        self.publisher.publish_direct(topic, payload, qos=1, properties=props)

    def _cmd_status(self, _: NoArgs) -> dict[str, Any]:
        self.publisher.publish_status("online")
        return {
            "state": "online",
            "boot_id": self.boot_id,
            "model": self.package.ref,
            "paused": self.throttle.paused,
            "level": self.governor.policy.level.label if self.governor else "off",
            "cameras": {c.name: c.stats.state for c in self.cameras},
            "spool_rows": self.spool.rows,
        }

    def _cmd_pause(self, pause: bool) -> dict[str, Any]:
        self.throttle.user_paused = pause
        logger.info("inference %s by command", "paused" if pause else "resumed")
        return {"paused": self.throttle.paused}

    def _cmd_snapshot(self, args: SnapshotArgs) -> dict[str, Any]:
        cam = next((c for c in self.cameras if c.name == args.camera), None)
        if cam is None:
            raise CommandError(
                "unknown_camera", f"no camera {args.camera!r}; cameras: {', '.join(c.name for c in self.cameras)}"
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
        topic = self.publisher.topic(f"snapshot/{cam.name}")
        if not self.publisher.publish_direct(topic, jpg.data, qos=0):
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

    def reload(self) -> dict[str, Any]:
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
            old = self.cfg
            d = new.detection
            self.loop.opts = DecodeOptions(d.score_threshold, d.iou_threshold, d.max_detections, frozenset(d.labels))
            if self.governor is not None:
                self.governor.policy.reconfigure(new.governor, new.memory)
            live = ["detection", "governor thresholds", "memory limits", "telemetry", "log_level"]
            restart = [k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k)]
            if self.governor is not None and (
                old.governor.enabled,
                old.governor.interval_s,
                old.governor.sysfs_root,
            ) != (new.governor.enabled, new.governor.interval_s, new.governor.sysfs_root):
                restart.append("governor.enabled/interval_s/sysfs_root")
            logging.getLogger().setLevel(new.log_level.upper())
            self.cfg = new.model_copy(update={k: getattr(old, k) for k in RESTART_KEYS})
            logger.info(
                "config reloaded from %s; restart needed for: %s", self.config_path, ", ".join(restart) or "nothing"
            )
            swapped = self._apply_store_current()
            notify(f"READY=1\nSTATUS={self.status_line()}")
            return {"applied": live, "restart_needed": restart, "model": swapped}

    def _apply_store_current(self) -> dict[str, Any] | None:
        """A reload also serves the store's `current` when `edged model install` changed it."""
        try:
            return self.models.apply_store_current()
        except (EdgedError, OSError) as exc:
            logger.error("reload: the store's current model was not taken: %s", exc)
            return {"error": {"code": getattr(exc, "code", "failed"), "message": str(exc)}}

    def _status_extra(self) -> dict[str, Any]:
        m = self.package.manifest
        return {"model": {"name": m.name, "version": m.version}, "groups": list(self.cfg.groups)}

    def _event(self, doc: dict[str, Any]) -> None:
        event = {
            "schema": "edged.event/1",
            "device": self.cfg.device_id,
            "boot_id": self.boot_id,
            "ts": iso(time.time()),
            **doc,
        }
        self.publisher.submit_event(event)
        if doc.get("type") in ("model_activated", "model_rolled_back"):
            set_log_model(self.package.ref)
            if self.publisher.connected:
                self.publisher.publish_status("online")  # the retained status names the model

    def _restart(self, reason: str) -> None:
        """Stop, for systemd to start the daemon again (exit 3): a probation rollback that cannot be done live
        (the previous version takes another input) has rolled the store back; the next start serves it."""
        logger.error("stopping for a restart: %s", reason)
        self.restart_reason = reason
        self.request_stop()

    def _fatal(self, reason: str) -> None:
        """The governor's hard stops (memory hard limit, critical temperature with action exit)."""
        if not self.stop_reason:
            logger.error("stopping: %s", reason)
            self.stop_reason = reason
        self.request_stop()

    def status_line(self) -> str:
        st = self.loop.stats
        m = self.package.manifest
        up = sum(1 for c in self.cameras if c.live)
        level = self.governor.policy.level.label if self.governor else "off"
        fps = self._last_status_fps
        return (
            f"{fps:.1f} fps, {up}/{len(self.cameras)} cameras up, batch {m.input.batch}, {self.package.ref} on "
            f"{self.backend_name}, broker {'up' if self.publisher.connected else 'down'}, thermal {level}, "
            f"spool {self.publisher.spool.rows}{'' if self.publisher.spool_state == 'ok' else ' (failing)'}, "
            f"{st.errors} errors"
        )

    def _on_result(self, r: Result) -> None:
        self.cam_latency[r.camera].add(r.capture_to_result_ms)
        self.last_dets[r.camera] = [d.to_json() for d in r.detections]
        self.publisher.submit(r)

    def _reload_in_background(self) -> None:
        """SIGHUP once ready: reload off the main thread (which keeps ticking the watchdog)."""
        threading.Thread(target=self._reload_logged, name="reload", daemon=True).start()

    def _reload_logged(self) -> None:
        try:
            self.reload()
        except CommandError as exc:
            logger.error("SIGHUP: config not reloaded, the running one stays: %s", exc)

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        if signum is not None:
            logger.info("received %s: stopping", signal.Signals(signum).name)
        self.stop_event.set()
        with self.cond:
            self.cond.notify_all()

    def telemetry(self) -> dict[str, Any]:
        now = time.monotonic()
        t0, rows0, frames0 = self._last_tel
        dt_s = max(1e-6, now - t0)
        st = self.loop.stats
        cams = {}
        for c in self.cameras:
            s = c.stats
            cams[c.name] = {
                "state": s.state,
                "fps": round((s.frames - frames0.get(c.name, 0)) / dt_s, 2),
                "frames": s.frames,
                "drops": s.drops,
                "reconnects": s.reconnects,
                "stalls": s.stalls,
                "errors": s.errors,
                "capture_to_result_ms": self.cam_latency[c.name].percentiles(),
            }
            if s.last_error:
                cams[c.name]["last_error"] = s.last_error
        self._last_tel = (now, st.rows, {c.name: c.stats.frames for c in self.cameras})
        self._last_status_fps = (st.rows - rows0) / dt_s
        p = self.publisher
        gov: dict[str, Any] = self.governor.telemetry() if self.governor else {"level": "off"}
        memory: dict[str, Any] = {
            **_memory_mb(),
            "model_mb": round(self._model_bytes() / 2**20, 1),
            "budget_mb": self.cfg.memory.budget_mb,
            "rss_slope_mb_per_min": gov.pop("rss_slope_mb_per_min", None),
        }
        sensors: dict[str, Any] = gov.pop("sensors", {})
        for key in ("mem_available_mb", "nvmap_mb"):
            if key in sensors:
                memory[key] = sensors.pop(key)
        return {
            "schema": TELEMETRY_SCHEMA,
            "device": self.cfg.device_id,
            "boot_id": self.boot_id,
            "ts": iso(time.time()),
            "uptime_s": round(now - self.started, 1),
            "cameras": cams,
            "inference": {
                "backend": self.backend_name,
                "model": self.package.ref,
                "swaps": self.models.swaps,
                "batch": self.package.manifest.input.batch,
                "fps": round((st.rows - rows0) / dt_s, 2),
                "batches": st.batches,
                "rows": st.rows,
                "padded_rows": st.padded_rows,
                "errors": st.errors,
                "infer_ms": st.infer_ms.percentiles(),
                "capture_to_result_ms": st.capture_to_result_ms.percentiles(),
            },
            "mqtt": p.stats(),
            "memory": memory,
            "governor": gov,
            "sensors": sensors,
            "ota": self.ota.stats() if self.ota is not None else None,
        }

    def run(self, duration_s: float | None = None, install_signals: bool = True) -> RunSummary:
        """Warm up, serve until stopped, shut down. `install_signals`: install the SIGTERM / SIGINT / SIGHUP
        handlers here unless the constructor was given them (main thread only)."""
        if install_signals and self.signals is None:
            self.signals = Signals(self.stop_event)
            self.signals.install()
            self.signals.on_stop(self.request_stop)
        m = self.package.manifest
        warm_ms = self._warm_up()
        if warm_ms is None:
            return self._stop_before_ready()
        logger.info(
            "model %s loaded on %s, batch %d, warm-up batch %.1f ms",
            self.package.ref,
            self.backend_name,
            m.input.batch,
            warm_ms,
        )
        self.commands.start()
        self.publisher.start()
        for ev in self._start_events:
            self._event(ev)
        self.models.publish_state()
        if self.ota is not None:
            self.ota.resume()
        for c in self.cameras:
            c.start()
        self.loop.start()
        if self.governor is not None:
            self.governor.start()
        logger.info(
            "serving %d camera(s) as %s; results on %s/results/<camera>",
            len(self.cameras),
            self.cfg.device_id,
            self.cfg.topic_root,
        )
        # Ready once the model is loaded and warm: cameras and the broker never gate it (their state is
        # in STATUS= and telemetry), so a camera down at boot cannot make systemd restart a healthy daemon.
        set_log_model(self.package.ref)
        notify(f"READY=1\nSTATUS={self.status_line()}")
        if self.signals is not None:
            self.signals.ready(self._reload_in_background)  # SIGHUP reloads from now on
        watchdog = Watchdog()
        deadline = None if duration_s is None else self.started + duration_s
        next_tel = time.monotonic() + self.cfg.telemetry.interval_s
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                healthy, why = self._health(now, watchdog.stall_s)
                watchdog.tick(now, healthy, why)
                if deadline is not None and now >= deadline:
                    logger.info("run duration of %.0f s reached: stopping", duration_s)
                    break
                if self.loop.all_ended() and not self._frames_waiting():
                    logger.info("every camera has ended: stopping")
                    break
                if not self.loop.alive:
                    logger.error("the inference thread died: stopping")
                    break
                if self.publisher.thread_died:
                    # Its in-memory state (uncommitted messages, what is in flight) is what a bug left
                    # half-done; a new process rebuilds it from the durable spool. Exit non-zero: systemd
                    # restarts us (Restart=on-failure), which shows as a failure, not a silent restart.
                    self.failure = f"the publisher thread died: {self.publisher.failure}"
                    logger.error("%s; stopping so that systemd restarts the daemon", self.failure)
                    break
                if not self.publisher.network_alive():
                    self.publisher.restart_network()
                self.models.check_probation(now)
                if now >= next_tel:
                    self.lock.check()  # a state directory deleted while running: the lock is taken again
                    self.publisher.publish_json("telemetry", self.telemetry(), qos=0, retain=True)
                    notify(f"STATUS={self.status_line()}")
                    next_tel = now + self.cfg.telemetry.interval_s
                self.stop_event.wait(min(0.25, max(0.01, next_tel - now)))
        finally:
            self.shutdown()
        p = self.publisher
        return RunSummary(
            self.loop.stats.rows,
            self.loop.stats.batches,
            _memory_mb().get("peak_rss_mb", 0.0),
            time.monotonic() - self.started,
            self.stop_reason,
            spooled=p.spooled,
            delivered=p.acked + p.sent_qos0,
            left_in_spool=p.left_in_spool,
            lost=p.spool.dropped + p.spool.dropped_unsaved + p.spool.lost + p.dropped_queue_full + p.oversized,
            failure=self.failure,
        )

    def _warm_up(self) -> float | None:
        """Warm-up batches, one at a time: a stop request ends it at the next batch boundary (None)."""
        n = self.cfg.inference.warmup_batches
        logger.info("model %s loaded on %s; warming up (%d batches)", self.package.ref, self.backend_name, n)
        notify(f"STATUS=warming up {self.package.ref} ({n} batches)")
        ms = 0.0
        for done in range(n):
            if self.stop_event.is_set():
                logger.info("stop requested during the warm-up (%d of %d batches done)", done, n)
                return None
            ms = self.loop.warm_up(1)
        return None if self.stop_event.is_set() else ms

    def _stop_before_ready(self) -> RunSummary:
        """A stop before READY=1 (a SIGTERM during the model load or the warm-up): nothing was started, so
        close the model, the spool and the lock; the probation marker goes too (this is no crash)."""
        notify("STOPPING=1\nSTATUS=stopping before ready")
        self.models.close()
        active = self.loop.active
        if active is not None:
            active.backend.close()
        self.spool.close()
        self.lock.release()
        logger.info("stopped cleanly before serving")
        return RunSummary(
            0,
            0,
            _memory_mb().get("peak_rss_mb", 0.0),
            time.monotonic() - self.started,
            self.stop_reason,
            left_in_spool=self.spool.rows,  # from an earlier run: sent at the next start
        )

    def _health(self, now: float, stall_s: float) -> tuple[bool, str]:
        """The watchdog's question: are the inference loop, the publisher and the MQTT network threads
        making progress?"""
        stalled = now - self.loop.stats.last_progress
        if stalled > stall_s:
            return False, f"the inference loop has made no progress for {stalled:.1f} s"
        if not self.publisher.network_alive():
            return False, "the MQTT network thread is not making progress"
        return self.publisher.alive(now, stall_s)

    def _frames_waiting(self) -> bool:
        with self.cond:
            return any(c.has_ready_locked() for c in self.cameras)

    def shutdown(self) -> None:
        notify("STOPPING=1\nSTATUS=stopping")
        self.request_stop()
        if self.governor is not None:
            self.governor.stop()
        for c in self.cameras:
            c.join(5.0)
        self.loop.join(10.0)
        try:
            self.publisher.publish_json("telemetry", self.telemetry(), qos=0, retain=True)
        finally:
            self.commands.stop()
            self.models.close()
            self.publisher.stop()
            active = self.loop.active
            if active is not None:
                active.backend.close()
            self.lock.release()
        logger.info("stopped cleanly")

    def _model_bytes(self) -> int:
        active = self.loop.active
        return active.backend.memory_bytes if active is not None else 0


def default_log_level(cfg_level: str) -> int:
    env = os.environ.get("EDGED_LOG_LEVEL")
    return getattr(logging, (env or cfg_level).upper(), logging.INFO)


def _open_model_backend(cfg: Config, pkg: Package) -> Backend:
    m = pkg.manifest
    if cfg.model.build_on_device and m.kind == "onnx":
        reason = tensorrt_unavailable_reason()
        if reason:
            raise BackendError(f"model.build_on_device is set, but {reason}")
        from .backends.tensorrt import TensorRTBackend, cached_engine

        def progress(msg: str) -> None:
            logger.info("%s", msg)
            notify("EXTEND_TIMEOUT_USEC=120000000")  # a build takes minutes; keep systemd's start timeout away

        precision = cfg.model.build_precision or ("int8" if m.precision == "int8" else "fp16")
        notify("STATUS=building a TensorRT engine for this device (first start only)")
        engine, compatibility = cached_engine(
            pkg.model_path, m.input.name, tuple(m.input.shape), precision, cfg.state_dir / "engines", progress
        )
        return TensorRTBackend(engine, compatibility, has_onnx=True)
    return open_backend(
        m.kind,
        pkg.model_path,
        cfg.model.backend,
        threads=cfg.model.onnxruntime.threads,
        providers=tuple(cfg.model.onnxruntime.providers),
        compatibility=m.compatibility,
        has_onnx="model.onnx" in m.files,
    )
