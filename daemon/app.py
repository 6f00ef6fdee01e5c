"""Wiring: config in, components built, threads started, ordered shutdown.

    camera threads ──(latest-frame slots)──> inference thread ──(bounded queue)──> publisher thread
    main thread: the watchdog, probation, telemetry every `telemetry.interval_s`, the run's duration,
    shutdown (signals are taken by host/startup.py's `Signals`, installed before the config is read)

The rooms it wires: the model a start serves (lifecycle/loader.py), the command verbs (control.py, over the
channel in delivery/commands.py), telemetry and the status line (telemetry.py), swaps and probation
(lifecycle/manager.py). The surfaces (telemetry.py, control.py, health.py) read the running parts as one
object, `Parts` (parts.py). Threads and the shutdown order: docs/architecture.md, "Threads".
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from paho.mqtt.properties import Properties

from edged.errors import StoppedBeforeStart
from edged.models.package import Package
from edged.models.store import Store
from edged.protocol import topics
from edged.protocol.schemas import EVENT_SCHEMA

from .backends import Backend
from .capture.camera import Camera, Throttle, join_all
from .capture.preprocess import Preprocessor
from .cascade.pipeline import StagedResult, build_cascade, with_stage_outputs
from .cascade.swap import stage_swaps
from .config import Config
from .control import Control, remote_config
from .delivery.commands import Commands
from .delivery.homeassistant import HomeAssistant
from .delivery.publisher import Publisher, iso
from .delivery.spool import Spool
from .delivery.upload import build_uploader
from .diagnose import LogRing
from .health import HealthServer, Probe
from .host import affinity
from .host.governor import Governor
from .host.sensors import Sensors, process_memory_mb, rss_mb, trim_heap
from .host.startup import Signals, StateLock
from .host.systemd import Watchdog, notify, set_log_model
from .inference import ActiveModel, InferenceLoop, Result
from .lifecycle.loader import ModelLoader, Opened
from .lifecycle.manager import ModelManager
from .lifecycle.ota import OtaReceiver
from .lifecycle.ota.group_offer import GroupOffers
from .lifecycle.remote import RemoteConfig, startup_config
from .liveness import Liveness
from .liveview import LiveView, read_token
from .parts import Parts
from .record.build import build_labelling, clips_http
from .record.mux import write_mp4
from .record.planner import ClipPlanner, build_clips
from .scene.scenes import Scenes, decode_options
from .telemetry import RunSummary, Telemetry

logger = logging.getLogger(__name__)

# How long a run with a duration waits, once ready, for its first served batch (a camera that opens late, a
# slow first connection on a busy machine) before it stops and says so: generous, yet a script that runs
# `edged run --duration S` with every camera down still ends.
FIRST_BATCH_WAIT_S = 60.0
TRIM_EVERY_S = 60.0  # sensors.trim_heap: a few ms on a few hundred MB of heap, once a minute


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
        self.cfg = cfg  # the config in force: a reload replaces it (control.RESTART_KEYS stay as started)
        self.config_path = config_path
        self.log_ring = LogRing.install()  # the `diagnose` verb's newest log lines, scrubbed (daemon/diagnose.py)
        self.boot_id = uuid.uuid4().hex
        self.signals = signals
        self.stop_event = signals.stop if signals is not None else threading.Event()
        self.cond = threading.Condition()
        self.started = time.monotonic()
        self.lock = lock or StateLock(cfg.state_dir)
        self.store: Store | None = None
        self.loader = ModelLoader(cfg, self.boot_id)
        self.restart_reason = ""  # set when the daemon stops for systemd to start it again
        self.first_batch_s: float | None = None  # run(): seconds from the start to the first served batch
        self.served_s = 0.0  # run(): seconds from the first served batch to the stop
        self.unserved = ""  # run(): why a run with a duration stopped before serving any batch
        self.stop_reason = ""  # set when the governor stops the daemon (memory hard limit, critical heat)
        self.failure = ""  # set when a thread died and the daemon stops for systemd to restart it
        self.remote: RemoteConfig | None = None  # signed config documents (lifecycle/remote.py)
        self.clips: ClipPlanner | None = None  # clips from events (record/), where a camera records
        try:
            self._start(backend)
        except BaseException as exc:
            self._start_failed(exc)
            raise
        if signals is not None:
            signals.on_stop(self.request_stop)

    def _start(self, backend: Backend | None) -> None:
        """The start, step by step. Work that no model can cause to fail comes first; the probation marker is
        written just before the model is opened (`ModelLoader.open`). Nothing runs until `run()`."""
        self.cfg, self.remote_config_error = startup_config(self.cfg, self.config_path)  # stored documents
        self._open_state_dir()
        opened = self._open_model(backend)
        self._build_uploads(opened.package)
        self._build_frame_path(opened)
        self._build_model_manager(opened.package)
        self._build_delivery()
        self._held_events: dict[tuple[str, int], list[dict[str, Any]]] = {}  # a result's events, till its stages answer
        self.cascade = build_cascade(self.cfg, opened.package, self.cameras, self._staged)
        ota_status = self.ota.status if self.ota is not None else None  # a stage pushed alone (cascade/swap.py)
        self.models.stage_swaps = stage_swaps(self.cfg, self.store, self.cascade, self._event, ota_status, rss_mb)
        self._build_governor()
        self._build_surfaces()
        self._build_consumers()
        self._build_clips()
        if self.cascade is not None:  # the stages' counters in telemetry and on /metrics (cascade/)
            self.telemetry.stages = self.cascade.stats
            if self.health is not None:
                self.health.probe.stages = self.cascade.stats

    def _open_state_dir(self) -> None:
        """Staging wiped (scratch), the model store recovered (when the config names a model), the spool."""
        cfg = self.cfg
        shutil.rmtree(cfg.state_dir / "staging", ignore_errors=True)
        if cfg.model.name is not None:
            self.store = Store(cfg.state_dir, keep=cfg.model.keep_versions)
            for line in self.store.recover():
                logger.warning("model store: %s", line)
        self.spool = Spool(cfg.state_dir / "spool.db", int(cfg.spool.max_mb * 2**20), cfg.spool.max_age_s)

    def _open_model(self, backend: Backend | None) -> Opened:
        """The configured model, opened and admitted; a stop requested before it is opened blames no model."""
        if self.stop_event.is_set():  # a SIGTERM during the work above: no model opened, nothing to blame
            raise StoppedBeforeStart("stop requested before the model was opened")
        opened = self.loader.open(self.store, backend)
        self.backend_name = opened.backend.name
        return opened

    def _build_uploads(self, package: Package) -> None:
        """The uploader (with `upload:`) and the frames worth labelling (with `labelling.enabled`); started in run()."""
        self.uploader = build_uploader(self.cfg, self.stop_event)  # delivery/upload.py
        self.labelling = build_labelling(self.cfg, package.labels, self.uploader)  # record/build.py

    def _build_frame_path(self, opened: Opened) -> None:
        """Cameras (latest-frame slots), their scenes, and the inference loop that batches their frames."""
        cfg = self.cfg
        spec = opened.package.manifest.input
        opts = decode_options(cfg.detection, cfg.cameras)
        self.throttle = Throttle()
        self.cameras = [
            Camera(c, Preprocessor(spec), self.cond, self.stop_event, throttle=self.throttle) for c in cfg.cameras
        ]
        by_name = {c.name: c for c in self.cameras}
        self.scenes = Scenes(cfg.detection, cfg.cameras, lambda name, seq: by_name[name].frame_for(seq))
        for c in self.cameras:  # an event's crop is cut from its own frame, kept until its result is decoded
            c.keep_taken = self.scenes.crops(c.name) or cfg.health.live_view  # the live view draws on it too
            c.keep_taken = c.keep_taken or cfg.labelling.sampling  # near-threshold frames kept for labelling
        m = opened.package.manifest
        active = ActiveModel(opened.backend, opened.decoder, m.name, m.version)
        wait_s = cfg.inference.max_wait_ms / 1000.0
        self.loop = InferenceLoop(self.cameras, active, spec, opts, wait_s, self._on_result, self.cond, self.stop_event)

    def _build_model_manager(self, package: Package) -> None:
        """Swaps, rollbacks and probation of the model the loop serves."""
        self.models = ModelManager(
            self.cfg,
            self.store,
            self.loop,
            package,
            self.boot_id,
            self.loader.open_backend,
            self._event,
            self._publish_model_state,
            rss_mb,
            restart=self._restart,
            publish_shadow=lambda doc: self.publisher.set_retained(topics.SHADOW, doc),  # lifecycle/shadow.py
        )
        self.models.labels = self.labelling  # a shadowed candidate's disagreeing frames (lifecycle/shadow.py)

    def _build_delivery(self) -> None:
        """The command channel, the publisher (spool, broker session, inbox) and, with a model store and
        ota.enabled, the OTA receiver and the groups' retained offers. Nothing connects before `run()`."""
        cfg = self.cfg
        self.commands = Commands(cfg.topic_root, self._reply)
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
        self.ota: OtaReceiver | None = None
        self.group_offers: GroupOffers | None = None
        if self.store is not None and cfg.ota.enabled:
            self.ota = OtaReceiver(
                cfg.ota, self.store, cfg.model.keys_dir, self.publisher, self.models, self.stop_event
            )
            self.publisher.route("ota/data", self.ota.on_data)
            offers = self.group_offers = GroupOffers(self.ota, cfg.state_dir, self.stop_event)
            for group in cfg.groups:  # a rollout's retained offer to the group: taken when we connect
                self.publisher.inbox.route_topic(topics.group_offer(cfg.mqtt.topic_prefix, group), offers.on_message)
        if self.config_path is not None and cfg.remote_config.enabled:
            self.remote = remote_config(cfg, self.config_path, self.publisher, self.stop_event, self)

    def _build_governor(self) -> None:
        """Thermal, power and memory limits on the throttle, when governor.enabled."""
        cfg = self.cfg
        self.governor: Governor | None = None
        if cfg.governor.enabled:
            sensors = Sensors(cfg.governor.sysfs_root)
            self.governor = Governor(cfg.governor, cfg.memory, sensors, self.throttle, self._event, self._fatal)

    def _build_surfaces(self) -> None:
        """What reads the running parts: telemetry and the status line, and the command verbs (the largest
        payload a verb takes caps what the broker may send us)."""
        self.parts = Parts(
            host=self,
            boot_id=self.boot_id,
            started=self.started,
            backend_name=self.backend_name,
            cameras=self.cameras,
            throttle=self.throttle,
            scenes=self.scenes,
            loop=self.loop,
            models=self.models,
            publisher=self.publisher,
            governor=self.governor,
            ota=self.ota,
        )
        self.telemetry = Telemetry(self.parts)
        self.telemetry.uploads = self.uploader.stats if self.uploader is not None else None
        self.telemetry.labelling = self.labelling.stats if self.labelling is not None else None
        self.control = Control(self.parts, self.telemetry, self.config_path)
        self.control.register(self.commands, self.ota)
        self.control.on_event = self._event
        if self.remote is not None:
            self.control.overlay, self.remote.applier = self.remote.overlay, self.control
            self.telemetry.remote_config = self.remote.summary
        # the broker drops anything bigger than the largest message we take (the MQTT Maximum Packet Size)
        self.publisher.max_incoming_bytes = max(
            self.commands.max_bytes(), self.ota.max_message_bytes if self.ota else 0
        )

    def _build_consumers(self) -> None:
        """Liveness (the watchdog's serving question), Home Assistant discovery and the local health
        endpoint, when configured (each optional)."""
        cfg = self.cfg
        self.liveness = Liveness(cfg.inference.serving_timeout_s, self.cameras, self.loop, self.throttle)
        self.homeassistant: HomeAssistant | None = None
        if HomeAssistant.needed(cfg):  # enabled, or an earlier run's entities to clear
            self.homeassistant = HomeAssistant(
                cfg,
                self.scenes,
                self.publisher,
                lambda: (self.package.ref, self.package.labels),
                lambda: self.throttle.paused_cameras,  # the pause switches' state
            )
        self.health: HealthServer | None = None
        if cfg.health.enabled:
            stall_s = Watchdog().stall_s
            probe = Probe(self.parts, self.telemetry, lambda: self._health(time.monotonic(), stall_s))
            live = LiveView(cfg.health, self.parts, self.telemetry) if cfg.health.live_view else None
            self.health = HealthServer(cfg.health, probe, live)
            self.health.labelling = self.labelling  # /labelling…, and the counters of both on /metrics
            self.health.probe.uploads = self.uploader.stats if self.uploader is not None else None
            self.health.probe.labelling = self.labelling.stats if self.labelling is not None else None

    def _build_clips(self) -> None:
        """Cameras with record: and a ring: the clip store (recovered), the planner (events -> clips, its own
        thread) and what reads them: the `clips` verb, telemetry, /metrics and the /clips paths."""
        self.clips = build_clips(self.cfg, self.cameras, write_mp4, self._event, self.uploader)
        if self.clips is None:
            return
        self.control.clips = self.clips.store
        self.telemetry.clips = self.clips.summary
        if self.health is not None:
            self.health.probe.clips = self.clips.summary
            self.health.clips = clips_http(self.clips.store, self.cfg.health.token_file, read_token)

    def _start_failed(self, exc: BaseException) -> None:
        """A start that ends in an error releases what it holds (the probation marker: `ModelLoader.start_failed`)."""
        self.loader.start_failed(exc)
        spool = vars(self).get("spool")
        if isinstance(spool, Spool):
            spool.close()
        self.lock.release()
        self.log_ring.uninstall()

    @property
    def package(self) -> Package:
        """The package serving now (it changes with a swap)."""
        return self.models.package

    # --- what the parts call back ----------------------------------------------------------------
    def _reply(self, topic: str, payload: bytes, props: Properties | None) -> None:
        self.publisher.publish_direct(topic, payload, qos=1, properties=props)

    def _publish_model_state(self, doc: dict[str, Any]) -> None:
        self.publisher.set_retained(topics.MODEL_STATE, doc)

    def _status_extra(self) -> dict[str, Any]:
        m = self.package.manifest
        remote = {"config": self.remote.summary()} if self.remote is not None else {}
        return {"model": {"name": m.name, "version": m.version}, "groups": list(self.cfg.groups), **remote}

    def _on_result(self, r: Result) -> None:
        r, events, frames = self.scenes.process(r)  # per-camera settings, tracks, zones, object events
        if self.cascade is not None and frames and events:
            self._held_events[(r.camera, r.meta.seq)] = events  # sent with the stages' outputs (`_staged`)
        else:
            for ev in events:
                self._event(ev)
        self.telemetry.record(r)
        self.control.record(r)
        if self.health is not None and self.health.live is not None:
            self.health.live.record(r)  # a reference kept: nothing drawn unless someone watches
        if self.homeassistant is not None:
            self.homeassistant.observe(r)
        if self.labelling is not None and self.labelling.cfg.sampling:  # cheap unless a frame is sampled
            cam = next(c for c in self.cameras if c.name == r.camera)
            ref = f"{r.model_name}@{r.model_version}"
            self.labelling.observe(
                r.camera, r.detections, ref, lambda: cam.frame_for(r.meta.seq), time.monotonic(), r.meta
            )
        if frames:
            (self.cascade.submit if self.cascade is not None else self.publisher.submit)(r)  # stages, then publisher

    def _staged(self, r: StagedResult) -> None:
        """A result whose stages have answered (a stage thread, or the decode thread): its object events first,
        each with its detection's stage outputs (cascade/pipeline.py `with_stage_outputs`), then the result."""
        for ev in with_stage_outputs(self._held_events.pop((r.camera, r.meta.seq), []), r):
            self._event(ev)
        self.publisher.submit(r)

    def _event(self, doc: dict[str, Any]) -> None:
        if self.clips is not None:
            self.clips.observe(doc)  # an object event of a recording camera opens or joins a clip, and names it
        event = {
            "schema": EVENT_SCHEMA,
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

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        if signum is not None:
            logger.info("received %s: stopping", signal.Signals(signum).name)
        self.stop_event.set()
        with self.cond:
            self.cond.notify_all()

    # --- serving -------------------------------------------------------------------------------
    def run(
        self,
        duration_s: float | None = None,
        install_signals: bool = True,
        first_batch_wait_s: float = FIRST_BATCH_WAIT_S,
    ) -> RunSummary:
        """Warm up, serve until stopped, shut down. `duration_s`: serve that long, counted from the first
        served batch (not from the start, which a busy machine or a camera that opens late can make last
        longer than the run); a run that serves no batch within `first_batch_wait_s` of ready stops then and
        says why in `unserved`. `install_signals`: install the SIGTERM / SIGINT / SIGHUP handlers here unless
        the constructor was given them (main thread only)."""
        if install_signals and self.signals is None:
            self.signals = Signals(self.stop_event)
            self.signals.install()
            self.signals.on_stop(self.request_stop)
        m = self.package.manifest
        if self.health is not None:
            self.health.start()  # /healthz answers during the warm-up; /readyz says why it is not ready
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
        backend = self.loop.backend  # inference.dedicated_core: the threads running now move off its core
        cpu = backend is not None and backend.cpu_bound
        self.loop.cores = affinity.dedicate(self.cfg.inference.dedicated_core, cpu, self.cfg.model.onnxruntime.threads)
        self.commands.start()
        self.publisher.start()
        if self.uploader is not None:
            self.uploader.start()
        if self.labelling is not None:
            self.labelling.start()
        for ev in self.loader.events:
            self._event(ev)
        self.models.publish_state()
        if self.ota is not None:
            self.ota.resume()
        if self.group_offers is not None:
            self.group_offers.start()
        if self.remote is not None:
            self.remote.start()
        if self.clips is not None:
            self.clips.start()  # before the cameras: a first event's pre-roll is pulled from the ring at once
        for c in self.cameras:
            c.start()
        if self.cascade is not None:
            self.cascade.start()
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
        notify(f"READY=1\nSTATUS={self.telemetry.status_line()}")
        if self.health is not None:
            self.health.probe.serving.set()
        if self.signals is not None:
            self.signals.ready(self.control.reload_in_background)  # SIGHUP reloads from now on
        watchdog = Watchdog()
        ready_at = time.monotonic()
        first_batch_at: float | None = None  # the run's duration counts from here
        next_tel = ready_at + self.cfg.telemetry.interval_s
        next_trim = ready_at + TRIM_EVERY_S
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                healthy, why = self._health(now, watchdog.stall_s)
                watchdog.tick(now, healthy, why)
                if first_batch_at is None and self.loop.stats.batches:
                    first_batch_at = now
                    self.first_batch_s = now - self.started
                    logger.info("first batch served %.1f s after the start", self.first_batch_s)
                if duration_s is not None and first_batch_at is not None and now >= first_batch_at + duration_s:
                    logger.info("run duration of %.0f s from the first batch reached: stopping", duration_s)
                    break
                if duration_s is not None and first_batch_at is None and now >= ready_at + first_batch_wait_s:
                    states = ", ".join(f"{c.name} {c.stats.state}" for c in self.cameras)
                    self.unserved = f"no batch served within {first_batch_wait_s:.0f} s of ready (cameras: {states})"
                    logger.error("%s: stopping the %.0f s run", self.unserved, duration_s)
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
                self.models.record_output(now)  # the serving version's output, in the store once a minute
                for c in self.cameras:  # a camera that is down: its tracks end now, not when it comes back
                    if reason := c.down_reason:
                        for ev in self.scenes.end_tracks(c.name, reason, c.segment):
                            self._event(ev)
                if self.homeassistant is not None:
                    self.homeassistant.tick()  # discovery at each connect; states follow the counts
                if now >= next_trim:  # what swaps and reopens freed goes back to the system, not to a high water
                    if (released := trim_heap()) >= 16:
                        logger.info("memory: %.0f MB of freed heap returned to the system", released)
                    next_trim = now + TRIM_EVERY_S
                if now >= next_tel:
                    self.lock.check()  # a state directory deleted while running: the lock is taken again
                    self.publisher.publish_json(topics.TELEMETRY, self.telemetry.document(), qos=0, retain=True)
                    notify(f"STATUS={self.telemetry.status_line()}")
                    next_tel = now + self.cfg.telemetry.interval_s
                self.stop_event.wait(min(0.25, max(0.01, next_tel - now)))
        finally:
            if first_batch_at is not None:
                self.served_s = time.monotonic() - first_batch_at
            self.shutdown()
        return self.telemetry.summary(self.stop_reason, self.failure)

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
        if self.health is not None:
            self.health.stop()
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
            process_memory_mb().get("peak_rss_mb", 0.0),
            time.monotonic() - self.started,
            self.stop_reason,
            left_in_spool=self.spool.rows,  # from an earlier run: sent at the next start
        )

    def _health(self, now: float, stall_s: float) -> tuple[bool, str]:
        """The watchdog's question: are the inference loop, the publisher and the MQTT network threads
        making progress, and does the daemon serve (`Liveness`: frames come in, batches run)?"""
        serving = self.liveness.check(now)  # sampled at every call: it watches counters move
        if serving:
            return False, serving
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
        if self.health is not None:
            self.health.probe.stopping.set()
        if self.governor is not None:
            self.governor.stop()
        join_all(self.cameras, 5.0)  # in parallel: several hung sources cost one bound, not one each
        self.loop.join(10.0)
        if self.labelling is not None:
            self.labelling.stop()
        if self.uploader is not None:
            self.uploader.stop()
        if self.cascade is not None:
            self.cascade.join(10.0)  # what the stages have queued runs, then results still waiting go on
        if self.ota is not None:
            self.ota.join(10.0)
        for ev in self.scenes.close():  # the tracks still alive end with the cameras
            self._event(ev)
        if self.clips is not None:
            self.clips.join()  # the open clips written from what the rings hold, their clip_ready events queued
        try:
            self.publisher.publish_json(topics.TELEMETRY, self.telemetry.document(), qos=0, retain=True)
        finally:
            self.commands.stop()
            self.models.close()
            self.publisher.stop()
            active = self.loop.active
            if active is not None:
                active.backend.close()
            if self.cascade is not None:
                self.cascade.close()
            self.lock.release()
            if self.health is not None:
                self.health.stop()
        logger.info("stopped cleanly")
        self.log_ring.uninstall()
