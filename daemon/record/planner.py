"""Events to clips: per camera with ``record:``, the object events open, extend and close a clip's span, and
the planner's own thread (``clips``) cuts it from the camera's encoded ring, muxes it and stores it.

    object_appeared   opens a span at its first_seen − pre_s, or joins the open one (overlapping events: ONE clip)
    object_ended      the track leaves the span; with no track left the span closes post_s after the last end
    other object events of the camera name the open span
    max_clip_s / clips.max_clip_mb   the span is cut there: that clip is written, a new one goes on with the
                      tracks still alive (no pre-roll: it starts at the keyframe before the cut)
    a new ring segment (the source reopened: caps and timestamps may change) cuts the span likewise

`observe` is called with every event before it is published (app.py ``_event``: the decode thread, the main
loop): a dict update under a lock, nothing else, and the event gains ``"clip": {"id": ...}``. Everything
else (pulling packets from the ring as they come, so that the pre-roll is held however long the event
lasts; the MP4; the store; the ``clip_ready`` event; the upload) happens on the planner's thread.

The pre-roll is taken from the ring as soon as the span opens, and the span's packets are then pulled as they
arrive, so a clip longer than the ring still has its start; memory per open clip is bounded by
``clips.max_clip_mb``.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edged.errors import EdgedError
from edged.protocol.schemas import iso

from ..capture.encoded import EncodedRing, Packet
from ..config import Config
from ..config.cameras import RecordConfig
from .store import Clip, ClipStore

logger = logging.getLogger(__name__)

TICK_S = 0.2  # the planner's thread looks at its open spans this often (and when an event wakes it)
LATE_S = 3.0  # a span's end waits this long past its time for the ring to have its packets (a slow camera)
STOP_FLUSH_S = 20.0  # at a stop, the open spans are written with what the ring holds, within this bound
HOUSEKEEP_S = 60.0  # this often: the store's age bound (a quiet camera adds no clip), refused uploads again
MAX_EVENTS = 500  # events a clip's sidecar names (a busy scene's later ones are counted, not named): ~50 KB


class Muxed(Protocol):
    """What the muxer (record/mux.py `write_mp4`) returns."""

    @property
    def bytes(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def start_wall(self) -> float: ...
    @property
    def duration_s(self) -> float: ...


WriteMp4 = Callable[[str, Sequence[Packet], Path], Muxed]


class Uploads(Protocol):
    """The uploader (delivery/upload.py) as the planner uses it."""

    def enqueue(
        self, local: Path, remote_name: str, content_type: str, on_done: Callable[[str, bool], None] | None = None
    ) -> bool: ...
    def forget(self, local: Path) -> int: ...


@dataclass
class _Span:
    id: str
    camera: str
    start_wall: float  # the first event's start − pre_s (the clip starts on the keyframe at or before it)
    segment: int
    active: set[int] = field(default_factory=set)  # tracks alive in it
    last_end: float = 0.0  # wall time of the latest end (or point event)
    events: list[dict[str, Any]] = field(default_factory=list)
    caps: str = ""
    packets: list[Packet] = field(default_factory=list)
    bytes: int = 0


@dataclass
class PlannerStats:
    written: int = 0
    merged: int = 0  # events that joined an open span (instead of opening one)
    cut: int = 0  # spans cut at max_clip_s, clips.max_clip_mb or a new ring segment
    empty: int = 0  # spans whose ring held no packet (the camera gave none): no clip
    failed: int = 0  # clips the muxer or the disk refused
    gaps: int = 0  # packets the planner missed (evicted from the ring before it pulled them)
    upload_refused: int = 0
    events_dropped: int = 0  # events not named in their clip's sidecar: past MAX_EVENTS


def wall_of(text: str) -> float:
    """An ISO-8601 time as events carry it (``2026-11-29T16:03:11.120Z``) in seconds since the epoch."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class ClipPlanner:
    """The spans of every recording camera, and the ``clips`` thread that writes them."""

    def __init__(
        self,
        rings: Mapping[str, EncodedRing],
        records: Mapping[str, RecordConfig],
        store: ClipStore,
        write: WriteMp4,
        emit: Callable[[dict[str, Any]], None],
        max_clip_bytes: int,
        uploads: Uploads | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`rings`: per recording camera, its encoded ring (a camera without one records nothing); `write`: the
        muxer; `emit`: an event out (``clip_ready``); `uploads`: the uploader, when clips are uploaded."""
        self.rings = dict(rings)
        self.records = {name: records[name] for name in self.rings}
        self.store = store
        self.write = write
        self.emit = emit
        self._halt = threading.Event()  # set by `join`, after the scenes' last events: then the open spans are written
        self.max_clip_bytes = max_clip_bytes
        self.uploads = uploads
        self.clock = clock
        self.stats = PlannerStats()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._open: dict[str, _Span] = {}
        self._track_clip: dict[tuple[str, int], str] = {}
        self._recent: deque[str] = deque(maxlen=256)  # ids given lately (a span that wrote no clip included)
        self._thread: threading.Thread | None = None
        self._refused: set[str] = set()  # clips a full upload queue refused: offered again by `_housekeep`
        self._housekept = clock()

    # --- any thread: the events ----------------------------------------------------------------
    def observe(self, doc: dict[str, Any]) -> None:
        """An event about to be published: an object event of a recording camera opens, joins or ends a span,
        and names its clip (``doc["clip"] = {"id": ...}``)."""
        camera = doc.get("camera")
        kind = doc.get("type", "")
        if not isinstance(camera, str) or camera not in self.rings or not kind.startswith("object_"):
            return
        track = int(doc.get("track_id", 0))
        try:
            first = wall_of(doc["first_seen"])
            last = wall_of(doc.get("last_seen", doc["first_seen"]))
        except (KeyError, TypeError, ValueError):
            first = last = self.clock()
        with self._lock:
            span = self._open.get(camera)
            if kind == "object_appeared":
                if span is None:
                    span = self._new_span(camera, first - self.records[camera].pre_s)
                else:
                    self.stats.merged += 1
                span.active.add(track)
                self._track_clip[(camera, track)] = span.id
            elif span is None:  # an end (or a zone, a line) of a track whose span is written: its clip, if any
                clip_id = self._track_clip.pop((camera, track), None) if kind == "object_ended" else None
                if clip_id is None:
                    clip_id = self._track_clip.get((camera, track))
                if clip_id is not None:
                    doc["clip"] = {"id": clip_id}
                return
            if kind == "object_ended":
                span.active.discard(track)
                self._track_clip.pop((camera, track), None)
            span.last_end = max(span.last_end, last)
            if len(span.events) < MAX_EVENTS:  # the sidecar stays well under the `clips` verb's reply cap
                span.events.append({"type": kind, "track_id": track, "label": doc.get("label"), "ts": iso(last)})
            else:
                self.stats.events_dropped += 1
            doc["clip"] = {"id": span.id}
        self._wake.set()

    def _new_span(self, camera: str, start_wall: float) -> _Span:
        """Under the lock: a new span with a new id (``<camera>-<UTC time of its start>``, unique)."""
        stamp = dt.datetime.fromtimestamp(start_wall, dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"
        base = f"{camera}-{stamp}"
        clip_id, n = base, 1
        while clip_id in self._recent or self.store.get(clip_id) is not None:
            n += 1
            clip_id = f"{base}-{n}"
        self._recent.append(clip_id)
        span = _Span(clip_id, camera, start_wall, self.rings[camera].segment)
        self._open[camera] = span
        return span

    # --- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="clips", daemon=True)
        self._thread.start()

    def join(self, timeout: float = STOP_FLUSH_S) -> None:
        """At the stop, once the cameras have stopped and the scenes' last events are in: the thread writes the
        open spans with what the rings hold and ends."""
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("clips: the open clips were not written within %.0f s of the stop", timeout)

    def _run(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # a loop boundary: one bad clip is a log line and a count, not a dead recorder
                logger.exception("clips: planning failed")
                self.stats.failed += 1
        try:
            self.flush()
        except Exception:
            logger.exception("clips: writing the open clips at the stop failed")
            self.stats.failed += 1

    def tick(self) -> None:
        """Pull the open spans' new packets; write the spans that closed or are cut (planner thread)."""
        now = self.clock()
        if now - self._housekept >= HOUSEKEEP_S or now < self._housekept:
            self._housekept = now
            self._housekeep()
        with self._lock:
            spans = list(self._open.values())
        for span in spans:
            ring = self.rings[span.camera]
            if ring.segment != span.segment:
                self._cut(span, "the camera's stream was reopened")
                continue
            self._pull(span, ring, now)
            rec = self.records[span.camera]
            with self._lock:
                closing = not span.active
                end = span.last_end + rec.post_s
            if closing and (now >= end + LATE_S or (now >= end and (ring.newest_wall() or 0.0) >= end)):
                with self._lock:
                    if span.active:  # a track joined meanwhile: it goes on
                        continue
                    del self._open[span.camera]
                self._finish(span, end)
            elif span.packets and (
                span.packets[-1].wall - span.packets[0].wall >= rec.max_clip_s or span.bytes >= self.max_clip_bytes
            ):
                self._cut(span, "max_clip_s" if span.bytes < self.max_clip_bytes else "clips.max_clip_mb")

    def flush(self) -> None:
        """At the stop: every open span written with what the ring holds now."""
        now = self.clock()
        with self._lock:
            spans = list(self._open.values())
            self._open.clear()
        for span in spans:
            ring = self.rings[span.camera]
            if ring.segment == span.segment:
                self._pull(span, ring, now)
            end = now if span.active else min(span.last_end + self.records[span.camera].post_s, now)
            self._finish(span, end)

    def _pull(self, span: _Span, ring: EncodedRing, now: float) -> None:
        """The ring's packets of the span not taken yet (from the keyframe at or before its start, first)."""
        if not span.packets and (ring.newest_wall() or 0.0) < span.start_wall:
            return  # the ring has not reached the span's start yet: its keyframe before the start is to come
        since = span.packets[-1].wall if span.packets else span.start_wall
        caps, got = ring.span(since, max(now, since) + 1.0)
        if not got:
            return
        if span.packets:
            last = span.packets[-1]
            at = next((i for i in range(len(got) - 1, -1, -1) if got[i] is last or got[i] == last), None)
            if at is None:  # the ring evicted what followed our last packet before we came: take what is newer
                self.stats.gaps += 1
                new = [p for p in got if p.wall > last.wall]
                if new and not new[0].key:
                    new = new[next((i for i, p in enumerate(new) if p.key), len(new)) :]
            else:
                new = got[at + 1 :]
        else:
            span.caps = caps
            new = got
        span.packets.extend(new)
        span.bytes += sum(len(p.data) for p in new)

    def _cut(self, span: _Span, why: str) -> None:
        """Write the span as it is and go on with a new one for its tracks still alive."""
        self.stats.cut += 1
        with self._lock:
            del self._open[span.camera]
            cut_at = span.packets[-1].wall if span.packets else self.clock()
            if span.active:
                new = self._new_span(span.camera, cut_at)
                new.active = set(span.active)
                new.last_end = span.last_end
                for t in new.active:
                    self._track_clip[(span.camera, t)] = new.id
        logger.info("clips: %s cut (%s)", span.id, why)
        self._finish(span, cut_at)

    def _finish(self, span: _Span, end: float) -> None:
        """The span's packets through `end` muxed into the store, announced (``clip_ready``), uploaded."""
        packets = [p for p in span.packets if p.wall <= end]
        if not packets:  # the camera was down, or its stream reopened after the span: nothing to show
            self.stats.empty += 1
            logger.warning("clips: no video for %s: the camera's ring held no packet of its span", span.id)
            return
        path = self.store.path(span.camera, span.id)
        try:
            muxed = self.write(span.caps, packets, path)
        except (EdgedError, OSError) as exc:
            self.stats.failed += 1
            logger.error("clips: %s not written: %s", span.id, exc)
            Path(str(path) + ".part").unlink(missing_ok=True)
            return
        clip = Clip(
            id=span.id,
            camera=span.camera,
            start=muxed.start_wall,
            duration_s=muxed.duration_s,
            bytes=muxed.bytes,
            sha256=muxed.sha256,
            events=span.events,
            pending=self.uploads is not None,
        )
        try:
            lines = self.store.add(clip)
        except (EdgedError, OSError) as exc:  # the sidecar refused (a full disk): the MP4 goes too, never unlisted
            self.stats.failed += 1
            logger.error("clips: %s not stored: %s", span.id, exc)
            path.unlink(missing_ok=True)
            return
        for line in lines:
            logger.info("clips: %s", line)
        self.stats.written += 1
        self.emit({"type": "clip_ready", "camera": span.camera, "clip": ready_doc(clip)})
        if self.uploads is not None:
            self.upload(clip, path)

    def _housekeep(self) -> None:
        """Every HOUSEKEEP_S: the store's bounds (its age bound, on a camera that adds no clip), and the clips a
        full upload queue refused offered again (refused again: counted again, tried at the next round)."""
        for line in self.store.prune():
            logger.info("clips: %s", line)
        for clip_id in sorted(self._refused):
            self._refused.discard(clip_id)
            clip = self.store.get(clip_id)
            path = self.store.file(clip_id)
            if clip is not None and path is not None and not clip.uploaded and not clip.pending:
                self.upload(clip, path)

    def upload(self, clip: Clip, path: Path) -> None:
        """Queue the clip for its PUT; the store keeps it while it waits (within its bounds). Refused (a full
        queue): counted, and offered again every HOUSEKEEP_S while the store keeps it."""
        if self.uploads is None:
            return
        self.store.set_pending(clip.id, True)
        remote = f"{clip.camera}/{clip.id}.mp4"
        ok = self.uploads.enqueue(path, remote, "video/mp4", lambda _n, done: self.store.mark_uploaded(clip.id, done))
        if not ok:
            self.stats.upload_refused += 1
            self.store.set_pending(clip.id, False)
            self._refused.add(clip.id)

    def resume_uploads(self) -> int:
        """At the start: the stored clips not uploaded yet are queued again (the uploader's own durable queue
        takes a file it already holds once). Returns how many."""
        n = 0
        for clip in self.store.all():
            if not clip.uploaded:
                path = self.store.file(clip.id)
                if path is not None:
                    self.upload(clip, path)
                    n += 1
        return n

    def summary(self) -> dict[str, Any]:
        """Telemetry's view of the planner: the store's counters and its own."""
        s = self.stats
        with self._lock:
            open_spans = len(self._open)
        return {
            **self.store.summary(),
            "open": open_spans,
            "written": s.written,
            "merged": s.merged,
            "cut": s.cut,
            "empty": s.empty,
            "failed": s.failed,
            "gaps": s.gaps,
            "upload_refused": s.upload_refused,
            "events_dropped": s.events_dropped,
        }


class Recording(Protocol):
    """A camera as the planner sees it (capture/camera.py `Camera`)."""

    @property
    def name(self) -> str: ...
    @property
    def ring(self) -> EncodedRing | None: ...
    @property
    def record_why(self) -> str: ...


def build_clips(
    cfg: Config,
    cameras: Sequence[Recording],
    write: WriteMp4,
    emit: Callable[[dict[str, Any]], None],
    uploads: Uploads | None,
) -> ClipPlanner | None:
    """The clip store (recovered: what a stop mid-write left is removed) and the planner, for the cameras with
    ``record:`` whose capture feeds a ring; None when there is none. `uploads`: the uploader, used when
    ``clips.upload`` is on (a clip not uploaded yet is queued again at the start)."""
    records = {c.name: c.record for c in cfg.cameras if c.record is not None}
    rings: dict[str, EncodedRing] = {}
    for cam in cameras:
        if cam.name not in records:
            continue
        if cam.ring is None:
            logger.warning("clips: camera %s records no clips: %s", cam.name, cam.record_why or "it has no ring")
            continue
        rings[cam.name] = cam.ring
    if not rings:
        return None
    c = cfg.clips
    up = uploads if c.upload else None
    if c.upload and uploads is None:
        logger.warning("clips: clips.upload is on but there is no upload: section; clips stay on the device")
    store = ClipStore(c.dir or cfg.state_dir / "clips", int(c.max_mb * 2**20), c.max_age_h * 3600.0)
    if up is not None:  # before `recover`: what its bounds remove at the start leaves the upload queue too
        store.on_removed = up.forget
    for line in store.recover(uploads=up is not None):
        logger.warning("clips: %s", line)
    planner = ClipPlanner(rings, records, store, write, emit, int(c.max_clip_mb * 2**20), up)
    if up is not None and (n := planner.resume_uploads()):
        logger.info("clips: %d clip(s) not uploaded yet queued again", n)
    logger.info("clips: recording %s into %s (%d clips kept)", ", ".join(sorted(rings)), store.root, store.stats.clips)
    return planner


def ready_doc(clip: Clip) -> dict[str, Any]:
    """The ``clip`` of a ``clip_ready`` event."""
    return {
        "id": clip.id,
        "camera": clip.camera,
        "start": iso(clip.start),
        "duration_s": round(clip.duration_s, 3),
        "bytes": clip.bytes,
        "sha256": clip.sha256,
        "url_path": clip.url_path,
    }
