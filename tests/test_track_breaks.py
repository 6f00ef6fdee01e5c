"""Tracks across what breaks a camera's picture, on real footage through a real daemon and a real broker
(issue 25, "tracks that never end"): a file that loops, an RTSP server restarted mid-run, and a scene cut
between two different faces whose boxes overlap. Each must give every `object_appeared` its
`object_ended` (with the reason) as soon as the picture breaks, never let an old track id take a new
object, and start a new track at the cut.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest

from edged.daemon.capture.camera import Camera, FrameMeta, open_source
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.capture.preprocess import Preprocessor
from edged.daemon.capture.sources import Source
from edged.daemon.config import CameraConfig
from edged.models.demo import DemoAssets
from edged.models.demo.video import FACES
from edged.models.package import InputSpec
from edged.protocol import EVENT_SCHEMA, schema

from .conftest import base_config, wait_until, write_config
from .test_daemon import iou

OBJECT_TYPES = ("object_appeared", "object_entered", "object_left", "object_ended")
TRACKING = {"min_hits": 3, "max_age": 5}


def clip(src: Path, out: Path, first: int, count: int) -> Path:
    """Frames [first, first + count) of a real video, as an mp4 of its own."""
    cap = cv2.VideoCapture(str(src))
    fps = cap.get(cv2.CAP_PROP_FPS) or 15.0
    cap.set(cv2.CAP_PROP_POS_FRAMES, first)
    writer = None
    for _ in range(count):
        ok, frame = cap.read()
        assert ok, f"{src}: no frame {first + count}"
        if writer is None:
            h, w = frame.shape[:2]
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
            assert writer.isOpened(), "OpenCV cannot write mp4 here"
        writer.write(frame)
    cap.release()
    assert writer is not None
    writer.release()
    return out


def two_faces(raw: Path) -> tuple[list[np.ndarray], list[list[float]]]:
    """A cut between two people: 20 frames of the astronaut on one background, then 20 of Grace Hopper on
    another, her face where his was (boxes with IoU 0.3-0.5, the same size within 10 %). Returns the
    frames and each frame's true face box."""
    rng = np.random.default_rng(5)
    W, H = 960, 540
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    backs = [
        np.dstack([90 + 60 * np.sin(xx / 150), 110 + 40 * np.cos(yy / 90), 120 + 0 * xx]).astype(np.uint8),
        np.dstack([200 - 80 * (yy / H), 60 + 50 * np.sin((xx + yy) / 200), 70 + 100 * (xx / W)]).astype(np.uint8),
    ]
    # Grace Hopper's face (at 0.58) placed 40 px right of and 20 px below the astronaut's face
    ax1, ay1 = 200 + FACES["astronaut.png"][0][0], 10 + FACES["astronaut.png"][0][1]
    gx, gy = FACES["grace_hopper.jpg"][0][0] * 0.58, FACES["grace_hopper.jpg"][0][1] * 0.58
    scenes = [("astronaut.png", 1.0, (200.0, 10.0)), ("grace_hopper.jpg", 0.58, (ax1 + 40 - gx, ay1 + 20 - gy))]
    frames, truth = [], []
    for k, (name, s, (x, y)) in enumerate(scenes):
        photo = cv2.imread(str(raw / name), cv2.IMREAD_COLOR)
        assert photo is not None, raw / name
        sy, sx = round(photo.shape[0] * s) / photo.shape[0], round(photo.shape[1] * s) / photo.shape[1]
        photo = cv2.resize(photo, (round(photo.shape[1] * s), round(photo.shape[0] * s)), interpolation=cv2.INTER_AREA)
        ph, pw = photo.shape[:2]
        for i in range(20):
            dx = i  # a slow drift: a person standing, not a still image
            canvas = cv2.add(backs[k], rng.integers(0, 8, backs[k].shape, dtype=np.uint8))
            x0, y0 = round(x + dx), round(y)
            canvas[y0 : y0 + ph, x0 : x0 + pw] = photo
            f = FACES[name][0]
            truth.append([x0 + f[0] * sx, y0 + f[1] * sy, x0 + f[2] * sx, y0 + f[3] * sy])
            frames.append(canvas)
    return frames, truth


def write_video(frames: list[np.ndarray], out: Path, fps: float = 15.0) -> Path:
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
    assert writer.isOpened(), "OpenCV cannot write mp4 here"
    for f in frames:
        writer.write(f)
    writer.release()
    return out


