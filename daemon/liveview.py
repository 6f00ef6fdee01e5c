"""The live view: what the model sees, in a browser, from the local HTTP server (``health.live_view``; off by
default). One page lists the cameras; each shows its newest inferred frame with the boxes, labels, track ids,
zones, masks and lines (named with their in direction) drawn (scene/draw.py), refreshed up to
``live_max_fps``, and the page shows the status line, the model and version and a few telemetry values.

    GET /live                     the page (inline HTML, CSS and JS: nothing fetched from elsewhere);
                                  ``?still=1``: each view loaded once, not refreshed (screenshots, slow links)
    GET /live/frame?camera=NAME   the camera's view, one JPEG
    GET /live/stream?camera=NAME  the same as MJPEG (multipart/x-mixed-replace), for VLC, ffplay or an <img>
    GET /live/state               JSON: the status line, model, version, telemetry, and per camera the frame
                                  the last view sent (its file frame number, seq and detections)

Who may look: without ``health.token_file`` only loopback clients (an SSH tunnel); with it, any client that
gives the token, and no one else: ``/live?token=T`` once (the answer sets an HttpOnly cookie, ``edged_live``,
which the page's own requests carry), or ``?token=T`` / ``Authorization: Bearer T`` on any /live URL.

What it costs: nothing while nobody watches: the decode thread only keeps a reference to each camera's last
result (`record`), and nothing is drawn or encoded unless a request asks. The drawing and encoding run on the
viewer's HTTP thread, from the frame inference took for that result (``Camera.frame_for``: boxes land on the
frame they were found in), at most ``live_max_fps`` per camera however many viewers ask (one encoding shared),
at most ``live_max_viewers`` requests at once. bench/liveview.py measures inference with one viewer and none.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from edged import __version__
from edged.errors import ConfigError

from .config.consumers import HealthConfig
from .inference import Result
from .parts import Parts
from .scene.draw import Shape, draw_scene, encode_jpeg
from .telemetry import Telemetry

logger = logging.getLogger(__name__)

COOKIE = "edged_live"
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~-]+")  # safe in a cookie, a query string and a header as it is
BOUNDARY = "edgedframe"


@dataclass(frozen=True)
class View:
    """One camera's drawn, encoded view and what it shows."""

    jpeg: bytes
    seq: int  # FrameMeta.seq of the result drawn
    frame: int  # FrameMeta.frame: for a file, its index in the file
    detections: int
    made: float  # time.monotonic() when encoded


