"""The tracker on synthetic boxes (crossing objects, a missed frame), zones, and a camera's Scene."""

from __future__ import annotations

import base64
import dataclasses
import threading

import cv2
import jsonschema
import numpy as np
import pydantic
import pytest

from edged.daemon.capture.camera import SEGMENT_REASONS, TAKEN_KEPT, Camera, FrameMeta
from edged.daemon.capture.preprocess import Preprocessor, Transform
from edged.daemon.config import CameraConfig, CameraDetectionConfig, DetectionConfig, TrackingConfig, ZoneConfig
from edged.daemon.decoders import Detection
from edged.daemon.inference import Result
from edged.daemon.scene.scenes import Scene, Scenes, decode_options
from edged.daemon.scene.tracker import Tracker
from edged.daemon.scene.zones import Polygons, anchor_point, inside
from edged.protocol import EVENT_SCHEMA, schema
from edged.protocol.schemas import OBJECT_END_REASONS

from .conftest import wait_until
from .test_capture import SPEC


def box(cx: float, cy: float, s: float = 40.0) -> tuple[float, float, float, float]:
    return (cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2)


def test_crossing_objects_keep_their_ids_through_a_missed_frame() -> None:
    t = Tracker(TrackingConfig(min_hits=2, max_age=5), high_score=0.5)
    ids: dict[str, set[int]] = {"a": set(), "b": set()}
    for f in range(40):
        # a goes right, b goes left on a slightly lower line: they cross around frame 20
        dets = [("face", 0.9, box(100 + 10 * f, 200)), ("face", 0.8, box(500 - 10 * f, 215))]
        if f == 12:
            dets = dets[1:]  # a missed on one frame
        up = t.update(dets, f)
        for (_, _, b), tr in zip(dets, up.tracks, strict=True):
            if tr is not None:
                ids["a" if abs(b[1] - 180) < 1 else "b"].add(tr.id)
    assert ids == {"a": {1}, "b": {2}}, ids
    assert all(tr.confirmed for tr in t.tracks) and len(t.tracks) == 2


def test_a_track_ends_after_max_age_and_a_tentative_one_is_forgotten() -> None:
    t = Tracker(TrackingConfig(min_hits=3, max_age=3), high_score=0.5)
    for f in range(5):
        up = t.update([("face", 0.9, box(100, 100))], f)
    assert up.tracks[0] is not None and up.tracks[0].id == 1
    up = t.update([("face", 0.9, box(400, 400))], 5)  # a newcomer, tentative, far away
    assert up.tracks == [None] and not up.ended
    for f in range(6, 8):  # misses 2 and 3 (frame 5 was the first): still alive
        up = t.update([], f)
        assert not up.ended
    assert [tr.id for tr in t.tracks] == [1]  # the tentative newcomer missed a frame: forgotten
    up = t.update([], 8)  # the 4th miss > max_age 3: ended
    assert [tr.id for tr in up.ended] == [1] and not t.tracks


def test_low_score_detections_continue_a_track_but_never_start_one() -> None:
    t = Tracker(TrackingConfig(min_hits=1, max_age=2, low_score_threshold=0.1), high_score=0.5)
    t.update([("face", 0.9, box(100, 100))], 0)
    up = t.update([("face", 0.2, box(105, 100)), ("face", 0.2, box(400, 400))], 1)
    assert up.tracks[0] is not None and up.tracks[0].id == 1 and up.tracks[1] is None
    assert len(t.tracks) == 1


def test_a_size_jump_starts_a_new_track_whatever_the_iou() -> None:
    t = Tracker(TrackingConfig(min_hits=1, max_age=5), high_score=0.5)
    t.update([("person", 0.9, (100.0, 100.0, 140.0, 200.0))], 0)
    # twice as wide, IoU 0.4 (over the 0.3 threshold): another object where the first one was
    big = (100.0, 100.0, 200.0, 200.0)
    up = t.update([("person", 0.9, big)], 1)
    assert up.tracks[0] is not None and up.tracks[0].id == 2
    up = t.update([("person", 0.9, (102.0, 100.0, 190.0, 200.0))], 2)  # 12 % smaller: the same one
    assert up.tracks[0] is not None and up.tracks[0].id == 2