@pytest.fixture(scope="module")
def videos(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("breaks")
    frames, truth = two_faces(demo.root / "raw")
    return {
        # two people standing, on screen from the first frame to the last (demo frames 160-183)
        "loop": clip(demo.video, d / "two.mp4", 160, 24),
        # the same two for 8 s, for the RTSP server (restarted before it ends)
        "long": clip(demo.video, d / "two-long.mp4", 152, 85),
        "cut": write_video(frames, d / "cut.mp4"),
        "cut_truth": truth,
    }


def object_events(messages: list[Any]) -> list[dict[str, Any]]:
    docs = [m.json() for m in messages if m.topic.endswith("/events")]
    return [e for e in docs if e["type"] in OBJECT_TYPES]


def check_schema(events: list[dict[str, Any]]) -> None:
    for e in events:
        jsonschema.validate(e, schema(EVENT_SCHEMA))


def camera(name: str, uri: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "uri": uri, "detection": {"tracking": TRACKING, "publish": "both"}, **more}


# --- the camera's counters -----------------------------------------------------------------------------


class SlowOnce:
    """A real source whose `nth` read takes `delay_s` (a network camera that stalled and came back)."""

    def __init__(self, inner: Source, nth: int, delay_s: float) -> None:
        self.inner, self.nth, self.delay_s, self.reads = inner, nth, delay_s, 0
        self.fps, self.scaled_from = inner.fps, inner.scaled_from

    def read(self) -> np.ndarray | None:
        self.reads += 1
        if self.reads == self.nth:
            time.sleep(self.delay_s)
        return self.inner.read()

    def close(self) -> None:
        self.inner.close()


def test_the_frame_count_never_goes_back_and_each_break_starts_a_segment(videos: dict[str, Any]) -> None:
    cond, stop = threading.Condition(), threading.Event()
    pre = Preprocessor(InputSpec(name="x", shape=[1, 128, 128, 3], layout="NHWC"))
    opens: list[SlowOnce] = []

    def opener(c: CameraConfig) -> Source:
        opens.append(SlowOnce(open_source(c, pre.inner_size, stop), nth=5 if not opens else 0, delay_s=4.0))
        return opens[-1]

    cfg = CameraConfig(name="c", uri=f"file://{videos['loop']}", loop=True, realtime=False, stall_timeout_s=2.0)
    cam = Camera(cfg, pre, cond, stop, opener=opener)
    metas: list[FrameMeta] = []

    def take() -> bool:
        with cond:
            got = cam.take_locked()
            if got is not None:
                metas.append(got[1])
                cam.release_locked(got[0])
        return sum(m.frame == 0 for m in metas) >= 3

    cam.start()
    try:
        wait_until(take, 60, "three passes of the clip")
    finally:
        stop.set()
        cam.join(5)
    n = 24  # the clip's frames: every one is taken (realtime: false waits for it)
    assert [m.frame for m in metas] == [i % n for i in range(len(metas))]
    assert [m.seq for m in metas] == list(range(1, len(metas) + 1)), "the frame count never goes back"
    breaks = [(i, m.segment, m.segment_reason) for i, m in enumerate(metas) if i and m.segment != metas[i - 1].segment]
    assert breaks == [(4, 1, "stall"), (n, 2, "loop"), (2 * n, 3, "loop")], breaks
    assert cam.stats.stalls == 1


# --- end to end ---------------------------------------------------------------------------------------------


def test_a_looping_file_ends_its_tracks_at_each_wrap_and_never_reuses_an_id(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, videos: dict[str, Any]
) -> None:
    sub = subscribe(broker, "edged/#")
    cam = camera("loop", f"file://{videos['loop']}", loop=True, realtime=False)
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, [cam])))
    # the clip starts over twice (a result of its frame 0 in each pass)
    wait_until(lambda: sum(r["frame"] == 0 for r in sub.results("loop")) >= 3, 90, "three passes of the clip")
    assert d.stop() == 0, d.output()[-3000:]
    sub.wait_stopped()  # the object_ended events of the stop are among the last messages sent
    results = sorted(sub.results("loop"), key=lambda r: r["seq"])
    events = object_events(sub.messages)
    check_schema(events)
    passes: list[set[int]] = []
    for r in results:
        if r["frame"] == 0 or not passes:
            passes.append(set())
        passes[-1].update(x["track_id"] for x in r["detections"] if x.get("track_id") is not None)
    print(f"\ntrack ids per pass of the clip: {[sorted(p) for p in passes]}")
    assert all(len(p) >= 2 for p in passes[:-1]), "both people tracked in every whole pass"
    for k, (a, b) in enumerate(itertools.pairwise(passes)):
        assert not a & b, f"pass {k + 1} took ids {sorted(a & b)} of pass {k}: a stale track took a new object"
    appeared = {e["track_id"] for e in events if e["type"] == "object_appeared"}
    ended = {e["track_id"]: e for e in events if e["type"] == "object_ended"}
    assert appeared and appeared == set(ended), (appeared, set(ended))
    last = passes[-1]
    for tid, e in ended.items():  # every track ended at the wrap, but those alive when the daemon stopped
        assert e["reason"] == ("stopped" if tid in last else "loop"), (tid, e["reason"], sorted(last))
        assert e["first_frame"] <= e["last_frame"]


