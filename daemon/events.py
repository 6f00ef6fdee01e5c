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
  object_ended     the track is lost (max_age frames without a detection) or the camera stops
Each carries the camera, track id, label, first/last seen (time and frame), dwell time, best score and
box; appeared and ended carry the best crop so far as a base64 JPEG (`snapshot_kb`).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edged.errors import EdgedError
from edged.protocol.schemas import iso

from .annotate import fit_jpeg
from .config import CameraConfig, CameraDetectionConfig, DetectionConfig
from .decoders import DecodeOptions, Detection
from .inference import Result
from .tracker import Track, Tracker
from .zones import Polygons, anchor_point

logger = logging.getLogger(__name__)

OBJECT_EVENTS = ("object_appeared", "object_entered", "object_left", "object_ended")
FrameSource = Callable[[str], "np.ndarray | None"]  # camera name -> its newest frame (BGR), if any


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


class Scene:
    """One camera's filter, tracker and zones; not thread-safe (the decode thread owns it)."""

    def __init__(self, camera: str, detection: DetectionConfig, own: CameraDetectionConfig | None) -> None:
        self.camera = camera
        d = own or CameraDetectionConfig()
        self.cfg = d
        self.score = d.score_threshold if d.score_threshold is not None else detection.score_threshold
        labels = d.labels if d.labels is not None else detection.labels
        self.labels = frozenset(labels)
        self.max_detections = d.max_detections or detection.max_detections
        low = d.tracking.low_score_threshold if d.tracking.enabled else None
        self.floor = min(self.score, low) if low is not None else self.score
        self.zones = Polygons(d.zones)
        self.masks = Polygons(d.masks)
        self.tracker = Tracker(d.tracking, self.score) if d.tracking.enabled else None
        self.publish_frames = d.publish in ("frames", "both")
        self.publish_events = d.publish in ("events", "both")
        self.events = 0
        # a motion-gated camera's tracks age by inferred frames (a skipped frame is one where nothing
        # moved: a still object is still there); others by the frame index, so dropped frames count
        self.gated = d.motion is not None
        self._tick = 0

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
        if self.tracker is None:
            out = sorted((d for d in dets if d.score >= self.score), key=lambda d: -d.score)[: self.max_detections]
            if self.zones:
                out = [self._with_zones(d, w, h) for d in out]
            return dataclasses.replace(r, detections=out), events
        self._tick += 1
        up = self.tracker.update([(d.label, d.score, d.box) for d in dets], self._tick if self.gated else r.meta.frame)
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
        for gone in up.ended:
            events.extend(self._ended(gone))
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
        if det.score > float(x.get("crop_score", -1.0)) and frame is not None and self.publish_events:
            x["crop"] = self._crop(frame, det.box)
            x["crop_score"] = det.score
        if new:
            x["appeared"] = True
            events.append(self._event("object_appeared", track, snapshot=True))
        was: list[str] = list(x.get("zones", []))
        for z in zones:
            if z not in was:
                x.setdefault("zone_since", {})[z] = r.meta.captured_at
                events.append(self._event("object_entered", track, zone=z))
        for z in was:
            if z not in zones:
                events.append(self._left(track, z, r.meta.captured_at))
        x["zones"] = zones

    def _left(self, track: Track, zone: str, now: float) -> dict[str, Any]:
        since = track.extra.get("zone_since", {}).get(zone, now)
        return self._event("object_left", track, zone=zone, zone_dwell_s=round(now - since, 3))

    def _ended(self, track: Track) -> list[dict[str, Any]]:
        last = float(track.extra.get("last_seen", 0.0))
        out = [self._left(track, z, last) for z in track.extra.get("zones", [])]
        out.append(self._event("object_ended", track, snapshot=True))
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
        return doc


class Scenes:
    """Every camera's Scene; `process` is the decode thread's hook, `close` ends the tracks at stop."""

    def __init__(self, detection: DetectionConfig, cameras: Sequence[CameraConfig], frames: FrameSource) -> None:
        self.scenes = {c.name: Scene(c.name, detection, c.detection) for c in cameras}
        self._frames = frames
        self.errors = 0

    def process(self, r: Result) -> tuple[Result, list[dict[str, Any]], bool]:
        """(the result as published, the object events to send, whether the result itself goes out)."""
        scene = self.scenes.get(r.camera)
        if scene is None:
            return r, [], True
        frame = self._frames(r.camera) if scene.publish_events and scene.cfg.snapshot_kb > 0 else None
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

    def close(self) -> list[dict[str, Any]]:
        """The ended events of every live track (the cameras stopped)."""
        out: list[dict[str, Any]] = []
        for s in self.scenes.values():
            if s.tracker is not None:
                for track in s.tracker.close():
                    if s.publish_events and "appeared" in track.extra:
                        out.extend(s._ended(track))
        return out