def test_the_tracker_refuses_a_clock_that_goes_back() -> None:
    t = Tracker(TrackingConfig(min_hits=1, max_age=3), high_score=0.5)
    t.update([("face", 0.9, box(100, 100))], 500)
    t.update([], 500)  # the same frame count again (a motion-gated camera's tick never repeats, but it may)
    with pytest.raises(ValueError, match="frame 0 after frame 500: the tracker's clock must never go back"):
        t.update([("face", 0.9, box(100, 100))], 0)


def test_labels_do_not_mix() -> None:
    t = Tracker(TrackingConfig(min_hits=1), high_score=0.5)
    t.update([("cat", 0.9, box(100, 100))], 0)
    up = t.update([("dog", 0.9, box(100, 100))], 1)
    assert up.tracks[0] is not None and up.tracks[0].id == 2


def test_zones_in_pixels_and_normalised() -> None:
    square = [(0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0)]
    assert inside(50, 50, square) and inside(100, 50, square) and not inside(101, 50, square)
    zones = Polygons([ZoneConfig(name="left", points=[(0, 0), (0.5, 0), (0.5, 1), (0, 1)], normalized=True)])
    assert zones.containing((100, 100), 960, 540) == ["left"]
    assert zones.containing((600, 100), 960, 540) == []
    assert anchor_point((0, 0, 10, 20), "bottom") == (5, 20) and anchor_point((0, 0, 10, 20), "center") == (5, 10)


# --- a camera's Scene: its own settings, masks, zones, events ---------------------------------------------


def result(
    frame: int,
    dets: list[Detection],
    camera: str = "cam",
    seq: int | None = None,
    segment: tuple[int, str] = (0, "start"),
) -> Result:
    """A result of `frame` (the camera's per-open index); `seq`: its frame count over its life (default `frame`)."""
    t = Transform(1, 1, 0, 0, 640, 480)
    seq = frame if seq is None else seq
    meta = FrameMeta(frame, 1_000_000.0 + seq / 10, float(seq), t, float(seq), seq, *segment)
    return Result(camera, meta, dets, 1.0, float(seq), "m", 1)


def det(label: str, score: float, b: tuple[float, float, float, float]) -> Detection:
    return Detection(label, 0, score, b)


def test_a_cameras_own_settings_override_the_global_ones() -> None:
    glob = DetectionConfig(score_threshold=0.7, labels=["face"], max_detections=5)
    own = CameraDetectionConfig(
        score_threshold=0.4,
        labels=["face", "cat"],
        max_detections=2,
        min_box_px=10,
        masks=[{"name": "tv", "points": [(0, 0), (100, 0), (100, 100), (0, 100)]}],
        tracking={"enabled": False},
    )
    cams = [CameraConfig(name="cam", uri="synthetic://", detection=own), CameraConfig(name="b", uri="synthetic://")]
    opts = decode_options(glob, cams)
    assert opts.score_threshold == 0.4 and opts.max_detections == 5 and opts.labels == {"face", "cat"}
    s = Scene("cam", glob, own)
    dets = [
        det("face", 0.5, (200, 200, 250, 250)),  # kept: 0.5 >= the camera's 0.4
        det("face", 0.3, (300, 200, 350, 250)),  # under the camera's threshold
        det("dog", 0.9, (200, 300, 250, 350)),  # a label the camera does not keep
        det("cat", 0.9, (400, 300, 405, 350)),  # 5 px wide: under min_box_px
        det("face", 0.95, (20, 20, 60, 60)),  # its center is in the mask
        det("cat", 0.6, (400, 100, 450, 150)),
        det("face", 0.45, (500, 100, 550, 150)),  # the third kept: over max_detections 2
    ]
    out, events = s.process(result(0, dets), None)
    assert [(d.label, d.score) for d in out.detections] == [("cat", 0.6), ("face", 0.5)] and not events
    other = Scene("b", glob, None)  # no block: the global settings
    out, _ = other.process(result(0, dets, "b"), None)
    assert [(d.label, d.score) for d in out.detections] == [("face", 0.95)]