def read_token(path: Path | None) -> str | None:
    """The token in `path` (stripped), None without one; a missing, unreadable or empty file is a ConfigError
    naming ``health.token_file``."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"health.token_file: {path}: {exc.strerror or exc}") from exc
    if len(token) < 16:
        raise ConfigError(f"health.token_file: {path}: the token must have at least 16 characters")
    if not _TOKEN_CHARS.fullmatch(token):
        raise ConfigError(f"health.token_file: {path}: the token may hold letters, digits and - _ . ~ only")
    return token


def loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class LiveView:
    """The /live paths of the health server (`handle`, on its request threads) and the decode thread's hook
    (`record`)."""

    def __init__(self, cfg: HealthConfig, parts: Parts, telemetry: Telemetry) -> None:
        self.cfg = cfg
        self.parts = parts
        self.telemetry = telemetry
        self.token = read_token(cfg.token_file)
        self.stopping = threading.Event()
        self.encoded = 0  # views drawn and encoded since the start (0 while nobody watched)
        self.refused = 0  # requests refused: no token, a wrong one, not loopback, too many viewers
        self._results: dict[str, Result] = {}
        self._views: dict[str, View] = {}
        self._served: dict[str, dict[str, int]] = {}
        self._locks = {c.name: threading.Lock() for c in parts.cameras}
        self._busy = threading.BoundedSemaphore(cfg.live_max_viewers)

    def record(self, r: Result) -> None:
        """The decode thread, per result: one dict store, nothing drawn."""
        self._results[r.camera] = r

    # --- the views -----------------------------------------------------------------------------
    def view(self, camera: str) -> View | None:
        """The camera's view now: the cached one while it is younger than a frame interval (or shows the
        newest result already), else drawn and encoded from the newest result's frame. None: no frame yet."""
        cam = next((c for c in self.parts.cameras if c.name == camera), None)
        if cam is None:
            raise KeyError(camera)
        with self._locks[camera]:
            r = self._results.get(camera)
            old = self._views.get(camera)
            now = time.monotonic()
            fresh = old is not None and now - old.made < 1.0 / self.cfg.live_max_fps
            if old is not None and (fresh or (r is not None and r.meta.seq == old.seq)):
                return old
            frame = cam.frame_for(r.meta.seq) if r is not None else None
            if frame is None:  # not kept (yet): the newest frame read, with the last result's boxes
                frame = cam.last_frame
            if frame is None:
                return None
            dets = [d.to_json() for d in r.detections] if r is not None else []
            zones, masks, lines = self._shapes(camera)
            img = draw_scene(frame, dets, zones, masks, lines, max_width=self.cfg.live_max_width)
            v = View(
                encode_jpeg(img, self.cfg.live_jpeg_quality),
                r.meta.seq if r is not None else -1,
                r.meta.frame if r is not None else -1,
                len(dets),
                now,
            )
            self._views[camera] = v
            self.encoded += 1
            return v

    def _shapes(self, camera: str) -> tuple[list[Shape], list[Shape], list[Shape]]:
        """The camera's zones, masks and lines (each line named with its in direction: ``door (in: right)``)."""
        cfg = next((c for c in self.parts.host.cfg.cameras if c.name == camera), None)
        d = cfg.detection if cfg is not None else None
        if d is None:
            return [], [], []
        return (
            [Shape(z.name, z.points, z.normalized) for z in d.zones],
            [Shape(m.name, m.points, m.normalized) for m in d.masks],
            [Shape(f"{n.name} (in: {n.in_direction})", n.points, n.normalized) for n in d.lines],
        )

    def state(self) -> dict[str, Any]:
        p = self.parts
        m = p.models.package.manifest
        cams: dict[str, Any] = {}
        for c in p.cameras:
            shown, reason = c.shown_state()
            cams[c.name] = {
                "state": shown,
                "reason": reason,
                "frames": c.stats.frames,
                "drops": c.stats.drops,
                "paused": c.name in p.throttle.paused_cameras,
                "served": self._served.get(c.name),
            }
        doc: dict[str, Any] = {
            "device": p.host.cfg.device_id,
            "version": __version__,
            "status_line": self.telemetry.status_line(),
            "model": {"name": m.name, "version": m.version, "ref": p.models.package.ref, "backend": p.backend_name},
            "fps": round(self.telemetry.fps, 2),
            "uptime_s": round(time.monotonic() - p.started, 1),
            "paused": p.throttle.paused,
            "broker": "connected" if p.publisher.connected else "down",
            "spool_rows": p.publisher.spool.rows,
            "encoded": self.encoded,
            "cameras": cams,
        }
        g = p.governor
        if g is not None and g.last is not None:
            doc["temperatures_c"] = dict(g.last.temps_c)
            doc["thermal"] = g.policy.level.label
        return doc

    # --- HTTP ------------------------------------------------------------------------------------
    def handle(self, req: BaseHTTPRequestHandler, path: str, query: str) -> None:
        """Answer a GET of a /live path on the server's request thread."""
        args = {k: v[-1] for k, v in parse_qs(query).items()}
        ok, why, set_cookie = self._allowed(req, args)
        if not ok:
            self.refused += 1
            _send(req, 403, "text/plain; charset=utf-8", why.encode() + b"\n")
            return
        extra = [("Set-Cookie", f"{COOKIE}={self.token}; Path=/live; HttpOnly; SameSite=Strict")] if set_cookie else []
        if path == "/live":
            _send(req, 200, "text/html; charset=utf-8", page(self.parts, self.cfg, args.get("still") == "1"), extra)
        elif path == "/live/state":
            _send(req, 200, "application/json", json.dumps(self.state()).encode() + b"\n", extra)
        elif path in ("/live/frame", "/live/stream"):
            if not self._busy.acquire(blocking=False):
                self.refused += 1
                _send(req, 503, "text/plain", f"over health.live_max_viewers ({self.cfg.live_max_viewers})\n".encode())
                return
            try:
                self._camera(req, path, args.get("camera", ""))
            finally:
                self._busy.release()
        else:
            _send(req, 404, "application/json", b'{"status": "not found", "paths": ["/live", "/live/frame", '
                  b'"/live/stream", "/live/state"]}\n')  # fmt: skip

    def _camera(self, req: BaseHTTPRequestHandler, path: str, camera: str) -> None:
        try:
            v = self.view(camera)
        except KeyError:
            names = ", ".join(c.name for c in self.parts.cameras)
            _send(req, 404, "text/plain", f"no camera {camera!r}; cameras: {names}\n".encode())
            return
        if path == "/live/frame":
            if v is None:
                _send(req, 503, "text/plain", f"camera {camera!r} has no frame yet\n".encode())
                return
            self._note(camera, v)
            _send(req, 200, "image/jpeg", v.jpeg, [("X-Edged-Frame", str(v.frame)), ("X-Edged-Seq", str(v.seq))])
            return
        req.send_response(200)
        req.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
        req.send_header("Cache-Control", "no-store")
        req.end_headers()
        self._stream(req, camera, v)

    def _stream(self, req: BaseHTTPRequestHandler, camera: str, v: View | None) -> None:
        """Parts until the viewer goes or the server stops; a part only when the view changed (and one every
        few seconds regardless, which finds a viewer that has gone)."""
        gap = 1.0 / self.cfg.live_max_fps
        sent_seq, sent_at = None, 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if v is not None and (v.seq != sent_seq or now - sent_at > 5.0):
                    head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(v.jpeg)}\r\n\r\n"
                    req.wfile.write(head.encode() + v.jpeg + b"\r\n")
                    req.wfile.flush()
                    self._note(camera, v)
                    sent_seq, sent_at = v.seq, now
                self.stopping.wait(gap)
                v = self.view(camera)
        except OSError:  # the viewer went away (a reset or broken pipe): its thread ends
            return

    def _note(self, camera: str, v: View) -> None:
        self._served[camera] = {"frame": v.frame, "seq": v.seq, "detections": v.detections}

    def _allowed(self, req: BaseHTTPRequestHandler, args: dict[str, str]) -> tuple[bool, str, bool]:
        """(allowed, why not, set the cookie)."""
        if self.token is None:
            if loopback(req.client_address[0]):
                return True, "", False
            return False, "the live view answers loopback clients only (set health.token_file to open it)", False
        given, from_query = args.get("token"), True
        if given is None:
            from_query = False
            auth = req.headers.get("Authorization", "")
            if auth.startswith("Bearer "):
                given = auth[7:].strip()
            else:
                morsel = SimpleCookie(req.headers.get("Cookie", "")).get(COOKIE)
                given = morsel.value if morsel is not None else None
        if given is None:
            return False, "the live view needs its token: open /live?token=TOKEN", False
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return False, "wrong token", False
        return True, "", from_query


