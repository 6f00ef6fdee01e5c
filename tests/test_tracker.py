"""The tracker on synthetic boxes (crossing objects, a missed frame), zones, and a camera's Scene."""

from __future__ import annotations

from daemon.config import TrackingConfig, ZoneConfig
from daemon.tracker import Tracker
from daemon.zones import Polygons, anchor_point, inside


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