def test_scene_events_with_zones_and_a_snapshot() -> None:
    own = CameraDetectionConfig(
        zones=[{"name": "door", "points": [(0.5, 0), (1, 0), (1, 1), (0.5, 1)], "normalized": True}],
        tracking={"min_hits": 2, "max_age": 2},
        publish="events",
    )
    frame = np.full((480, 640, 3), 128, np.uint8)
    scenes = Scenes(
        DetectionConfig(score_threshold=0.5),
        [CameraConfig(name="cam", uri="synthetic://", detection=own)],
        lambda *_: frame,
    )
    kinds = []
    for f in range(12):  # a face walks right across the door's edge (x = 320), then is gone
        dets = [det("face", 0.9, (250 + 20 * f, 200, 290 + 20 * f, 240))] if f < 8 else []
        _, events, frames_out = scenes.process(result(f, dets))
        assert not frames_out  # publish: events
        kinds += [(e["type"], e.get("zone"), e["last_frame"]) for e in events]
    kinds += [(e["type"], e.get("zone"), e["last_frame"]) for e in scenes.close()]
    assert kinds == [
        ("object_appeared", None, 1),
        ("object_entered", "door", 3),  # center 330 > 320 on frame 3
        ("object_left", "door", 7),  # the track ended inside the zone
        ("object_ended", None, 7),
    ]


def test_snapshot_in_appeared_and_ended() -> None:
    own = CameraDetectionConfig(tracking={"min_hits": 1}, publish="both", snapshot_kb=8)
    frame = np.random.default_rng(0).integers(0, 255, (480, 640, 3), np.uint8)
    scenes = Scenes(DetectionConfig(), [CameraConfig(name="cam", uri="synthetic://", detection=own)], lambda *_: frame)
    _, events, frames_out = scenes.process(result(0, [det("face", 0.9, (10, 10, 200, 200))]))
    assert frames_out and events[0]["type"] == "object_appeared"
    jpg = base64.b64decode(events[0]["snapshot"]["data"])
    assert jpg[:2] == b"\xff\xd8" and len(jpg) <= 8 * 1024
    (ended,) = scenes.close()
    assert ended["type"] == "object_ended" and ended["snapshot"] == events[0]["snapshot"]


def test_a_reopen_ends_the_tracks_with_its_reason_and_ids_go_on() -> None:
    """The frame index starts again at 0 after a reconnect (and a loop wrap): the tracks age by the camera's
    frame count, and the new segment ends them with its reason; a face where the old one was is a new track."""
    own = CameraDetectionConfig(tracking={"min_hits": 2, "max_age": 3}, publish="events")
    scenes = Scenes(DetectionConfig(), [CameraConfig(name="cam", uri="synthetic://", detection=own)], lambda *_: None)
    face = [det("face", 0.9, (100, 100, 140, 140))]
    got = []
    for f in range(10):
        got += scenes.process(result(f, face if f < 6 else []))[1]
    assert [(e["type"], e["track_id"], e.get("reason")) for e in got] == [
        ("object_appeared", 1, None),
        ("object_ended", 1, "lost"),  # frames 6-9 without it: over max_age 3
    ]
    got = []
    for seq in range(10, 20):  # the frame index is 0 again, the frame count goes on (a reopen; its segment below)
        got += scenes.process(result(seq - 10, face, seq=seq, segment=(0, "start")))[1]
    got += scenes.process(result(0, face, seq=20, segment=(1, "reconnect")))[1]
    got += scenes.process(result(1, face, seq=21, segment=(1, "reconnect")))[1]
    got += scenes.process(result(0, face, seq=22, segment=(2, "loop")))[1]
    assert [(e["type"], e["track_id"], e.get("reason")) for e in got] == [
        ("object_appeared", 2, None),
        ("object_ended", 2, "reconnect"),
        ("object_appeared", 3, None),
        ("object_ended", 3, "loop"),  # its successor is still tentative (min_hits 2)
    ]
    got = scenes.process(result(1, face, seq=23, segment=(2, "loop")))[1] + scenes.close()
    assert [(e["type"], e["track_id"], e.get("reason")) for e in got] == [
        ("object_appeared", 4, None),
        ("object_ended", 4, "stopped"),
    ]
    assert all(e["first_frame"] <= e["last_frame"] for e in got)


