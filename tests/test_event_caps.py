"""Bounds on what a scene inflates (issue 26 item 4): each camera's object events and snapshots a second
are capped, what goes over is counted, and a subscriber's appeared/ended and entered/left pairs still match.

The Scene tests drive a camera's real Scene (real tracker, zones, JPEG crops) with a clock we hold; the
daemon tests run the real daemon on the demo video at score threshold 0 (about 150-260 detections a frame,
the issue's scene) with a real mosquitto and measure the messages a second on ``…/events``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from edged.daemon.config import CameraConfig, CameraDetectionConfig, DetectionConfig
from edged.daemon.decoders import Detection
from edged.daemon.scene.scenes import Scenes
from edged.daemon.scene.zones import Polygons
from edged.models.demo import DemoAssets
from edged.protocol import EVENT_SCHEMA, TELEMETRY_SCHEMA, schema

from .conftest import base_config, write_config
from .test_tracker import result

OBJECT_TYPES = ("object_appeared", "object_entered", "object_left", "object_ended")
DOOR = [{"name": "door", "points": [(320, 0), (640, 0), (640, 480), (320, 480)]}]


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def face(x: float, y: float = 100.0, size: float = 40.0) -> Detection:
    return Detection("face", 0, 0.9, (x, y, x + size, y + size))


def scenes(clock: Clock, frame: np.ndarray | None = None, **own: Any) -> Scenes:
    cfg = CameraDetectionConfig(**{"tracking": {"min_hits": 1, "max_age": 1}, "publish": "events", **own})
    cam = CameraConfig(name="cam", uri="synthetic://", detection=cfg)
    return Scenes(DetectionConfig(score_threshold=0.5), [cam], lambda *_: frame, clock=clock)


def pairs_match(events: list[dict[str, Any]]) -> None:
    """The subscriber's recipe: every ended closes an appeared, every left an entered; nothing stays open."""
    live: set[int] = set()
    inside: set[tuple[int, str]] = set()
    for e in events:
        tid = e["track_id"]
        if e["type"] == "object_appeared":
            live.add(tid)
        elif e["type"] == "object_ended":
            assert tid in live, f"ended without its appeared: {e}"
            live.remove(tid)
        elif e["type"] == "object_entered":
            assert tid in live
            inside.add((tid, e["zone"]))
        else:
            assert (tid, e["zone"]) in inside, f"left without its entered: {e}"
            inside.remove((tid, e["zone"]))
    assert not live and not inside, (live, inside)


def test_an_appeared_over_the_cap_is_dropped_with_its_ended_and_counted() -> None:
    clock = Clock()  # never moves: the bucket holds its burst, 10 s worth: 4 tokens (2 per appeared+ended)
    sc = scenes(clock, max_events_per_s=0.4)
    out = sc.process(result(0, [face(10 + 60 * i) for i in range(5)]))[1]
    assert [e["type"] for e in out] == ["object_appeared"] * 2
    for f in range(1, 4):  # the faces are gone: every track ends (lost), the budget still empty
        out += sc.process(result(f, []))[1]
    assert [e["type"] for e in out] == ["object_appeared"] * 2 + ["object_ended"] * 2
    pairs_match(out)
    assert sc.counts("cam") == {"events": 4, "events_dropped": 6, "snapshots_dropped": 0}
    assert sc.dropped == 6


def test_an_entered_over_the_cap_is_dropped_with_its_left_and_a_later_one_goes_out() -> None:
    clock = Clock()
    sc = scenes(clock, max_events_per_s=0.2, zones=DOOR)  # burst 2: the appeared and its ended
    out = []
    walk = [150, 165, 180, 195, 210, 225, 240, 225, 210, 195]  # a 200 px face: in the door (center >= 320), out
    for f, x in enumerate(walk):
        out += sc.process(result(f, [face(x, size=200)]))[1]
    assert [e["type"] for e in out] == ["object_appeared"]  # entered (and so its left) over the cap
    assert sc.counts("cam") == {"events": 1, "events_dropped": 2, "snapshots_dropped": 0}
    clock.now += 10.0  # two tokens back: the next entry goes out with its left
    for f, x in enumerate([210, 225, 240], start=len(walk)):
        out += sc.process(result(f, [face(x, size=200)]))[1]
    out += sc.close()
    assert [(e["type"], e.get("zone")) for e in out] == [
        ("object_appeared", None),
        ("object_entered", "door"),
        ("object_left", "door"),  # the track ends inside: its left is never dropped
        ("object_ended", None),
    ]
    pairs_match(out)


