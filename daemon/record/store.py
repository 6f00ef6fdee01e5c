"""The clip store: each clip an MP4 and its sidecar under ``<clips.dir>/<camera>/`` (``<state_dir>/clips`` by
default), bounded by bytes and age, listed and fetched through the local HTTP server.

    <camera>/<id>.mp4    written by the muxer (record/mux.py): ``.part``, fsync, rename, directory fsync
    <camera>/<id>.json   the sidecar (schema ``edged.clip/1``): id, camera, start, duration_s, bytes, sha256,
                         events, uploaded; written atomically after the MP4, so a clip is complete, and listed,
                         only once both are there

What a stop in the middle leaves (a SIGKILL, a power cut) is tidied at the start (`recover`): a ``.part`` is
removed, an MP4 without its sidecar, a sidecar without its MP4, or a pair whose sizes disagree is removed;
each counted (a sidecar's temporary file too). Bounds (`prune`, after each clip, at the start and every
minute from the planner's thread): clips past ``max_age_h`` go, then the oldest until the store is within
``max_mb``. A clip waiting for its upload is kept past its age, and is the last to go for bytes (counted
apart, ``dropped_pending``): the byte bound holds whatever happens.

`ClipsHTTP` answers the health server's ``/clips`` paths: the list (JSON) and each clip's file, to loopback
clients or to whoever gives ``health.token_file``'s token (as ``/live`` does).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from edged.errors import EdgedError, StateDirError
from edged.models.store.files import fsync_dir, write_atomic
from edged.protocol.commands import CLIPS_REPLY_BYTES, ClipsArgs
from edged.protocol.schemas import CLIP_SCHEMA, iso

logger = logging.getLogger(__name__)

CLIP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_LIST = 1000  # a list (HTTP or the `clips` verb) names at most this many clips


@dataclass
class Clip:
    """One complete clip as its sidecar says."""

    id: str
    camera: str
    start: float  # wall time of its first frame (time.time())
    duration_s: float
    bytes: int  # the MP4's size
    sha256: str
    events: list[dict[str, Any]]
    uploaded: bool = False
    pending: bool = False  # queued for upload now (not in the sidecar: the uploader's queue holds it)
    side_bytes: int = 0  # the sidecar's size on disk (not in the sidecar)

    @property
    def url_path(self) -> str:
        return f"/clips/{self.id}.mp4"

    def sidecar(self) -> dict[str, Any]:
        return {
            "schema": CLIP_SCHEMA,
            "id": self.id,
            "camera": self.camera,
            "start": iso(self.start),
            "start_wall": self.start,
            "duration_s": round(self.duration_s, 3),
            "bytes": self.bytes,
            "sha256": self.sha256,
            "events": self.events,
            "uploaded": self.uploaded,
            "url_path": self.url_path,
        }

    @classmethod
    def from_sidecar(cls, doc: dict[str, Any]) -> Clip:
        if doc.get("schema") != CLIP_SCHEMA:
            raise ValueError(f"not an {CLIP_SCHEMA} sidecar")
        return cls(
            id=str(doc["id"]),
            camera=str(doc["camera"]),
            start=float(doc["start_wall"]),
            duration_s=float(doc["duration_s"]),
            bytes=int(doc["bytes"]),
            sha256=str(doc["sha256"]),
            events=list(doc.get("events", [])),
            uploaded=bool(doc.get("uploaded", False)),
        )


@dataclass
class StoreStats:
    clips: int = 0
    bytes: int = 0  # clips and sidecars in the store now
    added: int = 0
    written_bytes: int = 0  # every byte this process wrote to the store (MP4s and sidecars): flash wear
    removed_age: int = 0
    removed_bytes: int = 0  # removed for the byte bound
    dropped_pending: int = 0  # removed for the byte bound while still waiting for an upload
    partial_removed: int = 0  # .part files (and orphaned halves) left by a stop mid-write, removed at the start
    uploaded: int = 0
    upload_failed: int = 0


class ClipStore:
    """Thread-safe: the planner's thread adds, the HTTP threads and the command verb read, the uploader's
    callbacks mark."""

    def __init__(self, root: Path, max_bytes: int, max_age_s: float, clock: Any = time.time) -> None:
        if max_bytes <= 0 or max_age_s <= 0:
            raise ValueError(f"a clip store needs positive bounds, got {max_bytes} bytes and {max_age_s} s")
        self.root = root
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clock = clock
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._clips: dict[str, Clip] = {}
        # a removed clip's MP4, told to whoever holds it elsewhere (the uploader's queue: `Uploader.forget`)
        self.on_removed: Callable[[Path], Any] | None = None

    # --- the start -----------------------------------------------------------------------------
    def recover(self, uploads: bool = False) -> list[str]:
        """Tidy what a stop mid-write left, load the complete clips, apply the bounds; the lines say what went.
        `uploads`: clips are uploaded, so those not uploaded yet are pending (they are queued again), and kept."""
        lines: list[str] = []
        self.root.mkdir(parents=True, exist_ok=True)
        for cam_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for part in sorted([*cam_dir.glob("*.part"), *cam_dir.glob(".*.tmp")]):  # a sidecar's .tmp too
                part.unlink(missing_ok=True)
                self.stats.partial_removed += 1
                lines.append(f"removed {part.name}: a clip that was being written when the daemon stopped")
            mp4s = {p.stem: p for p in cam_dir.glob("*.mp4")}
            sides = {p.stem: p for p in cam_dir.glob("*.json")}
            for stem in sorted(mp4s.keys() | sides.keys()):
                clip = self._load(mp4s.get(stem), sides.get(stem))
                if clip is None:
                    for p in (sides.get(stem), mp4s.get(stem)):
                        if p is not None:
                            p.unlink(missing_ok=True)
                    if (mp4 := mp4s.get(stem)) is not None and self.on_removed is not None:
                        self.on_removed(mp4)
                    self.stats.partial_removed += 1
                    lines.append(f"removed {cam_dir.name}/{stem}: an incomplete clip")
                    continue
                clip.side_bytes = _size(sides[stem])
                clip.pending = uploads and not clip.uploaded
                self._clips[clip.id] = clip
                self.stats.bytes += clip.bytes + clip.side_bytes
        self.stats.clips = len(self._clips)
        lines += self.prune()
        return lines

    def _load(self, mp4: Path | None, side: Path | None) -> Clip | None:
        if mp4 is None or side is None:
            return None
        try:
            clip = Clip.from_sidecar(json.loads(side.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("clips: %s: unreadable sidecar (%s)", side, exc)
            return None
        if clip.id != mp4.stem or _size(mp4) != clip.bytes:
            return None
        return clip

    # --- writing -------------------------------------------------------------------------------
    def path(self, camera: str, clip_id: str) -> Path:
        """Where a clip's MP4 goes (the muxer writes it, then `add` writes the sidecar)."""
        if not CLIP_ID.match(clip_id) or not CLIP_ID.match(camera):
            raise ValueError(f"not a clip id or camera name: {camera!r}/{clip_id!r}")
        d = self.root / camera
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{clip_id}.mp4"

    def add(self, clip: Clip) -> list[str]:
        """The MP4 is in place: write its sidecar (atomically), list it, apply the bounds."""
        side = self.root / clip.camera / f"{clip.id}.json"
        data = json.dumps(clip.sidecar(), separators=(",", ":")).encode()
        try:
            write_atomic(side, data)
        except StateDirError:
            _tmp_of(side).unlink(missing_ok=True)  # what the failed write left (a full disk: its first bytes)
            raise
        clip.side_bytes = len(data)
        with self._lock:
            self._clips[clip.id] = clip
            self.stats.added += 1
            self.stats.clips = len(self._clips)
            self.stats.bytes += clip.bytes + len(data)
            self.stats.written_bytes += clip.bytes + len(data)
        return self.prune()

    def set_pending(self, clip_id: str, pending: bool) -> None:
        with self._lock:
            clip = self._clips.get(clip_id)
            if clip is not None:
                clip.pending = pending

    def mark_uploaded(self, clip_id: str, ok: bool) -> None:
        """The uploader's verdict: the sidecar records a success; either way the clip is no longer pending."""
        with self._lock:
            clip = self._clips.get(clip_id)
            if clip is None:
                return
            clip.pending = False
            if not ok:
                self.stats.upload_failed += 1
                return
            clip.uploaded = True
            self.stats.uploaded += 1
            doc = clip.sidecar()
        data = json.dumps(doc, separators=(",", ":")).encode()
        side = self.root / clip.camera / f"{clip_id}.json"
        try:
            write_atomic(side, data)  # not under the lock: the decode thread reaches `get` (a new clip's id)
        except (StateDirError, OSError) as exc:
            _tmp_of(side).unlink(missing_ok=True)
            logger.warning("clips: %s uploaded, but its sidecar could not be updated: %s", clip_id, exc)
            return
        with self._lock:
            self.stats.written_bytes += len(data)
            if self._clips.get(clip_id) is not clip:  # the bounds removed it meanwhile: no sidecar without its MP4
                side.unlink(missing_ok=True)
                return
            self.stats.bytes += len(data) - clip.side_bytes
            clip.side_bytes = len(data)

    def prune(self) -> list[str]:
        """Apply the bounds: past max_age_s (unless pending), then the oldest until within max_bytes
        (not pending first). Returns what went, one line each."""
        now = self.clock()
        gone: list[tuple[Clip, str]] = []
        with self._lock:
            by_age = sorted(self._clips.values(), key=lambda c: c.start)
            for c in by_age:
                if now - c.start > self.max_age_s and not c.pending:
                    gone.append((c, "age"))
            left = [c for c in by_age if all(c is not g for g, _ in gone)]
            total = self.stats.bytes - sum(_weight(c) for c, _ in gone)
            for c in [c for c in left if not c.pending] + [c for c in left if c.pending]:
                if total <= self.max_bytes:
                    break
                gone.append((c, "bytes"))
                total -= _weight(c)
            for c, why in gone:
                del self._clips[c.id]
                self.stats.bytes -= _weight(c)
                if why == "age":
                    self.stats.removed_age += 1
                else:
                    self.stats.removed_bytes += 1
                    self.stats.dropped_pending += c.pending
            self.stats.clips = len(self._clips)
        lines = []
        for c, why in gone:
            for suffix in (".json", ".mp4"):  # the sidecar first: a half-removed clip is never listed
                (self.root / c.camera / f"{c.id}{suffix}").unlink(missing_ok=True)
            if self.on_removed is not None:
                self.on_removed(self.root / c.camera / f"{c.id}.mp4")
            fsync_dir(self.root / c.camera)
            lines.append(f"removed clip {c.id} ({'older than max_age_h' if why == 'age' else 'over max_mb'})")
        return lines

    # --- reading -------------------------------------------------------------------------------
    def query(self, camera: str | None = None, since: float | None = None, limit: int = 100) -> list[Clip]:
        """The complete clips, newest first; `since`: those that end after it (wall time)."""
        with self._lock:
            clips = sorted(self._clips.values(), key=lambda c: c.start, reverse=True)
        out = [
            c
            for c in clips
            if (camera is None or c.camera == camera) and (since is None or c.start + c.duration_s >= since)
        ]
        return out[: max(0, min(limit, MAX_LIST))]

    def all(self) -> list[Clip]:
        """Every complete clip, oldest first."""
        with self._lock:
            return sorted(self._clips.values(), key=lambda c: c.start)

    def get(self, clip_id: str) -> Clip | None:
        with self._lock:
            return self._clips.get(clip_id)

    def file(self, clip_id: str) -> Path | None:
        clip = self.get(clip_id)
        return None if clip is None else self.root / clip.camera / f"{clip.id}.mp4"

    def summary(self) -> dict[str, Any]:
        """Telemetry's ``clips`` section: numbers, units in the names."""
        with self._lock:
            s = self.stats
            return {
                "clips": s.clips,
                "bytes": s.bytes,
                "added": s.added,
                "written_bytes": s.written_bytes,
                "removed_age": s.removed_age,
                "removed_bytes": s.removed_bytes,
                "dropped_pending": s.dropped_pending,
                "partial_removed": s.partial_removed,
                "uploaded": s.uploaded,
                "upload_failed": s.upload_failed,
                "pending": sum(1 for c in self._clips.values() if c.pending),
            }