def test_results_in_flight_after_a_camera_went_down_start_no_track() -> None:
    """The main loop ends a down camera's tracks at once (`end_tracks`); results of that segment still in the
    pipeline then go out untracked: the face does not appear (and end) a second time before the reconnect."""
    own = CameraDetectionConfig(tracking={"min_hits": 1, "max_age": 3}, publish="events")
    scenes = Scenes(DetectionConfig(), [CameraConfig(name="cam", uri="synthetic://", detection=own)], lambda *_: None)
    face = [det("face", 0.9, (100, 100, 140, 140))]
    got = scenes.process(result(0, face))[1]
    got += scenes.end_tracks("cam", "reconnect", segment=0)
    late, events = scenes.process(result(1, face))[:2]  # batched before the camera went down
    got += events
    assert [d.track_id for d in late.detections] == [None]
    assert scenes.end_tracks("cam", "reconnect", segment=0) == []  # asked again while it stays down
    got += scenes.process(result(0, face, seq=2, segment=(1, "reconnect")))[1]
    got += scenes.close()
    assert [(e["type"], e["track_id"], e.get("reason")) for e in got] == [
        ("object_appeared", 1, None),
        ("object_ended", 1, "reconnect"),
        ("object_appeared", 2, None),
        ("object_ended", 2, "stopped"),
    ]
    # a camera that came back before the main loop asked: its new segment's tracks are not ended
    scenes = Scenes(DetectionConfig(), [CameraConfig(name="cam", uri="synthetic://", detection=own)], lambda *_: None)
    scenes.process(result(0, face, seq=5, segment=(1, "reconnect")))
    assert scenes.end_tracks("cam", "reconnect", segment=0) == []


def test_camera_detection_config_errors() -> None:
    bad = [
        {"zones": [{"name": "z", "points": [(0, 0), (2, 0), (1, 1)], "normalized": True}]},  # over 1
        {"zones": [{"name": "z", "points": [(0, 0), (1, 0)]}]},  # two points
        {"zones": [{"name": "z", "points": [(0, 0), (1, 0), (1, 1)]}] * 2},  # the same name twice
        {"publish": "events", "tracking": {"enabled": False}},
        {"publish": "all"},
        {"tracking": {"max_age": -1}},
    ]
    for doc in bad:
        with pytest.raises(pydantic.ValidationError):
            CameraDetectionConfig.model_validate(doc)


def test_object_events_fit_the_shipped_event_schema() -> None:
    own = CameraDetectionConfig(tracking={"min_hits": 1}, publish="events")
    frame = np.zeros((480, 640, 3), np.uint8)
    scenes = Scenes(DetectionConfig(), [CameraConfig(name="cam", uri="synthetic://", detection=own)], lambda *_: frame)
    _, events, _ = scenes.process(result(0, [det("face", 0.9, (10, 10, 200, 200))]))
    events += scenes.close()
    head = {"schema": EVENT_SCHEMA, "device": "d", "boot_id": "0" * 32, "ts": "2026-11-30T16:00:00.000Z"}
    check = jsonschema.Draft202012Validator(schema(EVENT_SCHEMA))
    for e in events:
        check.validate({**head, **e})
    broken = {**head, **events[0]}
    del broken["track_id"]
    assert not check.is_valid(broken)
    assert not check.is_valid({**head, **events[0], "type": "object_entered"})  # no zone
    assert check.is_valid({**head, "type": "throttle", "from": "normal", "to": "warm"})  # others as before
    ended = next(e for e in events if e["type"] == "object_ended")
    assert ended["reason"] == "stopped"
    reasons = schema(EVENT_SCHEMA)["$defs"]["object"]["properties"]["reason"]["enum"]
    assert tuple(reasons) == OBJECT_END_REASONS
    assert not check.is_valid({**head, **ended, "reason": "gone"})
    assert {r for r in SEGMENT_REASONS if r != "start"} <= set(OBJECT_END_REASONS)


class Numbered:
    """A camera source whose every frame is one flat grey level of its own, so a crop says which frame it
    was cut from."""

    fps = 50.0
    scaled_from: tuple[int, int] | None = None

    def __init__(self) -> None:
        self.n = 0

    def read(self) -> np.ndarray:
        self.n += 1
        return np.full((480, 640, 3), level(self.n), np.uint8)

    def close(self) -> None:
        pass


def level(seq: int) -> int:
    return 20 + (seq * 37) % 200


