"""Health without the broker: a small local HTTP server (``health:`` in the config; off by default, bound to
127.0.0.1) for probes and Prometheus.

    GET /healthz  200 {"status": "ok"} while the daemon's threads make progress (the systemd watchdog's
                  own question); 503 with the reason otherwise
    GET /readyz   200 {"status": "ready"} when the model is loaded and warm, every camera delivers frames,
                  the broker is connected, the spool is writable and inference is not paused;
                  503 {"status": "not ready", "reasons": [...]} otherwise (each reason a sentence)
    GET /live     the live view, with ``health.live_view`` (daemon/liveview.py: the page, each camera's view,
                  its own access rule: loopback clients only, or the token)
    GET /clips    where a camera records: the clip store's list, /clips/<id>.mp4 and .json (daemon/record/store.py
                  `ClipsHTTP`; loopback clients only, or the token, as /live)
    GET /metrics  OpenMetrics / Prometheus text (prometheus-client), read from the running parts at each
                  scrape: counters for what telemetry counts, gauges for states and sensors, histograms
                  for latencies (since the start, daemon/latency.py's buckets)

It answers while the broker is away (telemetry, QoS 0, is lost then). Scrapes never touch telemetry's
rate state: rates are Prometheus's business (``rate(edged_camera_frames_total[1m])``); ``edged_inference_fps``
is the rate of the last telemetry interval.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from edged import __version__
from edged.errors import ConfigError

from .config.consumers import HealthConfig
from .host.sensors import process_memory_mb
from .latency import Histogram
from .liveview import LiveView, loopback, read_token
from .parts import Parts
from .record.labelling import LabelFrames
from .record.store import ClipsHTTP
from .telemetry import Telemetry

logger = logging.getLogger(__name__)


class Probe(Collector):
    """Reads the running parts (from the HTTP server's threads: only reads, no locks of theirs held long)."""

    def __init__(self, parts: Parts, telemetry: Telemetry, threads: Callable[[], tuple[bool, str]]) -> None:
        """`telemetry`: the inference rate of its last interval. `threads`: the watchdog's question (are the
        inference loop, the publisher and the MQTT network making progress?), as (healthy, why not)."""
        self.parts = parts
        self.telemetry = telemetry
        self.threads = threads
        self.serving = threading.Event()  # set once the model is warm and the parts are started
        self.stopping = threading.Event()
        self.clips: Callable[[], dict[str, Any]] | None = None  # the clip planner's counters (record/), app.py sets it
        self.uploads: Callable[[], dict[str, int]] | None = None  # the uploader's counters (delivery/upload.py)
        self.labelling: Callable[[], dict[str, int]] | None = None  # the frames worth labelling (record/labelling.py)
        self.stages: Callable[[], dict[str, Any]] | None = None  # second-stage models' counters (cascade/runner.py)

    def alive(self) -> tuple[bool, str]:
        if not self.serving.is_set():
            return True, ""  # loading or warming up: alive, not ready
        return self.threads()

    def reasons(self) -> list[str]:
        """Why the daemon is not ready (empty: ready)."""
        if self.stopping.is_set():
            return ["the daemon is stopping"]
        if not self.serving.is_set():
            return ["the model is loading or warming up"]
        out: list[str] = []
        if self.parts.loop.active is None:
            out.append("no model is loaded")
        ok, why = self.threads()
        if not ok:
            out.append(why)
        for c in self.parts.cameras:
            if not c.live:
                shown, reason = c.shown_state()
                if shown == "stuck":  # the reason reads "stuck in its source's read() for …"
                    out.append(f"camera {c.name} is {reason}")
                else:
                    out.append(f"camera {c.name} is {shown}" + (f": {reason}" if reason else ""))
        p = self.parts.publisher
        if not p.connected:
            out.append(
                f"the broker {p.cfg.host}:{p.cfg.port} is not connected" + (f": {p.last_error}" if p.last_error else "")
            )
        if p.spool_state != "ok":
            out.append(f"the spool is failing: {p.spool_error or 'storage errors'}")
        t = self.parts.throttle
        if t.paused:
            by_command = t.user_paused or (bool(t.paused_cameras) and not t.governor_paused)
            who = "the pause command" if by_command else "the governor (heat or power)"
            out.append(f"inference is paused by {who}")
        elif t.paused_cameras:
            out.append(f"camera {', '.join(sorted(t.paused_cameras))} paused by the pause command")
        return out

    # --- /metrics --------------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        p = self.parts
        st = p.loop.stats
        package = p.models.package
        info = InfoMetricFamily("edged", "the daemon, its version and the model it serves")
        info.add_metric(
            [],
            {
                "device": p.host.cfg.device_id,
                "version": __version__,
                "model": package.ref,
                "backend": p.backend_name,
            },
        )
        yield info
        yield _gauge("edged_uptime_seconds", "seconds since the daemon started", time.monotonic() - p.started)
        yield _gauge("edged_ready", "1 when /readyz says ready", 0.0 if self.reasons() else 1.0)
        yield from self._cameras()
        yield _gauge("edged_inference_fps", "results per second over the last telemetry interval", self.telemetry.fps)
        yield _counter("edged_inference_results", "results (frames) inferred", st.rows)
        yield _counter("edged_inference_batches", "batches run", st.batches)
        yield _counter("edged_inference_padded_rows", "padding rows in short batches", st.padded_rows)
        yield _counter("edged_inference_errors", "inference errors", st.errors)
        yield _histogram("edged_inference_latency_seconds", "inference time per batch", st.infer_ms.histogram())
        yield _histogram(
            "edged_capture_to_result_seconds", "from capture to result, per frame", st.capture_to_result_ms.histogram()
        )
        yield _counter("edged_model_swaps", "model swaps done", p.models.swaps)
        shadow = p.models.shadow  # a candidate evaluated beside the serving model (lifecycle/shadow.py)
        yield _gauge("edged_shadow_running", "1 while a candidate shadows the serving model", shadow is not None)
        yield _counter("edged_shadow_errors", "a shadowed candidate's failures", st.shadow_errors)
        yield shadow_verdicts(p.models.shadow_verdicts.counts())
        for key, value in (shadow.gauges() if shadow is not None else {}).items():
            yield _gauge(f"edged_shadow_{key}", f"the running shadow evaluation: {key} (…/shadow)", value)
        yield from self._mqtt()
        yield from self._memory()
        yield from self._governor()
        if self.clips is not None:  # the clip store and planner (record/): sizes are gauges, the rest counters
            for key, value in self.clips().items():
                make = _gauge if key in ("clips", "bytes", "open", "pending") else _counter
                yield make(f"edged_clips_{key}", f"clips: {key} (telemetry's clips.{key})", value)
        for part, stats in (("uploads", self.uploads), ("labelling", self.labelling)):  # sizes are gauges
            for key, value in (stats() if stats is not None else {}).items():
                make = _gauge if key in ("queued", "queued_bytes", "failed_kept", "frames", "bytes") else _counter
                yield make(f"edged_{part}_{key}", f"{part}: {key} (telemetry's {part}.{key})", value)
        stages = self.stages() if self.stages is not None else {}  # second-stage models (cascade/), by stage
        for key in ("crops", "batches", "padded_rows", "skipped_reinfer", "dropped", "no_frame", "errors"):
            if not stages:
                break
            text = f"stages: {key} (telemetry's stages.<stage>.{key})"
            family = CounterMetricFamily(f"edged_stage_{key}", text, labels=["stage"])
            for name, st in stages.items():
                family.add_metric([name], float(st[key]))
            yield family

    def _cameras(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("edged_camera_up", "1 while the camera delivers frames", labels=["camera"])
        state = GaugeMetricFamily(
            "edged_camera_state", "the camera's state (1 for the current one)", labels=["camera", "state"]
        )
        counters = {
            key: CounterMetricFamily(f"edged_camera_{key}", text, labels=["camera"])
            for key, text in (
                ("frames", "frames captured"),
                ("drops", "frames dropped (a newer one replaced them)"),
                ("reconnects", "reconnections"),
                ("stalls", "stalls (no frame for stall_timeout_s)"),
                ("errors", "capture errors"),
                ("frames_refused", "frames over max_frame_pixels, refused before decoding"),
            )
        }
        skipped = CounterMetricFamily("edged_camera_skipped_frames", "frames motion gating skipped", labels=["camera"])
        crossings = CounterMetricFamily(
            "edged_line_crossings",
            "objects that crossed a line (detection.lines), by direction (in, out) and label",
            labels=["camera", "line", "direction", "label"],
        )
        for c in self.parts.cameras:
            s = c.stats
            shown = c.shown_state()[0]
            up.add_metric([c.name], 1.0 if c.live else 0.0)
            for name in ("starting", "up", "down", "ended", "stopped", "stuck"):
                state.add_metric([c.name, name], 1.0 if shown == name else 0.0)
            for key, fam in counters.items():
                fam.add_metric([c.name], float(getattr(s, key)))
            gate = self.parts.loop.gates.get(c.name)
            if gate is not None:
                skipped.add_metric([c.name], float(gate.skipped))
            for line, directions in (self.parts.scenes.crossings(c.name) or {}).items():
                for direction, labels in directions.items():
                    for label, n in labels.items():
                        crossings.add_metric([c.name, line, direction, label], float(n))
        return [up, state, *counters.values(), skipped, crossings]

    def _mqtt(self) -> Iterable[Metric]:
        p = self.parts.publisher
        spool = p.spool
        dropped = CounterMetricFamily("edged_messages_dropped", "messages (results, events) lost", labels=["reason"])
        for reason, n in (
            ("spool_bounds", spool.dropped),
            ("spool_unsaved", spool.dropped_unsaved),
            ("spool_lost", spool.lost),
            ("queue_full", p.dropped_queue_full),
            ("oversized", p.oversized),
        ):
            dropped.add_metric([reason], float(n))
        return [
            _gauge("edged_mqtt_connected", "1 while connected to the broker", 1.0 if p.connected else 0.0),
            _counter("edged_mqtt_connects", "connections made", p.connects),
            _counter("edged_mqtt_connect_failures", "connection attempts that failed", p.connect_failures),
            _counter("edged_results_submitted", "results handed to the publisher", p.results),
            _counter("edged_messages_spooled", "messages written to the spool", p.spooled),
            _counter("edged_messages_published", "messages sent to the broker", p.published),
            _counter("edged_messages_acked", "QoS 1 messages the broker acknowledged", p.acked),
            dropped,
            _gauge("edged_spool_rows", "messages waiting in the spool", spool.rows),
            _gauge("edged_spool_bytes", "the spool's size", spool.bytes),
            _gauge("edged_spool_ok", "1 while the spool is writable", 1.0 if p.spool_state == "ok" else 0.0),
        ]

    def _memory(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily("edged_memory_bytes", "the process's memory", labels=["kind"])
        for key, mb in process_memory_mb().items():
            fam.add_metric([key.removesuffix("_mb")], float(mb) * 2**20)
        active = self.parts.loop.active
        fam.add_metric(["model"], float(active.backend.memory_bytes if active is not None else 0))
        return [fam]

    def _governor(self) -> Iterable[Metric]:
        out: list[Metric] = [
            _gauge("edged_inference_paused", "1 while inference is paused", float(self.parts.throttle.paused))
        ]
        g = self.parts.governor
        if g is None:
            return out
        out.append(
            _gauge("edged_governor_level", "thermal level: 0 normal, 1 warm, 2 hot, 3 critical", int(g.policy.level))
        )
        out.append(_gauge("edged_fps_scale", "the governor's frame-rate factor", self.parts.throttle.fps_scale))
        r = g.last
        if r is None:
            return out
        temps = GaugeMetricFamily("edged_temperature_celsius", "thermal zones", labels=["zone"])
        for zone, c in r.temps_c.items():
            temps.add_metric([zone], float(c))
        out.append(temps)
        if r.power_w is not None:
            out.append(_gauge("edged_power_watts", "board power", r.power_w))
        if r.gpu_load_pct is not None:
            out.append(_gauge("edged_gpu_load_ratio", "GPU load (0-1)", float(r.gpu_load_pct) / 100.0))
        return out


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=float(value))


def shadow_verdicts(counts: dict[str, int]) -> CounterMetricFamily:
    """``edged_shadow_verdicts_total{verdict=…}``: shadow evaluations ended, by verdict (lifecycle/shadow.py
    `Verdicts`), every verdict present from the start."""
    family = CounterMetricFamily(
        "edged_shadow_verdicts",
        "shadow evaluations ended, by verdict: passed (swapped in), failed (model_rejected), no_evidence "
        "(too little, or no detection at all), refused (never shadowed: over_budget, another model, a load failure)",
        labels=["verdict"],
    )
    for verdict, n in counts.items():
        family.add_metric([verdict], float(n))
    return family


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=float(value))


def _histogram(name: str, text: str, h: Histogram) -> HistogramMetricFamily:
    """Counts since the start per latency bucket (daemon/latency.py's, in ms), in seconds: cumulative
    `_bucket{le=...}`, `_sum`, `_count`."""
    buckets = [(repr(b / 1000.0), float(n)) for b, n in zip(h.bounds_ms, h.cumulative, strict=True)]
    buckets.append(("+Inf", float(h.count)))
    return HistogramMetricFamily(name, f"{text} (since the daemon started)", buckets=buckets, sum_value=h.sum_ms / 1e3)


class HealthServer:
    """The HTTP server on its own thread; `start` binds (an error names the address), `stop` closes."""

    def __init__(self, cfg: HealthConfig, probe: Probe, live: LiveView | None = None) -> None:
        """`live`: the live view's paths (/live…), None without them."""
        self.cfg = cfg
        self.probe = probe
        self.live = live
        self.clips: ClipsHTTP | None = None  # the /clips paths (record/store.py), set by app.py where cameras record
        self.labelling: LabelFrames | None = None  # the /labelling paths, set by app.py with labelling.enabled
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(probe)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests = 0

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else 0

    def start(self) -> None:
        """Bind and serve. An address in use is logged, and the daemon serves on without the endpoint: an
        inference device does not stop for its metrics port."""
        handler = _handler(self)
        try:
            self._server = ThreadingHTTPServer((self.cfg.host, self.cfg.port), handler)
        except OSError as exc:
            logger.error(
                "health: cannot listen on %s:%d (%s); serving without the endpoint", self.cfg.host, self.cfg.port, exc
            )
            return
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.25,), name="health", daemon=True)
        self._thread.start()
        logger.info(
            "health: http://%s:%d/healthz, /readyz, /metrics%s",
            self.cfg.host,
            self.port,
            "" if self.live is None else ", /live" + (" (token)" if self.live.token else " (loopback clients only)"),
        )

    def stop(self) -> None:
        if self._server is None:
            return
        if self.live is not None:
            self.live.stopping.set()  # open MJPEG streams end
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._server = None

    def labelling_answer(self, req: BaseHTTPRequestHandler, path: str, query: str) -> tuple[int, str, bytes]:
        """/labelling, /labelling/coco.json, /labelling/<key>.jpg (record/labelling.py): to loopback clients, or
        with health.token_file to any client giving the token (?token= or Authorization: Bearer), as /live."""
        self.requests += 1
        if self.labelling is None:
            return _json(404, {"status": "not found"})
        if why := _private_refusal(req, query, self.cfg):
            return 403, "text/plain; charset=utf-8", why.encode() + b"\n"
        return self.labelling.answer(path)

    def answer(self, path: str, accept: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path`."""
        self.requests += 1
        if path == "/healthz":
            ok, why = self.probe.alive()
            return _json(200 if ok else 503, {"status": "ok"} if ok else {"status": "failing", "reasons": [why]})
        if path == "/readyz":
            reasons = self.probe.reasons()
            return _json(
                503 if reasons else 200, {"status": "not ready", "reasons": reasons} if reasons else {"status": "ready"}
            )
        if path == "/metrics":
            encoder, content_type = choose_encoder(accept)
            return 200, content_type, encoder(self.registry)
        paths = ["/healthz", "/readyz", "/metrics"] + (["/live"] if self.live is not None else [])
        paths += ["/clips"] if self.clips is not None else []
        paths += ["/labelling"] if self.labelling is not None else []
        return _json(404, {"status": "not found", "paths": paths})


def _private_refusal(req: BaseHTTPRequestHandler, query: str, cfg: HealthConfig) -> str:
    """Why `req` may not read the device's frames (empty: it may), by /live's rule: loopback clients without
    ``health.token_file``; with it, whoever gives the token (read per request: rotated with the file)."""
    if cfg.token_file is None:
        return "" if loopback(req.client_address[0]) else "loopback clients only (set health.token_file to open it)"
    try:
        token = read_token(cfg.token_file) or ""
    except ConfigError as exc:
        logger.error("health: %s", exc)
        return "the token is unreadable on the device"
    given = parse_qs(query).get("token", [""])[-1]
    auth = req.headers.get("Authorization", "")
    given = given or (auth[7:].strip() if auth.startswith("Bearer ") else "")
    if not given:
        return "the token is needed: ?token=TOKEN or Authorization: Bearer TOKEN"
    return "" if token and hmac.compare_digest(given.encode(), token.encode()) else "wrong token"


def _json(status: int, doc: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(doc).encode() + b"\n"


def _handler(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"edged/{__version__}"
        timeout = 10  # an idle or slow client frees its thread (each connection has one)

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if server.clips is not None and (path == "/clips" or path.startswith("/clips/")):
                server.requests += 1
                try:
                    server.clips.handle(self, path, query)  # the list, or a clip's file streamed on this thread
                except Exception:  # a boundary, as below
                    logger.exception("health: %s failed", path)
                return
            if server.live is not None and (path == "/live" or path.startswith("/live/")):
                server.requests += 1
                try:
                    server.live.handle(self, path, query)  # it answers (and streams) on this thread
                except Exception:  # a boundary, as below: a failed view is a log line, not a dead server
                    logger.exception("health: %s failed", path)
                return
            try:
                if server.labelling is not None and (path == "/labelling" or path.startswith("/labelling/")):
                    status, ctype, body = server.labelling_answer(self, path, query)
                else:
                    status, ctype, body = server.answer(path, self.headers.get("Accept", ""))
            except Exception:  # a boundary: one failed scrape is a 500 and a log line, not a dead server
                logger.exception("health: %s failed", path)
                status, ctype, body = 500, "text/plain", b"internal error\n"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("health: " + format, *args)

    return Handler