def clips_reply(store: ClipStore, args: ClipsArgs) -> dict[str, Any]:
    """The ``clips`` verb's result: the sidecars asked for, newest first, kept under CLIPS_REPLY_BYTES (fewer
    clips and ``"more": true`` past it; also when more clips match than `limit`). A sidecar bigger than the cap
    alone is left out (``"more": true``, logged), not every clip after it."""
    clips = store.query(args.camera, args.since_wall(), args.limit + 1)
    more = len(clips) > args.limit
    docs: list[dict[str, Any]] = []
    size = 0
    for c in clips[: args.limit]:
        doc = c.sidecar()
        n = len(json.dumps(doc)) + 2
        if n > CLIPS_REPLY_BYTES:
            logger.warning("clips: %s left out of a clips reply: its sidecar alone is %d bytes", c.id, n)
            more = True
            continue
        if size + n > CLIPS_REPLY_BYTES:
            more = True
            break
        docs.append(doc)
        size += n
    return {"clips": docs, "more": more, "stored": store.stats.clips}


def _tmp_of(path: Path) -> Path:
    """The temporary file `write_atomic` writes before its rename."""
    return path.with_name(f".{path.name}.tmp")


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return -1


def _weight(c: Clip) -> int:
    """A clip's bytes in the store: its MP4 and its sidecar."""
    return c.bytes + c.side_bytes