@pytest.mark.skipif(not gst.available(), reason=f"the RTSP server needs GStreamer: {gst.why_unavailable()}")
def test_an_rtsp_server_restarted_mid_run_ends_the_tracks_and_never_reuses_an_id(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, videos: dict[str, Any]
) -> None:
    from .test_capture_gst import RtspServer

    server = RtspServer(videos["long"])
    try:
        sub = subscribe(broker, "edged/#")
        cam = camera("ip", server.uri(), stall_timeout_s=3, reconnect_min_s=0.2, reconnect_max_s=0.5)
        d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, [cam])))

        def appeared() -> list[dict[str, Any]]:
            return [e for e in object_events(sub.messages) if e["type"] == "object_appeared"]

        wait_until(lambda: len(appeared()) >= 2, 90, "both people to appear")
        before = {e["track_id"] for e in appeared()}
        server.stop()
        wait_until(lambda: "camera ip: down" in d.output(), 20, "the camera to go down")

        def ended_now() -> dict[int, dict[str, Any]]:
            return {e["track_id"]: e for e in object_events(sub.messages) if e["type"] == "object_ended"}

        # while it is down, not when it comes back: a consumer counts no one who is gone
        wait_until(lambda: before <= set(ended_now()), 10, "the tracks to end while the camera is down")
        server.start()  # the camera rebooted: the stream starts again from its first frame
        wait_until(lambda: len({e["track_id"] for e in appeared()} - before) >= 2, 60, "both people again")
        assert d.stop() == 0, d.output()[-3000:]
        sub.wait_stopped()  # the object_ended events of the stop are among the last messages sent
    finally:
        server.stop()
    events = object_events(sub.messages)
    check_schema(events)
    results = sorted(sub.results("ip"), key=lambda r: r["seq"])
    # the reopened stream: from where the frame index starts again (results still on their way when the
    # camera went down belong to the first)
    reset = next(i for i in range(1, len(results)) if results[i]["frame"] < results[i - 1]["frame"])
    after = results[reset:]
    ids_after = {x["track_id"] for r in after for x in r["detections"] if x.get("track_id") is not None}
    print(f"\ntrack ids before the restart {sorted(before)}, after {sorted(ids_after)}")
    assert ids_after and not ids_after & before, f"old ids {sorted(ids_after & before)} took the new stream's faces"
    ended = {e["track_id"]: e for e in events if e["type"] == "object_ended"}
    all_appeared = {e["track_id"] for e in appeared()}
    assert all_appeared == set(ended), (all_appeared, set(ended))
    print(f"ended: {[(tid, e['reason']) for tid, e in sorted(ended.items())]}")
    for tid in before:
        assert ended[tid]["reason"] in ("reconnect", "stall"), ended[tid]
    order = [e for e in events if e["track_id"] in before | ids_after]  # the events in the order they came
    last_old_end = max(i for i, e in enumerate(order) if e["type"] == "object_ended" and e["track_id"] in before)
    first_new = min(i for i, e in enumerate(order) if e["track_id"] in ids_after)
    assert last_old_end < first_new, "the old tracks ended before the new ones appeared"


def test_a_scene_cut_between_two_overlapping_faces_gives_two_tracks(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path, videos: dict[str, Any]
) -> None:
    truth = videos["cut_truth"]
    overlap = iou(truth[19], truth[20])
    assert 0.3 <= overlap <= 0.5, f"the faces either side of the cut overlap with IoU {overlap:.2f}"
    sub = subscribe(broker, "edged/#")
    cam = camera("cut", f"file://{videos['cut']}", realtime=False)
    d = start_daemon(write_config(tmp_path / "c.yaml", base_config(broker, demo, tmp_path, [cam])))
    assert d.proc.wait(90) == 0, d.output()[-3000:]  # the file ends: the daemon stops
    sub.wait_stopped(10)
    results = {r["frame"]: r for r in sub.results("cut")}
    ids: list[set[int]] = [set(), set()]
    for frame, box in enumerate(truth):
        r = results.get(frame)
        found = [x for x in (r["detections"] if r else []) if iou(box, x["box"]) >= 0.5]
        assert found, f"frame {frame}: the face at {box} was not detected"  # the footage is fair
        ids[frame >= 20].update(x["track_id"] for x in found if x.get("track_id") is not None)
    print(f"\ntrack ids before the cut {sorted(ids[0])}, after {sorted(ids[1])}")
    assert len(ids[0]) == 1 and len(ids[1]) == 1 and ids[0] != ids[1], ids
    events = object_events(sub.messages)
    check_schema(events)
    kinds = [(e["type"], e["track_id"], e.get("reason")) for e in events]
    (a,), (b,) = ids
    assert kinds == [
        ("object_appeared", a, None),
        ("object_ended", a, "scene_cut"),
        ("object_appeared", b, None),
        ("object_ended", b, "stopped"),
    ], kinds