def _send(
    req: BaseHTTPRequestHandler, status: int, ctype: str, body: bytes, headers: list[tuple[str, str]] | None = None
) -> None:
    req.send_response(status)
    req.send_header("Content-Type", ctype)
    req.send_header("Content-Length", str(len(body)))
    req.send_header("Cache-Control", "no-store")
    if ctype.startswith("text/html"):  # nothing from elsewhere, no framing by other pages
        req.send_header(
            "Content-Security-Policy",
            "default-src 'none'; img-src 'self'; connect-src 'self'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; frame-ancestors 'none'",
        )
    for k, v in headers or []:
        req.send_header(k, v)
    req.end_headers()
    req.wfile.write(body)


def page(parts: Parts, cfg: HealthConfig, still: bool) -> bytes:
    """The page: a figure per camera and the state panel; its script refreshes each view (a new request once
    the last one has loaded, at most live_max_fps) and the state every 2 s, unless `still`."""
    device = _html(parts.host.cfg.device_id)
    figures = "\n".join(
        f'<figure><img alt="{_html(c.name)}" data-camera="{_html(c.name)}" '
        f'src="/live/frame?camera={_url(c.name)}"><figcaption>{_html(c.name)}</figcaption></figure>'
        for c in parts.cameras
    )
    script = _SCRIPT.replace("FPS", repr(cfg.live_max_fps)).replace("STILL", "true" if still else "false")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edged {device}: live view</title>
<style>{_STYLE}</style></head>
<body><header><h1>edged {device}</h1><p id="status">…</p><p id="model"></p><p id="telemetry"></p></header>
<main>{figures}</main>
<script>{script}</script></body></html>
""".encode()


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _url(s: str) -> str:
    return quote(s, safe="")


_STYLE = """
body { margin: 0; font: 14px system-ui, sans-serif; background: #111; color: #ddd; }
header { padding: 8px 16px; background: #1c1c1c; }
h1 { font-size: 18px; margin: 0 0 4px; }
header p { margin: 2px 0; }
main { display: flex; flex-wrap: wrap; gap: 16px; padding: 16px; }
figure { margin: 0; }
figure img { display: block; max-width: none; background: #000; }
figcaption { padding: 4px 0; }
"""

_SCRIPT = """
const fps = FPS, still = STILL;
for (const img of document.querySelectorAll('img[data-camera]')) {
  const url = '/live/frame?camera=' + encodeURIComponent(img.dataset.camera);
  const next = () => { if (!still) setTimeout(() => { img.src = url + '&t=' + Date.now(); }, 1000 / fps); };
  img.onload = next;
  img.onerror = () => setTimeout(next, 1000);
}
async function state() {
  try {
    const s = await (await fetch('/live/state')).json();
    document.getElementById('status').textContent = s.status_line;
    document.getElementById('model').textContent =
      `model ${s.model.name} ${s.model.version} on ${s.model.backend} · edged ${s.version} · up ${s.uptime_s} s`;
    const cams = Object.entries(s.cameras).map(([n, c]) =>
      `${n}: ${c.state}${c.paused ? ' (paused)' : ''}, ${c.frames} frames, ${c.drops} drops`).join(' · ');
    const temps = Object.entries(s.temperatures_c || {}).map(([z, t]) => `${z} ${t} °C`).join(', ');
    document.getElementById('telemetry').textContent =
      `${s.fps} fps · broker ${s.broker} · spool ${s.spool_rows}${s.paused ? ' · paused' : ''} · ${cams}` +
      (temps ? ' · ' + temps : '');
  } catch (e) {
    document.getElementById('status').textContent = 'the daemon does not answer';
  }
  if (!still) setTimeout(state, 2000);
}
state();
"""