# --- HTTP ---------------------------------------------------------------------------------------
class ClipsHTTP:
    """The health server's /clips paths, on its request threads.

    GET /clips                  JSON {"clips": [sidecar, ...]} newest first; ?camera=NAME&since=EPOCH_S&limit=N
    GET /clips/<id>.mp4         the clip's MP4 (video/mp4)
    GET /clips/<id>.json        its sidecar

    Who may fetch, as for /live: without ``health.token_file`` loopback clients only; with it, any client
    giving the token (``?token=T`` or ``Authorization: Bearer T``) and no one else. `token`: the token, or a
    function that reads it (health.token_file, per request: a rotated token is taken up, the old one refused)."""

    def __init__(self, store: ClipStore, token: str | Callable[[], str | None] | None) -> None:
        self.store = store
        self.token = token
        self._count_lock = threading.Lock()
        self.refused = 0
        self.served = 0

    def handle(self, req: BaseHTTPRequestHandler, path: str, query: str) -> None:
        args = {k: v[-1] for k, v in parse_qs(query).items()}
        why = self._refusal(req, args)
        if why:
            with self._count_lock:
                self.refused += 1
            _send(req, 403, "text/plain; charset=utf-8", why.encode() + b"\n")
            return
        if path in ("/clips", "/clips/"):
            self._list(req, args)
            return
        name = path.removeprefix("/clips/")
        stem, dot, ext = name.rpartition(".")
        clip = self.store.get(stem) if dot and CLIP_ID.match(stem) else None
        if clip is None or ext not in ("mp4", "json"):
            _send(req, 404, "application/json", json.dumps({"status": "not found", "path": path}).encode() + b"\n")
            return
        if ext == "json":
            _send(req, 200, "application/json", json.dumps(clip.sidecar()).encode() + b"\n")
            return
        self._file(req, clip)

    def _refusal(self, req: BaseHTTPRequestHandler, args: dict[str, str]) -> str:
        if self.token is None:
            return "" if _loopback(req.client_address[0]) else "clips answer loopback clients only (or the token)"
        try:
            token = self.token() if callable(self.token) else self.token
        except EdgedError as exc:  # the file gone or spoilt since the start: nobody gets in
            logger.error("clips: %s", exc)
            return "the token is unreadable on the device"
        if not token:
            return "the token is unreadable on the device"
        given = args.get("token")
        auth = req.headers.get("Authorization", "")
        if given is None and auth.startswith("Bearer "):
            given = auth[7:].strip()
        if given is None:
            return "clips need the token: ?token=TOKEN or Authorization: Bearer TOKEN"
        return "" if hmac.compare_digest(given.encode(), token.encode()) else "wrong token"

    def _list(self, req: BaseHTTPRequestHandler, args: dict[str, str]) -> None:
        try:
            since = float(args["since"]) if "since" in args else None
            limit = int(args.get("limit", "100"))
        except ValueError:
            _send(req, 400, "text/plain; charset=utf-8", b"since: seconds since the epoch; limit: an integer\n")
            return
        clips = self.store.query(args.get("camera"), since, limit)
        body = json.dumps({"clips": [c.sidecar() for c in clips]}).encode() + b"\n"
        _send(req, 200, "application/json", body)

    def _file(self, req: BaseHTTPRequestHandler, clip: Clip) -> None:
        path = self.store.file(clip.id)
        try:
            f = open(path, "rb") if path is not None else None  # noqa: SIM115 (closed below)
        except OSError:
            f = None
        if f is None:  # removed by the bounds since the lookup
            _send(req, 404, "application/json", b'{"status": "gone"}\n')
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            req.send_response(200)
            req.send_header("Content-Type", "video/mp4")
            req.send_header("Content-Length", str(size))
            req.send_header("Content-Disposition", f'attachment; filename="{clip.id}.mp4"')
            req.end_headers()
            try:
                shutil.copyfileobj(f, req.wfile, 256 * 1024)
            except (BrokenPipeError, ConnectionResetError):
                return
        with self._count_lock:
            self.served += 1


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _send(req: BaseHTTPRequestHandler, status: int, ctype: str, body: bytes) -> None:
    req.send_response(status)
    req.send_header("Content-Type", ctype)
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)
