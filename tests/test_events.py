"""Tracks and object events on the demo video through a real daemon and a real broker (issue 19 items 1-3).

The ground truth (demo.json) gives face boxes per frame but no identities: an *appearance* is a face linked
from frame to frame by IoU, from when it shows until it is gone. Measured and printed: ID switches and
fragmentations per appearance, the appeared/ended events against each appearance's interval, zone
entered/left against the truth boxes crossing a polygon drawn on the frame, messages/s with
``publish: both`` against ``publish: events``, and the per-camera occupancy a consumer rebuilds from
the events alone.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest

from edged.daemon.scene.zones import anchor_point, inside
from edged.models.demo import DemoAssets
from edged.protocol import EVENT_SCHEMA, RESULT_SCHEMA, schema

from .conftest import base_config, write_config
from .test_daemon import iou

FPS = 15.0
TOLERANCE_S = 0.5
# a polygon drawn on the demo frame (960x540, normalised): the right part, its left edge slanted
ZONE = [(0.55, 0.0), (1.0, 0.0), (1.0, 1.0), (0.5, 1.0)]
OBJECT_TYPES = ("object_appeared", "object_entered", "object_left", "object_ended")
pytestmark = pytest.mark.slow  # three daemon runs of the 20 s video in real time


def appearances(truth: list[dict[str, Any]]) -> list[dict[int, list[float]]]:
    """Truth boxes linked frame to frame (IoU >= 0.3, greedy): each appearance is {frame: box}."""
    done: list[dict[int, list[float]]] = []
    live: list[dict[int, list[float]]] = []
    for f in truth:
        frame, boxes = f["frame"], f["faces"]
        nxt: list[dict[int, list[float]]] = []
        free = list(range(len(boxes)))
        for a in live:
            last = a[max(a)]
            best = max(((iou(last, boxes[k]), k) for k in free), default=(0.0, -1))
            if best[0] >= 0.3:
                a[frame] = boxes[best[1]]
                free.remove(best[1])
                nxt.append(a)
            else:
                done.append(a)
        nxt.extend({frame: boxes[k]} for k in free)
        live = nxt
    return sorted(done + live, key=min)


def t(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def run(broker, subscribe, start_daemon, demo: DemoAssets, tmp: Path, publish: str) -> tuple[list[Any], int]:
    sub = subscribe(broker, "edged/#")
    cam = {
        "name": "lobby",
        "uri": f"file://{demo.video}",
        "realtime": True,  # event times are wall-clock: the video plays at its own 15 fps
        "detection": {
            "zones": [{"name": "right", "points": ZONE, "normalized": True}],
            "tracking": {"min_hits": 3, "max_age": 5},
            "publish": publish,
        },
    }
    d = start_daemon(write_config(tmp / f"{publish}.yaml", base_config(broker, demo, tmp / publish, [cam])))
    assert d.proc.wait(180) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    tel = [m.json() for m in sub.on("telemetry")]
    frames = tel[-1]["cameras"]["lobby"]["frames"]
    return list(sub.messages), frames


def object_events(messages: list[Any]) -> list[dict[str, Any]]:
    docs = [m.json() for m in messages if m.topic.endswith("/events")]
    return [e for e in docs if e["type"] in OBJECT_TYPES]


@pytest.fixture(scope="module")
def truth(demo: DemoAssets) -> list[dict[str, Any]]:
    return list(json.loads(demo.ground_truth.read_text())["frames"])


def test_tracks_and_events_on_the_demo_video(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, truth: list[dict[str, Any]]
) -> None:
    messages, frames = run(broker, subscribe, start_daemon, demo, tmp_path, "both")
    results = [m.json() for m in messages if "/results/" in m.topic]
    events = object_events(messages)
    for r in results:
        jsonschema.validate(r, schema(RESULT_SCHEMA))
    for e in events:
        jsonschema.validate(e, schema(EVENT_SCHEMA))
    t0 = next(t(r["captured_at"]) - r["frame"] / FPS for r in results if r["frame"] == min(x["frame"] for x in results))
    apps = appearances(truth)
    assert len(apps) >= 3

    # 1. one track per appearance: the track ids of the detections matching the appearance's boxes
    by_frame = {r["frame"]: r for r in results}
    report = []
    track_of: dict[int, int] = {}  # track id -> appearance index
    for k, a in enumerate(apps):
        seq = []
        for frame, box in sorted(a.items()):
            r = by_frame.get(frame)
            best = max(
                ((iou(box, d["box"]), d) for d in (r["detections"] if r else [])),
                default=(0.0, None),
                key=lambda x: x[0],
            )
            if best[0] >= 0.5 and best[1] is not None and "track_id" in best[1]:
                seq.append(best[1]["track_id"])
        ids = set(seq)
        switches = sum(1 for x, y in itertools.pairwise(seq) if x != y)
        report.append((k, min(a), max(a), len(seq), sorted(ids), switches))
        for i in ids:
            track_of.setdefault(i, k)
        assert seq, f"appearance {k} (frames {min(a)}-{max(a)}) never tracked"
    print("\nappearance  frames     tracked  track ids  id switches  fragments")
    for k, a0, a1, n, tids, sw in report:
        print(f"  {k:<9} {a0:>3}-{a1:<6} {n:>5}    {tids!s:<10} {sw:>6}      {len(tids) - 1:>6}")
    for k, _, _, _, seen, sw in report:
        assert len(seen) - 1 <= 1 and sw <= 1, f"appearance {k}: tracks {seen}, {sw} switches"

    # 2. appeared/ended against each appearance's interval, in seconds of video
    appeared = {e["track_id"]: e for e in events if e["type"] == "object_appeared"}
    ended = {e["track_id"]: e for e in events if e["type"] == "object_ended"}
    assert set(appeared) == set(ended), "every track that appeared ended (at the latest when the file ended)"
    worst = 0.0
    for k, a in enumerate(apps):
        mine = [i for i, ak in track_of.items() if ak == k]
        first = min(t(appeared[i]["first_seen"]) for i in mine) - t0
        last = max(t(ended[i]["last_seen"]) for i in mine) - t0
        d_first, d_last = abs(first - min(a) / FPS), abs(last - max(a) / FPS)
        print(f"appearance {k}: truth {min(a) / FPS:.2f}-{max(a) / FPS:.2f} s, events {first:.2f}-{last:.2f} s")
        worst = max(worst, d_first, d_last)
    print(f"appear/end events vs truth: worst {worst:.2f} s (tolerance {TOLERANCE_S} s)")
    assert worst <= TOLERANCE_S
    stray = set(appeared) - set(track_of)
    assert not stray, f"tracks with no appearance behind them: {stray}"

    # 3. zone entered/left against the truth boxes' centers crossing the polygon
    poly = [(x * 960, y * 540) for x, y in ZONE]
    expected = []  # (appearance, 'entered'|'left', frame)
    for k, a in enumerate(apps):
        was = False
        for frame, box in sorted(a.items()):
            now = inside(*anchor_point((box[0], box[1], box[2], box[3]), "center"), poly)
            if now != was:
                expected.append((k, "entered" if now else "left", frame))
            was = now
        if was:
            expected.append((k, "left", max(a)))
    got = [
        (track_of[e["track_id"]], e["type"].removeprefix("object_"), e["last_frame"])
        for e in events
        if e["type"] in ("object_entered", "object_left") and e["zone"] == "right"
    ]
    print(f"zone 'right': expected {expected}\n              got      {got}")
    assert len(got) == len(expected)
    for (ka, kind_a, fa), (kb, kind_b, fb) in zip(sorted(expected), sorted(got), strict=True):
        assert (ka, kind_a) == (kb, kind_b) and abs(fa - fb) / FPS <= TOLERANCE_S, ((ka, kind_a, fa), (kb, kind_b, fb))

    # snapshots: the best crop, a JPEG that decodes
    for e in list(appeared.values()) + list(ended.values()):
        assert "snapshot" in e, e["type"]
        jpg = cv2.imdecode(np.frombuffer(base64.b64decode(e["snapshot"]["data"]), np.uint8), cv2.IMREAD_COLOR)
        assert jpg is not None and jpg.shape[0] > 10
    print(f"{len(results)} results ({frames} frames), {len(events)} object events")


def test_publish_events_cuts_messages_and_a_consumer_rebuilds_occupancy(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, truth: list[dict[str, Any]]
) -> None:
    frames_run, _ = run(broker, subscribe, start_daemon, demo, tmp_path, "frames")
    events_run, _ = run(broker, subscribe, start_daemon, demo, tmp_path, "events")
    duration = len(truth) / FPS  # both runs play the video in real time

    def data(msgs: list[Any]) -> list[Any]:  # what the mode governs: results and object events
        return [
            m
            for m in msgs
            if "/results/" in m.topic or (m.topic.endswith("/events") and m.json()["type"] in OBJECT_TYPES)
        ]

    n_frames, n_events = len(data(frames_run)), len(data(events_run))
    assert not [m for m in events_run if "/results/" in m.topic], "publish: events sends no results"
    assert not object_events(frames_run), "publish: frames (the default) sends no object events"
    factor = n_frames / max(1, n_events)
    print(
        f"\npublish: frames {n_frames} messages ({n_frames / duration:.1f}/s), publish: events {n_events} "
        f"({n_events / duration:.2f}/s): {factor:.1f}x fewer"
    )
    assert factor >= 10

    # the consumer: occupancy per camera (and per zone) from the events alone, in their order
    occupancy: dict[str, set[int]] = {}
    zones: dict[tuple[str, str], set[int]] = {}
    timeline: list[tuple[int, int, int]] = []  # (first frame, last frame, track) from appeared/ended
    opened: dict[int, int] = {}
    peak = 0
    for e in object_events(events_run):
        cam, tid = e["camera"], e["track_id"]
        if e["type"] == "object_appeared":
            occupancy.setdefault(cam, set()).add(tid)
            opened[tid] = e["first_frame"]
        elif e["type"] == "object_ended":
            occupancy[cam].discard(tid)
            timeline.append((opened.pop(tid), e["last_frame"], tid))
        elif e["type"] == "object_entered":
            zones.setdefault((cam, e["zone"]), set()).add(tid)
        else:
            zones[(cam, e["zone"])].discard(tid)
        peak = max(peak, len(occupancy.get(cam, ())))
    assert occupancy == {"lobby": set()} and all(not v for v in zones.values()), "all gone when the file ends"
    assert not opened
    counts = [sum(1 for a, b, _ in timeline if a <= f["frame"] <= b) for f in truth]
    agree = sum(1 for f, c in zip(truth, counts, strict=True) if c == len(f["faces"])) / len(truth)
    print(f"occupancy from events alone: peak {peak}, agrees with the truth's face count on {agree:.1%} of frames")
    assert peak == max(len(f["faces"]) for f in truth)
    assert agree >= 0.9
