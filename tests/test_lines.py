"""Lines (issue 31 item 3): named lines with an in direction, a track's anchor crossing one giving
`object_crossed` and counters per line, direction and label in telemetry, /metrics and Home Assistant.

The must-show: on the whole demo video (its ground truth gives every face box), through a real daemon and a
real broker, the `object_crossed` events match the crossings computed from the truth boxes' anchors, in count
and direction, with the tracker's ID switches reported (bench/lines_demo.py writes them to
bench/results/lines_demo.json; the test fails a tracker that switches more). The demo's faces mostly drift;
the lines are drawn from its ground truth where faces really cross (picked from the truth, not found in the
video): ``door``, a vertical line the astronaut walks through left to right (frames 60-134, 6.6 px a frame),
and ``sill``, a horizontal one that he crosses going up (1.3 px a frame: his detected box wobbles on it, the
hysteresis case) and that Grace Hopper crosses going down at 0.7 px a frame (frames 150-239); DEMO_LINES
adds a normalised, a slanted and an uncrossed one. A gap cut into the walk makes a real ID switch, which
the report counts.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest

from edged.daemon.config import Config, load_config
from edged.daemon.config.cameras import LineConfig
from edged.daemon.config.remote import load_with_overlay
from edged.daemon.delivery.homeassistant import discovery_configs
from edged.daemon.scene.lines import Lines
from edged.daemon.scene.zones import anchor_point
from edged.errors import ConfigError
from edged.models.demo import DemoAssets
from edged.protocol import EVENT_SCHEMA, schema
from edged.protocol.schemas import HA_SENSOR_SCHEMA, HA_STATE_SCHEMA, TELEMETRY_SCHEMA

from .conftest import base_config, edged_cli, free_port, write_config
from .test_daemon import iou
from .test_events import appearances
from .test_health import get, metrics

LINES: list[dict[str, Any]] = [
    {"name": "door", "points": [[400, 100], [400, 350]], "in_direction": "right"},
    {"name": "sill", "points": [[100, 225], [330, 225]], "in_direction": "down"},
]


def _line(points: list[list[float]], in_direction: str = "right", **more: Any) -> LineConfig:
    return LineConfig.model_validate({"name": "l", "points": points, "in_direction": in_direction, **more})


def _walk(lines: Lines, path: list[tuple[float, float]], height: float = 100.0) -> list[tuple[int, str, str]]:
    state: dict[str, Any] = {}
    return [(i, c.line, c.direction) for i, p in enumerate(path) for c in lines.step(state, p, height, 960, 540)]


def test_a_crossing_counts_through_the_segment_once_with_its_direction() -> None:
    door = Lines([_line([[400, 100], [400, 300]])])  # in: moving right
    across = [(300.0 + 20 * i, 200.0) for i in range(11)]  # x 300 -> 500 at y 200
    assert _walk(door, across) == [(6, "l", "in")]  # 400 at i=5, on the line; 420 leaves the 10 px band
    assert _walk(door, across[::-1]) == [(6, "l", "out")]
    assert _walk(door, [(x, 350.0) for x, _ in across]) == []  # past the segment's end: not through it
    # a slanted line, normalised, in: down; a 960x540 frame
    slant = Lines([_line([[0.2, 0.2], [0.8, 0.6]], "down", normalized=True)])
    assert _walk(slant, [(480.0, 100.0 + 20 * i) for i in range(15)]) == [(7, "l", "in")]
    # a track that goes around the line's end and comes back through it: one crossing, the way it came back
    around = [(300.0, 200.0), (300.0, 340.0), (500.0, 340.0), (500.0, 200.0), (300.0, 200.0)]
    assert _walk(door, around) == [(4, "l", "out")]


def test_jitter_on_the_line_counts_once_with_hysteresis_and_many_times_without() -> None:
    """A box that wobbles ±4 px on the line for 30 frames, then walks on: one crossing. Hysteresis 0 (what
    plain segment intersection gives) counts every wobble."""
    wobble = [(300.0, 200.0), (380.0, 200.0)] + [(400.0 + (4 if i % 2 else -4), 200.0) for i in range(30)]
    path = [*wobble, (420.0, 200.0), (460.0, 200.0)]
    assert _walk(Lines([_line([[400, 100], [400, 300]])]), path) == [(32, "l", "in")]
    naive = _walk(Lines([_line([[400, 100], [400, 300]], hysteresis=0.0)]), path)
    assert len(naive) == 29 and [d for _, _, d in naive].count("in") == 15  # every wobble, in and out
    # a wobble that goes back where it came from: nothing
    assert _walk(Lines([_line([[400, 100], [400, 300]])]), [*wobble, (340.0, 200.0)]) == []
    # a track first seen on the line has no side until it leaves the band: nothing to count yet
    assert _walk(Lines([_line([[400, 100], [400, 300]])]), [(403.0, 200.0), (470.0, 200.0)]) == []


BAD = [
    ({"points": [[10, 10], [10, 10]]}, r"lines\[1\]\.points: the two points are the same: a line needs a length"),
    ({"points": [[10, 10], [11, 10.5]]}, r"lines\[1\]\.points: the line is 1\.11803 long; at least 2 \(pixels\)"),
    ({"points": [[0.5, 0.5], [0.5, 0.5005]], "normalized": True}, r"lines\[1\]\.points: the line is 0\.0005 long"),
    ({"points": [[10, 10]]}, r"lines\[1\]\.points: 1 points; a line has two"),
    ({"points": [[0, 0], [1, 1], [2, 0]]}, r"lines\[1\]\.points: 3 points; a line has two"),
    ({"points": [[0.1, 0.2], [1.3, 0.2]], "normalized": True}, r"lines\[1\]\.points: normalized points must lie"),
    ({"points": [[-5, 0], [50, 100]]}, r"lines\[1\]\.points: points must not be negative"),
    (
        {"points": [[0, 100], [500, 110]], "in_direction": "right"},
        r"lines\[1\]\.in_direction: right runs along the line \(a→b\), not across it: .* in_direction: up or down",
    ),
    ({"in_direction": "north"}, r"lines\[1\]\.in_direction: Input should be 'left', 'right', 'up' or 'down'"),
    ({"name": "door"}, r"lines: .*line names must be unique: door given more than once"),
    ({"name": "front door"}, r"lines\[1\]\.name: must be 1-64 of letters"),
    ({"hysteresis": -0.1}, r"lines\[1\]\.hysteresis: "),
]


def _config(tmp: Path, lines: list[dict[str, Any]], **detection: Any) -> Path:
    doc = {
        "device_id": "cam-box",
        "model": {"package": "pkg"},
        "cameras": [
            {"name": "a", "uri": "synthetic://"},
            {"name": "b", "uri": "synthetic://", "detection": {"lines": lines, **detection}},
        ],
    }
    return write_config(tmp / "c.yaml", doc)


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_a_degenerate_line_is_refused_with_its_key_path(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    """The bad line is the second of the second camera."""
    line = {"name": "stair", "points": [[100, 100], [100, 300]], "in_direction": "right", **bad}
    with pytest.raises(ConfigError, match=rf"c\.yaml: cameras\[1\]\.detection\.{message}"):
        load_config(_config(tmp_path, [LINES[0], line]), environ={})


def test_lines_load_and_need_tracking(tmp_path: Path) -> None:
    own = load_config(_config(tmp_path, LINES), environ={}).cameras[1].detection
    assert own is not None and [(n.name, n.in_direction, n.hysteresis) for n in own.lines] == [
        ("door", "right", 0.1),
        ("sill", "down", 0.1),
    ]
    with pytest.raises(ConfigError, match=r"cameras\[1\]\.detection: .*lines need tracking"):
        load_config(_config(tmp_path, LINES, tracking={"enabled": False}), environ={})
    with pytest.raises(ConfigError, match=r"lines: List should have at most 32 items"):
        many = [{**LINES[0], "name": f"l{i}"} for i in range(33)]
        load_config(_config(tmp_path, many), environ={})


def test_check_config_names_the_bad_line(tmp_path: Path) -> None:
    path = _config(tmp_path, [LINES[0], {"name": "dot", "points": [[5, 5], [5, 5]], "in_direction": "up"}])
    run = edged_cli("check-config", "-c", str(path), "--no-model")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "c.yaml: cameras[1].detection.lines[1].points: the two points are the same" in run.stderr, run.stderr


def test_a_remote_document_may_set_lines_and_a_bad_one_is_refused_by_key_path(tmp_path: Path) -> None:
    path = _config(tmp_path, [])
    cfg = load_with_overlay(path, {"cameras": {"b": {"detection": {"lines": LINES}}}}, environ={})
    own = cfg.cameras[1].detection
    assert own is not None and [n.name for n in own.lines] == ["door", "sill"]
    bad = {"cameras": {"b": {"detection": {"lines": [{**LINES[0], "points": [[1, 1], [1, 1]]}]}}}}
    with pytest.raises(ConfigError, match=r"cameras\.b\.detection\.lines\[0\]\.points: the two points are the same"):
        load_with_overlay(path, bad, environ={})


def test_home_assistant_has_a_counter_per_line_and_direction() -> None:
    cams = [
        {"name": "lobby", "uri": "synthetic://", "detection": {"lines": LINES}},
        {"name": "x", "uri": "synthetic://"},
    ]
    cfg = Config.model_validate({"device_id": "cam-1", "model": {"package": "/x"}, "cameras": cams})
    configs = discovery_configs(cfg, ["face"])
    lines = {d["name"]: d for t, d in configs.items() if "_line_" in t}
    assert sorted(lines) == ["lobby door in", "lobby door out", "lobby sill in", "lobby sill out"]
    for doc in lines.values():
        jsonschema.Draft202012Validator(schema(HA_SENSOR_SCHEMA)).validate(doc)
        assert doc["state_class"] == "total_increasing" and doc["state_topic"] == "edged/cam-1/ha/lobby"
    assert lines["lobby sill out"]["value_template"] == "{{ value_json.crossings['sill']['out'] | default(0) }}"


# --- the must-show: the demo video through the daemon ---------------------------------------------------

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "lines_demo.json"  # bench/lines_demo.py
SIZE = (960, 540)  # the demo video's frame
# the whole demo video (300 frames, five truth appearances): door and sill as above, and three more drawn from
# its ground truth: ``aisle``, normalised, that the face of frames 255-299 drifts right through (0.7 px a
# frame); ``ramp``, slanted, that the astronaut walks through near frame 105; ``floor``, normalised, that no
# face comes near (a crossing there is a false one)
DEMO_LINES: list[dict[str, Any]] = [
    *LINES,
    {"name": "aisle", "points": [[0.175, 0.3], [0.175, 0.62]], "normalized": True, "in_direction": "right"},
    {"name": "ramp", "points": [[470, 80], [570, 300]], "in_direction": "left"},
    {"name": "floor", "points": [[0.05, 0.88], [0.95, 0.88]], "normalized": True, "in_direction": "down"},
]
TRACKING = {"min_hits": 3, "max_age": 5}
GAP = (90, 105)  # the gap clip: frames 60-89 then 105-134 (the astronaut's walk, 100 px lost between them)


def truth_crossings(
    apps: list[dict[int, list[float]]], lines: list[dict[str, Any]] = LINES
) -> list[tuple[int, str, str, int]]:
    """(appearance, line, in|out, frame) wherever a truth anchor's step crosses a line's segment: plain
    geometry on the true boxes (which do not jitter), independent of the daemon's code. The in side is the
    side `in_direction` leads to from the line's middle."""
    out = []
    for line in lines:
        scale = SIZE if line.get("normalized") else (1, 1)
        (ax, ay), (bx, by) = ((x * scale[0], y * scale[1]) for x, y in line["points"])
        move = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}[line["in_direction"]]

        def side(x: float, y: float, ax: float = ax, ay: float = ay, bx: float = bx, by: float = by) -> float:
            return (bx - ax) * (y - ay) - (by - ay) * (x - ax)

        inside = side((ax + bx) / 2 + move[0], (ay + by) / 2 + move[1])
        for k, a in enumerate(apps):
            for f0, f1 in itertools.pairwise(sorted(a)):
                p, q = (anchor_point((a[f][0], a[f][1], a[f][2], a[f][3]), "center") for f in (f0, f1))
                s0, s1 = side(*p), side(*q)
                if s0 * s1 >= 0:
                    continue
                t = s0 / (s0 - s1)  # where the step meets the infinite line
                x, y = p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])
                if min(ax, bx) - 1e-9 <= x <= max(ax, bx) + 1e-9 and min(ay, by) - 1e-9 <= y <= max(ay, by) + 1e-9:
                    out.append((k, line["name"], "in" if s1 * inside > 0 else "out", f1))
    return sorted(out)


