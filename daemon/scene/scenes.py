"""Per camera: the detection settings, masks, the tracker, zones, and the object events they give.

    decode thread ──Result──> Scenes.process ──> (Result with track ids and zones, object events)

A camera's `detection:` block (config.CameraDetectionConfig) overrides the global `detection:` for that
camera (score threshold, labels, max detections) and adds a minimum box size, masks (a detection anchored
in one is dropped), zones and tracking. The decoder runs with the loosest settings of all cameras
(`decode_options`); each camera's own are applied here.

Object events (on ``…/events``, schema ``edged.event/1``, types in ``OBJECT_EVENTS``):
  object_appeared  a track is confirmed (min_hits detections in a row)
  object_entered   a confirmed track's anchor point enters a zone
  object_left      it leaves the zone (or the track ends inside it)
  object_crossed   its anchor point crosses a line (lines.py), `direction` in or out; counted per line,
                   direction and label (`Scene.crossings`: telemetry, /metrics, Home Assistant) whatever `publish`
  object_ended     the track ended; `reason` (one of OBJECT_END_REASONS) says why: lost (max_age frames without
                   a detection), stopped (the daemon stops), or the camera's discontinuity (reconnect,
                   loop, stall, scene_cut: FrameMeta.segment changed), which ends every track of the camera
Each carries the camera, track id, label, first/last seen (time and frame), dwell time, best score and
box; appeared and ended carry the best crop so far as a base64 JPEG (`snapshot_kb`).

Bounds (a scene of hundreds of detections a frame made 140-175 events a second, each with a crop): each camera
has two token buckets, `max_events_per_s` and `max_snapshots_per_s`, each holding BURST_S seconds' worth
(at least two): a crowd that arrives at once is reported whole, the rate holds over longer. An opening event
(appeared, entered) goes out only when the bucket holds it *and* its closing event (ended, left): it takes
two tokens, and the closing event is then never dropped, so a subscriber's appeared/ended and entered/left
pairs always match. An appeared that does not fit is dropped with every later event of its track; an
entered, with its left. A track is given snapshots at its appeared (two snapshot tokens: the appeared's and
the ended's), and only its crops are ever encoded. What is dropped is counted per camera (`Scene.dropped`,
`Scene.snapshots_dropped`: telemetry) and logged, throttled.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edged.errors import EdgedError
from edged.protocol.schemas import OBJECT_END_REASONS, iso

from ..config import CameraConfig, CameraDetectionConfig, DetectionConfig
from ..decoders import DecodeOptions, Detection
from ..inference import Result
from .draw import fit_jpeg
from .lines import Lines
from .tracker import Track, Tracker
from .zones import Polygons, anchor_point

logger = logging.getLogger(__name__)

OBJECT_EVENTS = ("object_appeared", "object_entered", "object_left", "object_ended", "object_crossed")
# (camera name, seq) -> the frame of that seq (BGR, source size) while the camera keeps it, else None
FrameSource = Callable[[str, int], "np.ndarray | None"]
Clock = Callable[[], float]  # seconds, monotonic
DROP_LOG_S = 60.0  # a camera over its caps says so at the first drop, then at most once a minute
BURST_S = 10.0  # the caps' buckets hold this many seconds' worth: the spool smooths a burst, the rate is what lasts


def decode_options(detection: DetectionConfig, cameras: Sequence[CameraConfig]) -> DecodeOptions:
    """What the decoder keeps: the global settings, loosened to what any camera's own settings need
    (each camera's are applied again by its Scene)."""
    score, most = detection.score_threshold, detection.max_detections
    labels: set[str] | None = set(detection.labels) if detection.labels else None
    for c in cameras:
        d = c.detection
        if d is None:
            continue
        score = min(score, d.score_threshold if d.score_threshold is not None else score)
        if d.tracking.enabled and d.tracking.low_score_threshold is not None:
            score = min(score, d.tracking.low_score_threshold)
        most = max(most, d.max_detections or most)
        cam_labels = d.labels if d.labels is not None else detection.labels
        if labels is not None:
            labels = None if not cam_labels else labels | set(cam_labels)
    return DecodeOptions(score, detection.iou_threshold, most, frozenset(labels or ()))


class Budget:
    """A token bucket: `rate` tokens a second, holding at most `burst`."""

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()

    def take(self, n: float) -> bool:
        """Spend `n` tokens if the bucket holds them."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens < n:
            return False
        self._tokens -= n
        return True


class Scene:
    """One camera's filter, tracker and zones; not thread-safe (the decode thread owns it)."""

    def __init__(
        self,
        camera: str,
        detection: DetectionConfig,
        own: CameraDetectionConfig | None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.camera = camera
        d = own or CameraDetectionConfig()
        self.cfg = d
        self.score = d.score_threshold if d.score_threshold is not None else detection.score_threshold
        labels = d.labels if d.labels is not None else detection.labels
        self.labels = frozenset(labels)
        self.max_detections = d.max_detections or detection.max_detections
        low = d.tracking.low_score_threshold if d.tracking.enabled else None
        self.floor = min(self.score, low) if low is not None else self.score
        self.zones = Polygons(d.zones, f"camera {camera}: zone")
        self.masks = Polygons(d.masks, f"camera {camera}: mask")
        self.lines = Lines(d.lines, f"camera {camera}: line")
        self.crossings: Counter[tuple[str, str, str]] = Counter()  # (line, in|out, label) -> since the start
        self.tracker = Tracker(d.tracking, self.score) if d.tracking.enabled else None
        self.publish_frames = d.publish in ("frames", "both")
        self.publish_events = d.publish in ("events", "both")
        self.events = 0  # object events made to go out
        self.dropped = 0  # object events over max_events_per_s (with their closing events)
        self.snapshots_dropped = 0  # appeared/ended events sent without their snapshot: over max_snapshots_per_s
        self._budget = Budget(d.max_events_per_s, max(2.0, d.max_events_per_s * BURST_S), clock)
        self._snapshots = Budget(d.max_snapshots_per_s, max(2.0, d.max_snapshots_per_s * BURST_S), clock)
        self._clock = clock
        self._logged_at: float | None = None
        # a motion-gated camera's tracks age by inferred frames (a skipped frame is one where nothing
        # moved: a still object is still there); others by the camera's frame count (FrameMeta.seq, which never
        # goes back), so dropped frames count
        self.gated = d.motion is not None
        self._tick = 0
        self._segment = 0  # FrameMeta.segment of the latest frame: a change ends every track
        # the segment whose tracks `Scenes.end_tracks` ended while the camera was down: results of it still in
        # flight are published untracked, so they start no track that the next segment would end again
        self._closed_segment: int | None = None

    def _keep(self, det: Detection, w: int, h: int) -> bool:
        if det.score < self.floor or (self.labels and det.label not in self.labels):
            return False
        x1, y1, x2, y2 = det.box
        if min(x2 - x1, y2 - y1) < self.cfg.min_box_px:
            return False
        return not (self.masks and self.masks.containing(anchor_point(det.box, self.cfg.anchor), w, h))

    def process(self, r: Result, frame: np.ndarray | None) -> tuple[Result, list[dict[str, Any]]]:
        t = r.meta.transform
        w, h = t.src_width, t.src_height
        dets = [d for d in r.detections if self._keep(d, w, h)]
        events: list[dict[str, Any]] = []
        if r.meta.segment != self._segment and self.tracker is not None:  # a reconnect, loop wrap, stall or cut
            self._segment = r.meta.segment
            for gone in self.tracker.close():
                events.extend(self._ended(gone, r.meta.segment_reason))
        if self.tracker is None or r.meta.segment == self._closed_segment:
            out = sorted((d for d in dets if d.score >= self.score), key=lambda d: -d.score)[: self.max_detections]
            if self.zones:
                out = [self._with_zones(d, w, h) for d in out]
            return dataclasses.replace(r, detections=out), events
        self._tick += 1
        up = self.tracker.update([(d.label, d.score, d.box) for d in dets], self._tick if self.gated else r.meta.seq)
        for new in up.confirmed:
            new.extra.update(
                first_seen=new.extra.get("first_seen", r.meta.captured_at),
                first_frame=new.extra.get("first_frame", r.meta.frame),
                zones=[],
            )
        out = []
        for det, track in zip(dets, up.tracks, strict=True):
            if det.score < self.score and track is None:
                continue  # a low-score detection continues a track or is nothing
            zones = self.zones.containing(anchor_point(det.box, self.cfg.anchor), w, h) if self.zones else []
            if track is not None:
                self._seen(track, det, r, frame, zones, events)
            if det.score >= self.score:
                out.append(dataclasses.replace(det, track_id=track.id if track else None, zones=tuple(zones)))
        # tentative tracks remember when they were first seen, for the appeared event
        for tentative in self.tracker.tracks:
            if not tentative.confirmed:
                tentative.extra.setdefault("first_seen", r.meta.captured_at)
                tentative.extra.setdefault("first_frame", r.meta.frame)
        if self.lines:
            self._cross(w, h, self._tick if self.gated else r.meta.seq, events)
        for gone in up.ended:
            events.extend(self._ended(gone, "lost"))
        out.sort(key=lambda d: -d.score)
        return dataclasses.replace(r, detections=out[: self.max_detections]), events

    def _with_zones(self, d: Detection, w: int, h: int) -> Detection:
        return dataclasses.replace(d, zones=tuple(self.zones.containing(anchor_point(d.box, self.cfg.anchor), w, h)))

    def _seen(
        self,
        track: Track,
        det: Detection,
        r: Result,
        frame: np.ndarray | None,
        zones: list[str],
        events: list[dict[str, Any]],
    ) -> None:
        x = track.extra
        new = "appeared" not in x
        x["last_seen"] = r.meta.captured_at
        x["last_frame"] = r.meta.frame
        sent = new and self._open(track, "")
        if new:
            x["appeared"] = True
        if sent and frame is not None and self.cfg.snapshot_kb > 0:
            x["snap"] = self._snapshots.take(2)  # the appeared's crop and the ended's
        if x.get("snap") and det.score > float(x.get("crop_score", -1.0)) and frame is not None:
            x["crop"] = self._crop(frame, det.box)
            x["crop_score"] = det.score
        if sent:
            events.append(self._event("object_appeared", track, snapshot=True))
        was: list[str] = list(x.get("zones", []))
        for z in zones:
            if z not in was:
                x.setdefault("zone_since", {})[z] = r.meta.captured_at
                if self._open(track, z):
                    events.append(self._event("object_entered", track, zone=z))
        for z in was:
            if z not in zones:
                self._left(track, z, r.meta.captured_at, events)
        x["zones"] = zones

    def _cross(self, w: int, h: int, now: int, events: list[dict[str, Any]]) -> None:
        """Line crossings of the tracks detected on this frame (lines.py); each takes one event token, and none
        goes out once the track's appeared was dropped."""
        for t, c in self.lines.moved(self.tracker.tracks if self.tracker else [], now, self.cfg.anchor, w, h):
            self.crossings[(c.line, c.direction, t.label)] += 1
            if not self.publish_events or ("" not in t.extra.get("unsent", ()) and self._budget.take(1)):
                events.append(self._event("object_crossed", t, line=c.line, direction=c.direction))
            else:
                self._drop()

    def _open(self, track: Track, key: str) -> bool:
        """Whether an opening event goes out (`key`: "" for the appeared, the zone for an entered): the
        track's appeared went out and the budget holds it and its closing event. Else it is dropped, and
        remembered so that its closing event is dropped too."""
        unsent: set[str] = track.extra.setdefault("unsent", set())
        if not self.publish_events or ("" not in unsent and self._budget.take(2)):
            return True
        unsent.add(key)
        self._drop()
        return False

    def _close(self, track: Track, key: str) -> bool:
        """Whether a closing event (ended: "", left: the zone) goes out: always, unless its opening did not."""
        unsent: set[str] = track.extra.get("unsent", set())
        if "" in unsent or key in unsent:
            if key:
                unsent.discard(key)  # the zone entered again later opens afresh (a dropped track stays dropped)
            self._drop()
            return False
        return True

    def _drop(self) -> None:
        self.dropped += 1
        self._log_drops()

    def _log_drops(self) -> None:
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= DROP_LOG_S:
            self._logged_at = now
            logger.warning(
                "camera %s is over its event caps: so far %d object events dropped (max_events_per_s %g), "
                "%d snapshots left out (max_snapshots_per_s %g); counted in telemetry (cameras.%s)",
                self.camera,
                self.dropped,
                self.cfg.max_events_per_s,
                self.snapshots_dropped,
                self.cfg.max_snapshots_per_s,
                self.camera,
            )

    def _left(self, track: Track, zone: str, now: float, events: list[dict[str, Any]]) -> None:
        if self._close(track, zone):
            since = track.extra.get("zone_since", {}).get(zone, now)
            events.append(self._event("object_left", track, zone=zone, zone_dwell_s=round(now - since, 3)))

    def _ended(self, track: Track, reason: str) -> list[dict[str, Any]]:
        """The events of a track that ended (none for one that never appeared): left its zones, ended."""
        if reason not in OBJECT_END_REASONS:
            raise ValueError(f"object_ended reason {reason!r}; one of {', '.join(OBJECT_END_REASONS)}")
        if "appeared" not in track.extra:
            return []
        last = float(track.extra.get("last_seen", 0.0))
        out: list[dict[str, Any]] = []
        for z in track.extra.get("zones", []):
            self._left(track, z, last, out)
        if self._close(track, ""):
            out.append(self._event("object_ended", track, snapshot=True, reason=reason))
        return out

    def _crop(self, frame: np.ndarray, box: tuple[float, float, float, float]) -> bytes | None:
        if self.cfg.snapshot_kb <= 0:
            return None
        h, w = frame.shape[:2]
        x1, y1, x2, y2 = (round(v) for v in box)
        x1, y1, x2, y2 = max(0, x1), max(0, y1), min(w, x2), min(h, y2)
        if x2 - x1 < 2 or y2 - y1 < 2:
            return None
        try:
            return fit_jpeg(np.ascontiguousarray(frame[y1:y2, x1:x2]), self.cfg.snapshot_kb * 1024).data
        except EdgedError:
            return None  # a crop that does not fit the cap goes without

    def _event(self, kind: str, track: Track, snapshot: bool = False, **more: Any) -> dict[str, Any]:
        self.events += 1
        x = track.extra
        first = float(x.get("first_seen", 0.0))
        last = float(x.get("last_seen", first))
        doc: dict[str, Any] = {
            "type": kind,
            "camera": self.camera,
            "track_id": track.id,
            "label": track.label,
            "first_seen": iso(first),
            "last_seen": iso(last),
            "first_frame": int(x.get("first_frame", 0)),
            "last_frame": int(x.get("last_frame", x.get("first_frame", 0))),
            "dwell_s": round(max(0.0, last - first), 3),
            "best_score": round(track.best_score, 4),
            "box": [round(v, 1) for v in track.box],
            "zones": list(x.get("zones", [])),
            **more,
        }
        crop = x.get("crop")
        if snapshot and isinstance(crop, bytes):
            doc["snapshot"] = {"format": "jpeg", "data": base64.b64encode(crop).decode("ascii")}
        elif snapshot and x.get("snap") is False:
            self.snapshots_dropped += 1
            self._log_drops()
        return doc


class Scenes:
    """Every camera's Scene; `process` is the decode thread's hook, `end_tracks` the main loop's for a
    camera that is down, `close` ends the tracks at stop. One lock keeps them apart."""

    def __init__(
        self,
        detection: DetectionConfig,
        cameras: Sequence[CameraConfig],
        frames: FrameSource,
        clock: Clock = time.monotonic,
    ) -> None:
        """`clock`: the caps' time (monotonic seconds)."""
        self.scenes = {c.name: Scene(c.name, detection, c.detection, clock) for c in cameras}
        self._settings = {c.name: (detection, c.detection) for c in cameras}
        self._clock = clock
        self._frames = frames
        self.errors = 0
        self._lock = threading.Lock()

    def reconfigure(self, detection: DetectionConfig, cameras: Sequence[CameraConfig]) -> list[dict[str, Any]]:
        """New settings (a reload, a remote document): each camera whose own or the global detection settings
        changed gets a new Scene (its filters, zones, masks, tracker, publish mode, caps) between two results;
        its live tracks end (reason ``stopped``) and those ended events are returned, to be sent."""
        ended: list[dict[str, Any]] = []
        with self._lock:
            for c in cameras:
                if c.name not in self.scenes or self._settings.get(c.name) == (detection, c.detection):
                    continue
                old = self.scenes[c.name]
                if old.tracker is not None:
                    for track in old.tracker.close():
                        if old.publish_events:
                            ended.extend(old._ended(track, "stopped"))
                self.scenes[c.name] = new = Scene(c.name, detection, c.detection, self._clock)
                kept = {line.name for line in new.lines.configs}  # a line that stays keeps its counts
                new.crossings.update({k: n for k, n in old.crossings.items() if k[0] in kept})
                self._settings[c.name] = (detection, c.detection)
                logger.info("camera %s: scene settings changed (zones, masks, filters, tracking, publish)", c.name)
        return ended

    def process(self, r: Result) -> tuple[Result, list[dict[str, Any]], bool]:
        """(the result as published, the object events to send, whether the result itself goes out)."""
        scene = self.scenes.get(r.camera)
        if scene is None:
            return r, [], True
        # the crop comes from the frame the boxes were found in, or there is none this time (the camera read on
        # past the frames it keeps): a later frame's crop would show what the boxes did not
        frame = self._frames(r.camera, r.meta.seq) if self.crops(r.camera) else None
        with self._lock:  # the camera's scene now: `reconfigure` may have replaced it meanwhile
            return self._process(self.scenes.get(r.camera, scene), r, frame)

    def crops(self, camera: str) -> bool:
        """Whether `camera`'s events carry crops (cut from the frames the camera keeps: Camera.frame_for)."""
        scene = self.scenes.get(camera)
        return scene is not None and scene.publish_events and scene.cfg.snapshot_kb > 0

    def end_tracks(self, camera: str, reason: str, segment: int) -> list[dict[str, Any]]:
        """End every track of `camera` now (it went down in `segment`: `reason` is why), not at its next frame,
        which may be long in coming; the ended events to send. Results of that segment still in flight are then
        published untracked (no phantom track that would appear and end twice)."""
        scene = self.scenes.get(camera)
        if scene is None or scene.tracker is None:
            return []
        with self._lock:
            if scene._segment != segment or not scene.tracker.tracks:
                return []  # the scene has moved on to a newer segment already, or there is nothing to end
            scene._closed_segment = segment
            ended = [e for t in scene.tracker.close() for e in scene._ended(t, reason)]
        return ended if scene.publish_events else []

    def _process(self, scene: Scene, r: Result, frame: np.ndarray | None) -> tuple[Result, list[dict[str, Any]], bool]:
        try:
            out, events = scene.process(r, frame)
        except Exception:  # a boundary on the decode thread: the result goes out as decoded, counted
            self.errors += 1
            if self.errors <= 3 or self.errors % 100 == 0:
                logger.exception(
                    "%s: tracking/zones failed on frame %d (%d so far)", r.camera, r.meta.frame, self.errors
                )
            return r, [], scene.publish_frames
        return out, (events if scene.publish_events else []), scene.publish_frames

    def counts(self, camera: str) -> dict[str, int] | None:
        """A camera's object events for telemetry (None: it publishes none): sent, dropped over
        max_events_per_s, and sent without their snapshot over max_snapshots_per_s."""
        s = self.scenes.get(camera)
        if s is None or not s.publish_events:
            return None
        return {"events": s.events, "events_dropped": s.dropped, "snapshots_dropped": s.snapshots_dropped}

    def crossings(self, camera: str) -> dict[str, dict[str, dict[str, int]]] | None:
        """A camera's line crossings since the start, {line: {in|out: {label: n}}}; None without lines."""
        s = self.scenes.get(camera)
        if s is None or not s.lines:
            return None
        with self._lock:
            return s.lines.counts(s.crossings)

    @property
    def dropped(self) -> int:
        """Object events dropped over the caps, every camera."""
        return sum(s.dropped for s in self.scenes.values())

    def close(self) -> list[dict[str, Any]]:
        """The ended events of every live track (the cameras stopped)."""
        out: list[dict[str, Any]] = []
        with self._lock:
            for s in self.scenes.values():
                if s.tracker is not None:
                    for track in s.tracker.close():
                        if s.publish_events:
                            out.extend(s._ended(track, "stopped"))
        return out