def test_the_cap_bounds_events_over_time_whatever_the_churn() -> None:
    """Ten new faces every frame (each a frame long) at 10 frames/s for 30 s: at most the burst (10 s
    worth) + rate x seconds go out, and about that many (the cap is no tighter than it says)."""
    clock = Clock()
    sc = scenes(clock, max_events_per_s=20)
    out, made = [], 0
    for f in range(300):
        clock.now += 0.1
        out += sc.process(result(f, [face(10 + 60 * i, 20 + 50 * (f % 8)) for i in range(10)]))[1]
        made += 10
    out += sc.close()
    pairs_match(out)
    assert 200 + 20 * 30 - 10 <= len(out) <= 200 + 20 * 30, len(out)  # (a refill while full is lost)
    c = sc.counts("cam")
    assert c is not None and c["events"] == len(out) and c["events"] + c["events_dropped"] >= 2 * made


def test_snapshots_over_their_cap_are_left_out_and_never_encoded(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    frame = np.random.default_rng(0).integers(0, 255, (480, 640, 3), np.uint8)
    sc = scenes(clock, frame, max_snapshots_per_s=0.2)  # burst 2: one track's appeared and ended
    with caplog.at_level(logging.WARNING, "edged.daemon.scene.scenes"):
        out = sc.process(result(0, [face(10), face(300)]))[1]
        tracker = sc.scenes["cam"].tracker
        assert tracker is not None
        crops = sorted("crop" in t.extra for t in tracker.tracks)
        for f in range(1, 4):
            out += sc.process(result(f, []))[1]
    assert crops == [False, True]  # the track without snapshots never had its crop encoded
    assert [e["type"] for e in out] == ["object_appeared"] * 2 + ["object_ended"] * 2
    snapshot = {(e["type"], e["track_id"]): "snapshot" in e for e in out}
    first, second = sorted({e["track_id"] for e in out})
    assert snapshot == {
        ("object_appeared", first): True,
        ("object_appeared", second): False,
        ("object_ended", first): True,
        ("object_ended", second): False,
    }
    pairs_match(out)
    assert sc.counts("cam") == {"events": 4, "events_dropped": 0, "snapshots_dropped": 2}
    assert "camera cam is over its event caps" in caplog.text and "2 snapshots left out" not in caplog.text


def test_a_pixel_zone_beyond_the_frame_is_warned_once_per_frame_size(caplog: pytest.LogCaptureFixture) -> None:
    from edged.daemon.config import ZoneConfig

    zones = Polygons([ZoneConfig(name="far", points=[(0, 0), (2000, 0), (2000, 100)])], "camera cam: zone")
    with caplog.at_level(logging.WARNING, "edged.daemon.scene.zones"):
        for _ in range(3):
            assert zones.containing((600, 10), 640, 480) == ["far"]
    assert caplog.text.count("camera cam: zone far: points beyond the 640x480 frame") == 1, caplog.text


# --- the real daemon on the scene ---------------------------------------------------------------


def flood(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp: Path, serve_s: int = 12, **own: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """The demo video at score threshold 0 and NMS IoU 0.6 (150-260 detections a frame), object events with
    crops, `serve_s` of serving: (the object events received, the last telemetry's camera, the daemon's log)."""
    tmp.mkdir(exist_ok=True)
    sub = subscribe(broker, "edged/#")
    cam = {
        "name": "lobby",
        "uri": f"file://{demo.video}",
        "loop": True,  # the video is 20 s long
        "detection": {"score_threshold": 0.0, "max_detections": 1000, "publish": "events", **own},
    }
    doc = base_config(broker, demo, tmp, [cam], detection={"score_threshold": 0.0, "iou_threshold": 0.6})
    d = start_daemon(write_config(tmp / "flood.yaml", doc), "--duration", str(serve_s))
    assert d.proc.wait(300) == 0, d.output()[-3000:]
    sub.wait_stopped(30)
    events = [e for m in sub.on("events") if (e := m.json())["type"] in OBJECT_TYPES]
    tel = [m.json() for m in sub.on("telemetry")]
    for doc in events[:50]:
        jsonschema.validate(doc, schema(EVENT_SCHEMA))
    jsonschema.validate(tel[-1], schema(TELEMETRY_SCHEMA))
    return events, tel[-1]["cameras"]["lobby"], d.output()


def per_s(events: list[dict[str, Any]], after_s: float = 0.0) -> tuple[float, float]:
    """(seconds from the first object event (+ `after_s`) to the last, by their `ts`; messages a second over
    them)."""
    ts = [dt.datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp() for e in events]
    start = min(ts) + after_s
    span = max(ts) - start
    return span, sum(t >= start for t in ts) / max(span, 1e-3)


def test_the_default_cap_holds_on_a_scene_of_hundreds_of_detections(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """Defaults: 20 events and 2 snapshots a second (a burst of 10 seconds' worth); before the cap this
    scene sent 140-175 event messages a second, each with a JPEG crop."""
    events, cam, log = flood(broker, subscribe, start_daemon, demo, tmp_path)
    span, rate = per_s(events)
    snaps = sum("snapshot" in e for e in events)
    print(f"\ncapped: {len(events)} object events over {span:.1f} s = {rate:.1f}/s, {snaps} with a snapshot; {cam}")
    # tokens: a burst of 200 plus 20 a second; each message has taken one (an ended's was taken by its appeared)
    assert len(events) <= 200 + 20 * (span + 1.0), (len(events), span)
    assert snaps <= 20 + 2 * (span + 1.0), (snaps, span)
    assert cam["events"] == len(events), cam  # telemetry counts what went out...
    assert cam["events_dropped"] > 0 and cam["snapshots_dropped"] > 0, cam  # ...and what did not
    assert "camera lobby is over its event caps" in log
    pairs_match(events)  # the daemon stopped: every appeared sent has its ended


@pytest.mark.slow
def test_messages_a_second_with_and_without_the_cap(
    broker: Any, subscribe: Any, start_daemon: Any, demo: DemoAssets, tmp_path: Path
) -> None:
    """The same flood with the caps out of the way (10,000 and 1,000 a second), then 40 s with the defaults:
    after the burst (200 events, 20 snapshots) is spent, about 20 messages a second."""
    free, free_cam, _ = flood(
        broker, subscribe, start_daemon, demo, tmp_path / "free", max_events_per_s=10_000, max_snapshots_per_s=1_000
    )
    capped, cam, _ = flood(broker, subscribe, start_daemon, demo, tmp_path / "capped", serve_s=40)
    (span0, rate0), (span1, rate1) = per_s(free), per_s(capped)
    steady_s, steady = per_s(capped, after_s=15.0)
    kib0 = sum(len(json.dumps(e)) for e in free) / max(span0, 1e-3) / 1024
    kib1 = sum(len(json.dumps(e)) for e in capped) / max(span1, 1e-3) / 1024
    snaps = sum("snapshot" in e for e in capped)
    print(f"\nno cap: {len(free)} events over {span0:.1f} s, {rate0:.1f}/s, {kib0:.0f} KiB/s; {free_cam}")
    print(
        f"default caps: {len(capped)} events over {span1:.1f} s, {rate1:.1f}/s ({steady:.1f}/s over the last "
        f"{steady_s:.1f} s), {kib1:.0f} KiB/s, {snaps} snapshots; {rate0 / max(steady, 1e-3):.1f}x fewer; {cam}"
    )
    assert free_cam["events_dropped"] == 0 and rate0 > 40, rate0
    assert len(capped) <= 200 + 20 * (span1 + 1.0) and cam["events_dropped"] > 0
    assert snaps <= 20 + 2 * (span1 + 1.0)
    assert steady <= 30, steady  # 20 a second, and the closings of tracks opened before the window
    pairs_match(free)
    pairs_match(capped)