def crossing_report(
    results: list[dict[str, Any]],
    events: list[dict[str, Any]],
    apps: list[dict[int, list[float]]],
    lines: list[dict[str, Any]],
) -> dict[str, Any]:
    """The daemon's crossings against the truth's, and the tracker's ID switches per truth appearance.

    Each appearance's frames are matched to the published detection of IoU >= 0.5 with a track id (as
    tests/test_events.py does); its ID switches are the changes of track id along those frames; an event's
    appearance is the one its track first matched (-1: none). `naive`: the crossings plain segment
    intersection (hysteresis 0) finds on the same published tracks."""
    crossed = [e for e in events if e["type"] == "object_crossed"]
    by_frame = {r["frame"]: r for r in results}
    track_of: dict[int, int] = {}
    tracks_of: dict[int, list[int]] = {k: [] for k in range(len(apps))}
    for k, a in enumerate(apps):
        for f, box in sorted(a.items()):
            dets = by_frame[f]["detections"] if f in by_frame else []
            best = max(dets, key=lambda x: iou(box, x["box"]), default=None)
            if best is not None and iou(box, best["box"]) >= 0.5 and best.get("track_id") is not None:
                track_of.setdefault(best["track_id"], k)
                tracks_of[k].append(best["track_id"])
    anchors: dict[int, list[tuple[float, float]]] = {}
    for r in sorted(results, key=lambda r: r["frame"]):
        for det in r["detections"]:
            if det.get("track_id") is not None:
                anchors.setdefault(det["track_id"], []).append(anchor_point(tuple(det["box"]), "center"))
    plain = Lines([LineConfig.model_validate({**n, "hysteresis": 0.0}) for n in lines])
    return {
        "truth": truth_crossings(apps, lines),
        "events": sorted(
            (track_of.get(e["track_id"], -1), e["line"], e["direction"], e["last_frame"]) for e in crossed
        ),
        "tracks": {k: sorted(set(v)) for k, v in tracks_of.items()},
        "matched_frames": {k: len(v) for k, v in tracks_of.items()},
        "truth_frames": {k: len(a) for k, a in enumerate(apps)},
        "id_switches": {k: sum(1 for x, y in itertools.pairwise(ids) if x != y) for k, ids in tracks_of.items()},
        "naive": sum(len(_walk(plain, path)) for path in anchors.values()),
        "naive_by_line": dict(collections.Counter(c[1] for path in anchors.values() for c in _walk(plain, path))),
    }