def take(cam: Camera, cond: threading.Condition) -> FrameMeta:
    """The inference thread's part: take the ready frame, copy it (here: nothing), let its row go."""
    with cond:
        assert cond.wait_for(cam.has_ready_locked, 20), "a frame"
        idx, meta = cam.take_locked() or (0, None)
        cam.release_locked(idx)
    assert meta is not None
    return meta


def test_an_events_crop_is_cut_from_the_frame_its_box_was_found_in() -> None:
    """A result is decoded after its camera read on: its event's crop comes from its own frame (by seq), not
    the camera's newest, which shows what the box did not; once TAKEN_KEPT later frames were taken, none."""
    own = CameraDetectionConfig(tracking={"min_hits": 1}, publish="both", snapshot_kb=16)
    cfg = CameraConfig(name="cam", uri="synthetic://", detection=own)
    cond, stop = threading.Condition(), threading.Event()
    cam = Camera(cfg, Preprocessor(SPEC), cond, stop, opener=lambda _c: Numbered())
    scenes = Scenes(DetectionConfig(), [cfg], lambda _name, seq: cam.frame_for(seq))
    assert scenes.crops("cam")
    cam.keep_taken = True  # what the daemon sets where events carry crops
    cam.start()
    try:
        meta = take(cam, cond)
        taken = cam.stats.frames
        wait_until(lambda: cam.stats.frames >= taken + 2, 20, "the camera to read on past the taken frame")
        r = dataclasses.replace(result(0, [det("face", 0.9, (100, 100, 300, 300))]), meta=meta)
        _, events, _ = scenes.process(r)
        crop = cv2.imdecode(np.frombuffer(base64.b64decode(events[0]["snapshot"]["data"]), np.uint8), 1)
        newest = cam.last_frame
        assert crop is not None and newest is not None and int(newest[0, 0, 0]) != level(meta.seq)
        assert abs(float(crop.mean()) - level(meta.seq)) < 2, (crop.mean(), level(meta.seq), newest[0, 0, 0])
        later = [take(cam, cond) for _ in range(TAKEN_KEPT)]
        assert cam.frame_for(meta.seq) is None and cam.frame_for(later[-1].seq) is not None
        late = result(1, [det("face", 0.9, (400, 100, 600, 300))], seq=meta.seq)  # a new track, its frame gone
        _, events, _ = scenes.process(dataclasses.replace(late, meta=meta))
        assert [e["type"] for e in events] == ["object_appeared"] and "snapshot" not in events[0], events
    finally:
        stop.set()
        cam.join(10)


class Viewed(Numbered):
    """A source whose frames are read-only views of memory it keeps (as GStreamer's mapped buffers are)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[bytes] = []

    def read(self) -> np.ndarray:
        frame = super().read()
        self.held.append(frame.tobytes())  # the frames' memory, kept by the source as a pool keeps it
        return np.frombuffer(self.held[-1], np.uint8).reshape(frame.shape)


@pytest.mark.parametrize("source", [Numbered, Viewed])
def test_frames_kept_for_crops_are_copied_only_when_they_are_views(source: type[Numbered]) -> None:
    """Frames kept for crops: a view of a buffer the source owns is copied (a small pool is never drained by
    frames held here); a frame that owns its memory (OpenCV's, a decoded JPEG's) is kept as read, no copy."""
    cfg = CameraConfig(name="cam", uri="synthetic://", detection=CameraDetectionConfig(snapshot_kb=16))
    cond, stop = threading.Condition(), threading.Event()
    read: list[np.ndarray] = []
    src = source()
    real_read = src.read
    gate = threading.Event()  # five frames, then the source holds its sixth until the test ends

    def reading() -> np.ndarray:
        if len(read) == 5:
            gate.wait(30)
        read.append(real_read())
        return read[-1]

    src.read = reading  # type: ignore[method-assign]
    cam = Camera(cfg, Preprocessor(SPEC), cond, stop, opener=lambda _c: src)
    cam.keep_taken = True
    cam.start()
    try:
        meta = take(cam, cond)
        kept = cam._taken[meta.seq][0]
        original = next(f for f in read if int(f[0, 0, 0]) == level(meta.seq))
        assert np.array_equal(kept, original)
        assert (kept is original) == (source is Numbered), "owned frames kept as read, views copied"
        assert np.shares_memory(kept, original) == (source is Numbered)
    finally:
        stop.set()
        gate.set()
        cam.join(10)