def same_crossings(report: dict[str, Any]) -> bool:
    """The daemon's (appearance, line, direction) list is the truth's, each event 0-30 frames after its
    truth crossing (settled past the band within 2 s of video)."""
    got, truth = report["events"], report["truth"]
    if [e[:3] for e in got] != [t[:3] for t in truth]:
        return False
    return all(0 <= e[3] - t[3] <= 30 for e, t in zip(got, truth, strict=True))


def gap_video(src: Path, out: Path) -> tuple[Path, list[int]]:
    """The demo's frames 60-134 less GAP: the astronaut jumps 100 px between two frames. (video, the source
    frame of each of its frames)"""
    frames = [f for f in range(60, 135) if not GAP[0] <= f < GAP[1]]
    cap = cv2.VideoCapture(str(src))
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"mp4v"), 15.0, SIZE)
    assert writer.isOpened(), "OpenCV cannot write mp4 here"
    for f in range(frames[-1] + 1):
        ok, frame = cap.read()
        assert ok, f"{src}: no frame {f}"
        if f in frames:
            writer.write(frame)
    cap.release()
    writer.release()
    return out, frames


def renumbered(apps: list[dict[int, list[float]]], frames: list[int]) -> list[dict[int, list[float]]]:
    """The appearances (linked on the whole video) in a clip's frame numbers, `frames` its source frames."""
    at = {f: i for i, f in enumerate(frames)}
    return [b for b in ({at[f]: box for f, box in a.items() if f in at} for a in apps) if b]


def demo_camera(uri: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    detection = {"lines": lines, "tracking": TRACKING, "publish": "both"}
    return {"name": "lobby", "uri": uri, "realtime": False, "detection": detection}


def recorded() -> dict[str, Any]:
    """bench/results/lines_demo.json (bench/lines_demo.py): the figures the tests hold the daemon to."""
    doc: dict[str, Any] = json.loads(RESULTS.read_text())
    return doc


def test_crossings_on_the_demo_video_match_the_truth(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    apps = appearances(json.loads(demo.ground_truth.read_text())["frames"])
    expected = truth_crossings(apps, DEMO_LINES)
    assert [(k, line, d) for k, line, d, _ in expected] == [
        (0, "door", "in"), (0, "ramp", "out"), (0, "sill", "out"), (1, "sill", "in"), (3, "aisle", "in"),
    ]  # fmt: skip
    sub, ha_sub = subscribe(broker, "edged/#"), subscribe(broker, "homeassistant/#")
    port = free_port()
    cfg = base_config(
        broker, demo, tmp_path, [demo_camera(f"file://{demo.video}", DEMO_LINES)], homeassistant={"enabled": True},
        health={"enabled": True, "port": port, "live_view": True},
    )  # fmt: skip
    d = start_daemon(write_config(tmp_path / "c.yaml", cfg))
    scrapes: list[dict[Any, float]] = []
    views: list[bytes] = []
    while d.proc.poll() is None:  # /metrics while it runs (it stops at the video's end): the last scrape counts
        if not views and (view := get(port, "/live/frame?camera=lobby"))[0] == 200:
            views.append(view[2])
        if get(port, "/healthz")[0] == 200:
            with contextlib.suppress(AssertionError, ValueError):  # going down mid-scrape
                scrapes.append(metrics(port))
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(0.3)
    assert d.proc.returncode == 0, d.output()[-3000:]
    sub.wait_stopped(10)

    results = [m.json() for m in sub.messages if "/results/" in m.topic]
    events = [m.json() for m in sub.messages if m.topic.endswith("/events")]
    for e in events:
        if e["type"] == "object_crossed":
            jsonschema.validate(e, schema(EVENT_SCHEMA))
            assert e["camera"] == "lobby" and e["label"] == "face" and e["track_id"] >= 1
    report = crossing_report(results, events, apps, DEMO_LINES)
    print(f"\n{report}")
    assert same_crossings(report), report
    # the ID switches bench/lines_demo.py measured and docs/subscriber.md quotes: a tracker that switches more fails
    held = recorded()["whole"]
    assert held["id_switches_total"] == sum(held["id_switches"].values())
    for k, n in report["id_switches"].items():
        assert n <= held["id_switches"][str(k)], (k, report["id_switches"], held["id_switches"])

    # the counters: telemetry (the last document, at the stop), Home Assistant's state, /metrics' last scrape
    want: dict[str, dict[str, dict[str, int]]] = {n["name"]: {"in": {}, "out": {}} for n in DEMO_LINES}
    for _, line, direction, _ in expected:
        want[line][direction]["face"] = want[line][direction].get("face", 0) + 1
    tel = [m.json() for m in sub.on("telemetry")][-1]
    jsonschema.validate(tel, schema(TELEMETRY_SCHEMA))
    assert tel["cameras"]["lobby"]["crossings"] == want, tel["cameras"]["lobby"]
    states = [m.json() for m in sub.messages if m.topic == "edged/test-01/ha/lobby" and m.payload]
    for st in states:
        jsonschema.validate(st, schema(HA_STATE_SCHEMA))
    counts = {n: {d: sum(by.values()) for d, by in dirs.items()} for n, dirs in want.items()}
    assert states[-1]["crossings"] == counts, states[-1]
    ha = {m.topic: m.json() for m in ha_sub.messages if "_line_" in m.topic and m.payload}
    assert len(ha) == 2 * len(DEMO_LINES), list(ha)
    assert scrapes, d.output()[-2000:]
    counted = {
        (dict(labels)["line"], dict(labels)["direction"]): v
        for (name, labels), v in scrapes[-1].items()
        if name == "edged_line_crossings_total"
    }
    assert counted == {(n, d): v for n, dirs in counts.items() for d, v in dirs.items() if v}, counted

    # the live view draws the lines (yellow: scene/draw.py's LINE_BGR) where the config puts them
    assert views, "a live view frame"
    img = cv2.imdecode(np.frombuffer(views[0], np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.shape[:2] == (540, 960), "a JPEG of the source's size"
    b, g, r = (int(v) for v in img[200, 400])  # on the door line, between its ends
    assert b < 100 and g > 150 and r > 180, (b, g, r)


def test_an_id_switch_is_counted_where_a_gap_breaks_the_track(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """The switch counting proven on a real switch: the astronaut's walk with GAP cut out jumps his box 100
    px between two frames, further than the tracker matches; his one truth appearance gets two track ids."""
    video, frames = gap_video(demo.video, tmp_path / "gap.mp4")
    apps = renumbered(appearances(json.loads(demo.ground_truth.read_text())["frames"]), frames)
    assert len(apps) == 1 and len(apps[0]) == len(frames)
    sub = subscribe(broker, "edged/#")
    cfg = base_config(broker, demo, tmp_path, [demo_camera(f"file://{video}", LINES)])
    d = start_daemon(write_config(tmp_path / "c.yaml", cfg))
    assert d.proc.wait(120) == 0, d.output()[-3000:]
    sub.wait_stopped(10)
    results = [m.json() for m in sub.messages if "/results/" in m.topic]
    events = [m.json() for m in sub.messages if m.topic.endswith("/events")]
    report = crossing_report(results, events, apps, LINES)
    print(f"\n{report}")
    assert len(report["tracks"][0]) == 2 and report["id_switches"] == {0: 1}, report
    assert report["id_switches"] == {int(k): v for k, v in recorded()["gap"]["id_switches"].items()}
