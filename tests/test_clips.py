"""The clip store (daemon/record/store.py) and the planner (daemon/record/planner.py) on real H.264: packets
that GStreamer's openh264enc made, muxed by the real writer (record/mux.py), read back by GStreamer's
discoverer and decoder. The planner runs on a clock of the test's (a seam it takes), its ring filled as a
camera would fill it: packets up to "now" only. The daemon end to end (RTSP camera, MQTT, HTTP, SIGKILL,
restart) is in test_clips_daemon.py."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edged.daemon.capture.encoded import EncodedRing, Packet
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.config import load_config
from edged.daemon.config.cameras import RecordConfig
from edged.daemon.record.mux import write_mp4
from edged.daemon.record.planner import ClipPlanner, wall_of
from edged.daemon.record.store import Clip, ClipsHTTP, ClipStore, clips_reply
from edged.errors import ConfigError
from edged.protocol.commands import ClipsArgs
from edged.protocol.schemas import CLIP_SCHEMA, EVENT_SCHEMA, iso, schema

from .conftest import free_port, wait_until, write_config

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer: {gst.why_unavailable()}")

FPS = 10
GOP = 10  # a keyframe every second
T0 = 1_790_000_000.0  # the wall time of the first packet


def encode(seconds: int, width: int = 320, height: int = 240) -> tuple[str, list[tuple[int, int, bool, bytes]]]:
    """`seconds` of a moving test pattern as H.264 access units from openh264enc: (caps, [(pts, dur, key, data)])."""
    g, _ = gst.modules()
    p = g.parse_launch(
        f"videotestsrc num-buffers={seconds * FPS} pattern=ball ! video/x-raw,width={width},height={height},"
        f"framerate={FPS}/1 ! videoconvert ! openh264enc gop-size={GOP} complexity=low ! h264parse ! "
        "video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false"
    )
    sink = p.get_by_name("sink")
    p.set_state(g.State.PLAYING)
    out, caps = [], ""
    try:
        while (sample := sink.emit("try-pull-sample", 10 * g.SECOND)) is not None:
            buf = sample.get_buffer()
            ok, info = buf.map(g.MapFlags.READ)
            assert ok
            data = bytes(info.data)
            buf.unmap(info)
            out.append((buf.pts, buf.duration, not buf.has_flags(g.BufferFlags.DELTA_UNIT), data))
            caps = sample.get_caps().to_string()
    finally:
        p.set_state(g.State.NULL)
    assert len(out) == seconds * FPS and out[0][2]
    return caps, out


@pytest.fixture(scope="module")
def stream() -> tuple[str, list[Packet]]:
    """40 s of H.264 as a camera's packets, the first at T0."""
    caps, units = encode(40)
    return caps, [Packet(T0 + pts / 1e9, pts, dur, key, data) for pts, dur, key, data in units]


def discover(mp4: Path) -> float:
    """The MP4's duration as GStreamer's discoverer (gst-discoverer-1.0's library) reads it; fails when the
    file is no valid H.264 MP4."""
    import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

    with warnings.catch_warnings():  # PyGObject's importer predates exec_module
        warnings.simplefilter("ignore", ImportWarning)
        gi.require_version("GstPbutils", "1.0")
        from gi.repository import GstPbutils  # type: ignore[import-untyped,import-not-found,unused-ignore]

    g, _ = gst.modules()
    info = GstPbutils.Discoverer.new(20 * g.SECOND).discover_uri(mp4.resolve().as_uri())
    assert info.get_result() == GstPbutils.DiscovererResult.OK, f"{mp4}: {info.get_result()}"
    (video,) = info.get_video_streams()
    assert GstPbutils.pb_utils_get_codec_description(video.get_caps()).startswith("H.264")
    assert "quicktime" in info.get_stream_info().get_caps().to_string()
    return float(info.get_duration() / 1e9)


def decoded_frames(mp4: Path) -> int:
    """How many frames of the MP4 decode (qtdemux ! avdec_h264)."""
    g, _ = gst.modules()
    p = g.parse_launch(f'filesrc location="{mp4}" ! qtdemux ! h264parse ! avdec_h264 ! appsink name=sink sync=false')
    sink = p.get_by_name("sink")
    p.set_state(g.State.PLAYING)
    n = 0
    try:
        while sink.emit("try-pull-sample", 10 * g.SECOND) is not None:
            n += 1
    finally:
        p.set_state(g.State.NULL)
    return n


class Rig:
    """A ring fed up to the test's clock, a store, a planner on that clock, and what it emitted."""

    def __init__(self, tmp: Path, stream: tuple[str, list[Packet]], ring_s: float = 6.0, **record: Any) -> None:
        self.caps, self.packets = stream
        self.ring = EncodedRing(64 << 20, ring_s)
        self.ring.new_segment(self.caps)
        self.fed = 0
        self.now = T0
        self.store = ClipStore(tmp / "clips", 64 << 20, 3600.0, clock=lambda: self.now)
        self.store.recover()
        self.emitted: list[dict[str, Any]] = []
        rec = RecordConfig(**{"pre_s": 3.0, "post_s": 2.0, **record})
        self.planner = ClipPlanner(
            {"cam": self.ring}, {"cam": rec}, self.store, write_mp4, self.emitted.append, 32 << 20, clock=self.clock
        )

    def clock(self) -> float:
        return self.now

    def at(self, t: float) -> None:
        """The camera has delivered every packet up to T0 + t; the planner ticks."""
        self.now = T0 + t
        while self.fed < len(self.packets) and self.packets[self.fed].wall <= self.now:
            self.ring.add(self.packets[self.fed])
            self.fed += 1
        self.planner.tick()

    def run_to(self, t: float, step: float = 0.5) -> None:
        x = self.now - T0
        while x < t:
            x = min(t, x + step)
            self.at(x)

    def event(self, kind: str, track: int, first: float, last: float | None = None) -> dict[str, Any]:
        doc = {
            "type": kind,
            "camera": "cam",
            "track_id": track,
            "label": "face",
            "first_seen": iso(T0 + first),
            "last_seen": iso(T0 + (first if last is None else last)),
        }
        self.planner.observe(doc)
        return doc

    def ready(self) -> list[dict[str, Any]]:
        return [e for e in self.emitted if e["type"] == "clip_ready"]


def check_clip(clip: dict[str, Any], store: ClipStore, start: float, end: float) -> float:
    """The clip's file is a valid MP4 whose span covers [T0+start, T0+end] within one keyframe interval; its
    bytes and SHA-256 are the file's; returns its duration."""
    path = store.file(clip["id"])
    assert path is not None and path.exists()
    data = path.read_bytes()
    assert clip["bytes"] == len(data) and clip["sha256"] == hashlib.sha256(data).hexdigest()
    duration = discover(path)
    assert duration == pytest.approx(clip["duration_s"], abs=0.15)
    first = wall_of(clip["start"])
    interval = GOP / FPS
    assert T0 + start - interval - 0.01 <= first <= T0 + start + 0.01, (first - T0, start)
    assert first + duration >= T0 + end - 0.11, (first + duration - T0, end)
    assert first + duration <= T0 + end + interval + 0.11
    assert decoded_frames(path) == pytest.approx(duration * FPS, abs=1)
    return duration


# --- the planner ---------------------------------------------------------------------------------------------
def test_overlapping_events_make_one_clip_with_pre_and_post_roll(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream)  # the ring keeps 6 s: less than the clip, whose start must still be there
    r.run_to(10.0)
    a1 = r.event("object_appeared", 1, 10.05)
    r.run_to(12.0)
    a2 = r.event("object_appeared", 2, 12.0)  # overlaps track 1: the same clip
    r.run_to(14.0)
    e1 = r.event("object_ended", 1, 10.05, 14.0)
    r.run_to(16.0)
    e2 = r.event("object_ended", 2, 12.0, 16.0)
    r.run_to(17.5)
    assert not r.ready(), "closed before post_s"
    r.run_to(19.0)
    (ready,) = r.ready()
    ids = {d["clip"]["id"] for d in (a1, a2, e1, e2)}
    assert ids == {ready["clip"]["id"]}, "every event names the one clip"
    jsonschema.validate({"schema": EVENT_SCHEMA, "device": "d", "boot_id": "0" * 32, "ts": iso(r.now), **ready},
                        schema(EVENT_SCHEMA))  # fmt: skip
    for d in (a1, e2):
        jsonschema.validate({"schema": EVENT_SCHEMA, "device": "d", "boot_id": "0" * 32, "ts": iso(r.now), **d,
                             "first_frame": 0, "last_frame": 1, "dwell_s": 1.0, "best_score": 0.9, "box": [0, 0, 1, 1],
                             "zones": []}, schema(EVENT_SCHEMA))  # fmt: skip
    clip = ready["clip"]
    assert clip["url_path"] == f"/clips/{clip['id']}.mp4" and clip["camera"] == "cam"
    check_clip(clip, r.store, 10.05 - 3.0, 16.0 + 2.0)
    assert r.planner.stats.merged == 1 and r.planner.stats.gaps == 0
    side = json.loads((tmp_path / "clips" / "cam" / f"{clip['id']}.json").read_text())
    jsonschema.validate(side, schema(CLIP_SCHEMA))
    assert [(e["type"], e["track_id"]) for e in side["events"]] == [
        ("object_appeared", 1),
        ("object_appeared", 2),
        ("object_ended", 1),
        ("object_ended", 2),
    ]
    assert side["uploaded"] is False and side["sha256"] == clip["sha256"]


def test_events_apart_make_two_clips_and_a_late_end_names_its_clip(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream, pre_s=1.0, post_s=1.0)
    r.run_to(5.0)
    r.event("object_appeared", 1, 5.0)
    r.run_to(6.0)
    r.event("object_ended", 1, 5.0, 6.0)
    r.run_to(9.0)
    r.event("object_appeared", 2, 12.0)  # its first_seen is later than the clock: the span waits for it
    r.run_to(14.0)
    r.event("object_ended", 2, 12.0, 14.0)
    r.run_to(20.0)
    first, second = r.ready()
    assert first["clip"]["id"] != second["clip"]["id"]
    check_clip(first["clip"], r.store, 4.0, 7.0)
    check_clip(second["clip"], r.store, 11.0, 15.0)
    assert [c.id for c in r.store.query()] == [second["clip"]["id"], first["clip"]["id"]]  # newest first


def test_a_long_event_is_cut_at_max_clip_s_and_goes_on(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream, pre_s=1.0, post_s=1.0, max_clip_s=6.0)
    r.run_to(3.0)
    a = r.event("object_appeared", 7, 3.0)
    r.run_to(20.0)
    e = r.event("object_ended", 7, 3.0, 20.0)
    r.run_to(24.0)
    clips = [x["clip"] for x in r.ready()]
    assert len(clips) == 4, [c["duration_s"] for c in clips]  # 2 s to 21 s in clips of 6 s and a frame
    assert a["clip"]["id"] == clips[0]["id"] and e["clip"]["id"] == clips[-1]["id"]
    durations = [check_clip(clips[0], r.store, 2.0, 2.0 + 6.0)]
    for c in clips[1:]:
        path = r.store.file(c["id"])
        assert path is not None
        durations.append(discover(path))
        assert durations[-1] <= 6.0 + GOP / FPS + 0.2
    # together they cover the event: each starts at most a keyframe interval before the previous one ended
    starts = [wall_of(c["start"]) for c in clips]
    for prev, s in zip(clips, starts[1:], strict=False):
        assert s <= wall_of(prev["start"]) + prev["duration_s"] + 0.11
    assert starts[-1] + durations[-1] >= T0 + 21.0 - 0.11
    assert r.planner.stats.cut == 3


def test_a_stop_writes_the_open_clip_from_what_the_ring_holds(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream)
    r.run_to(8.0)
    a = r.event("object_appeared", 1, 8.0)
    r.run_to(11.0)
    r.planner.flush()  # what join() does at a stop, once the cameras have stopped
    (ready,) = r.ready()
    assert ready["clip"]["id"] == a["clip"]["id"]
    check_clip(ready["clip"], r.store, 5.0, 11.0)
    late = r.event("object_ended", 1, 8.0, 11.0)  # the scenes' last events, after the flush
    assert late["clip"]["id"] == a["clip"]["id"]


def test_observe_leaves_other_events_and_cameras_alone(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream)
    other = {"type": "object_appeared", "camera": "other", "track_id": 1, "first_seen": iso(T0)}
    r.planner.observe(other)
    model = {"type": "model_activated", "camera": "cam"}
    r.planner.observe(model)
    assert "clip" not in other and "clip" not in model
    r.run_to(5.0)
    assert r.ready() == [] and r.planner.summary()["open"] == 0


# --- the store -----------------------------------------------------------------------------------------------
def muxed(store: ClipStore, stream: Any, clip_id: str, start_s: float, seconds: float, **kw: Any) -> Clip:
    caps, packets = stream
    first = int(start_s * FPS) // GOP * GOP
    span = packets[first : first + int(seconds * FPS)]
    m = write_mp4(caps, span, store.path("cam", clip_id))
    clip = Clip(clip_id, "cam", m.start_wall, m.duration_s, m.bytes, m.sha256, [], **kw)
    store.add(clip)
    return clip


def test_the_store_keeps_its_byte_bound_oldest_first_and_pending_last(tmp_path: Path, stream: Any) -> None:
    probe = ClipStore(tmp_path / "probe", 1 << 30, 3600.0)
    one = muxed(probe, stream, "p", 0, 3.0)
    bound = int((one.bytes + one.side_bytes) * 3.5)  # room for three clips
    store = ClipStore(tmp_path / "clips", bound, 3600.0, clock=lambda: T0 + 100)
    store.recover()
    made = []
    for i in range(10):
        pending = i == 1
        c = muxed(store, stream, f"c{i}", 3 * i, 3.0, pending=pending)
        made.append(c.id)
        assert store.stats.bytes <= bound
        on_disk = sum(p.stat().st_size for p in (tmp_path / "clips" / "cam").iterdir())
        assert on_disk == store.stats.bytes
    kept = [c.id for c in store.query()]
    assert kept == ["c9", "c8", "c1"], kept  # the pending one outlived newer ones; the oldest went first
    assert store.stats.removed_bytes == 7 and store.stats.dropped_pending == 0
    store.mark_uploaded("c1", True)
    assert json.loads((tmp_path / "clips" / "cam" / "c1.json").read_text())["uploaded"] is True
    muxed(store, stream, "c10", 30, 3.0)
    assert [c.id for c in store.query()] == ["c10", "c9", "c8"]  # uploaded: now the oldest, it goes


def test_the_store_removes_by_age_but_keeps_a_pending_clip(tmp_path: Path, stream: Any) -> None:
    now = [T0]
    store = ClipStore(tmp_path / "clips", 1 << 30, 60.0, clock=lambda: now[0])
    muxed(store, stream, "old", 0, 2.0)
    muxed(store, stream, "waiting", 2, 2.0, pending=True)
    muxed(store, stream, "new", 20, 2.0)
    now[0] = T0 + 70.0
    assert store.prune() == ["removed clip old (older than max_age_h)"]
    assert sorted(c.id for c in store.query()) == ["new", "waiting"]
    store.mark_uploaded("waiting", False)  # a failed upload: no longer pending, it ages out
    store.prune()
    assert [c.id for c in store.query()] == ["new"] and store.stats.removed_age == 2


def test_a_restart_lists_the_complete_clips_and_removes_the_rest(tmp_path: Path, stream: Any) -> None:
    store = ClipStore(tmp_path / "clips", 1 << 30, 3600.0, clock=lambda: T0 + 10)
    store.recover()
    a = muxed(store, stream, "a", 0, 2.0)
    b = muxed(store, stream, "b", 2, 2.0)
    d = tmp_path / "clips" / "cam"
    (d / "c.mp4.part").write_bytes(b"half a clip")  # a SIGKILL in the muxer
    (d / "d.mp4").write_bytes((d / "a.mp4").read_bytes())  # killed between the MP4 and its sidecar
    (d / "e.json").write_text((d / "b.json").read_text().replace('"b"', '"e"'))  # a sidecar without its MP4
    side = json.loads((d / "b.json").read_text())
    (d / "f.mp4").write_bytes((d / "b.mp4").read_bytes()[:-100])  # a truncated file behind a whole sidecar
    (d / "f.json").write_text(json.dumps({**side, "id": "f"}))
    again = ClipStore(tmp_path / "clips", 1 << 30, 3600.0, clock=lambda: T0 + 10)
    lines = again.recover()
    assert sorted(c.id for c in again.query()) == ["a", "b"]
    assert again.stats.partial_removed == 4, lines
    assert sorted(p.name for p in d.iterdir()) == ["a.json", "a.mp4", "b.json", "b.mp4"]
    assert again.get("a") == a and again.stats.bytes == store.stats.bytes
    assert b.sha256 == hashlib.sha256((d / "b.mp4").read_bytes()).hexdigest()


KILLED_WRITER = """
import sys, time
from pathlib import Path
from edged.daemon.capture.encoded import Packet
from edged.daemon.record.mux import write_mp4
from edged.daemon.record.store import Clip, ClipStore
from edged.daemon.capture.gstreamer.pipeline import modules
g, _ = modules()
p = g.parse_launch(
    "videotestsrc num-buffers=300 pattern=ball ! video/x-raw,width=1280,height=720,framerate=10/1 ! videoconvert ! "
    "openh264enc gop-size=10 complexity=low bitrate=8000000 ! h264parse ! "
    "video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false"
)
sink = p.get_by_name("sink")
p.set_state(g.State.PLAYING)
packets = []
while (s := sink.emit("try-pull-sample", 10 * g.SECOND)) is not None:
    b = s.get_buffer()
    ok, m = b.map(g.MapFlags.READ)
    key = not b.has_flags(g.BufferFlags.DELTA_UNIT)
    packets.append(Packet(1.79e9 + b.pts / 1e9, b.pts, b.duration, key, bytes(m.data)))
    b.unmap(m)
    caps = s.get_caps().to_string()
p.set_state(g.State.NULL)
store = ClipStore(Path(sys.argv[1]), 1 << 32, 1e9)
store.recover()
print("ready", flush=True)
i = 0
while True:
    i += 1
    m = write_mp4(caps, packets, store.path("cam", f"k{i}"))
    store.add(Clip(f"k{i}", "cam", m.start_wall, m.duration_s, m.bytes, m.sha256, []))
"""


def test_sigkill_while_writing_leaves_no_corrupt_clip_listed(tmp_path: Path) -> None:
    root = tmp_path / "clips"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # kill it while a clip is being written: once the first clip is whole, at the next .part seen
        wait_until(lambda: (root / "cam" / "k1.json").exists(), 120, "a first clip")
        wait_until(lambda: any((root / "cam").glob("*.part")), 60, "a clip being written", step=0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    store = ClipStore(root, 1 << 32, 1e9)
    store.recover()
    assert store.stats.partial_removed >= 1
    assert not list((root / "cam").glob("*.part"))
    listed = store.query()
    assert listed, "the clips written before the kill are listed"
    for c in listed:
        path = store.file(c.id)
        assert path is not None
        assert hashlib.sha256(path.read_bytes()).hexdigest() == c.sha256
        assert discover(path) == pytest.approx(c.duration_s, abs=0.15)
    assert {p.stem for p in (root / "cam").glob("*.mp4")} == {c.id for c in listed}


# --- what reads the store: the verb's reply, HTTP ---------------------------------------------------------------
def test_the_clips_reply_filters_limits_and_stays_under_its_cap(tmp_path: Path, stream: Any) -> None:
    store = ClipStore(tmp_path / "clips", 1 << 30, 1e9)
    for i in range(4):
        muxed(store, stream, f"c{i}", 5 * i, 2.0)
    got = clips_reply(store, ClipsArgs(limit=2))
    assert [c["id"] for c in got["clips"]] == ["c3", "c2"] and got["more"] and got["stored"] == 4
    since = iso(T0 + 12.0)  # c2 starts at T0+10 and lasts 2 s: it ends at T0+12, which is not after
    got = clips_reply(store, ClipsArgs(since=since))
    assert [c["id"] for c in got["clips"]] in (["c3"], ["c3", "c2"]) and not got["more"]
    assert clips_reply(store, ClipsArgs(camera="nope"))["clips"] == []
    for c in clips_reply(store, ClipsArgs())["clips"]:
        jsonschema.validate(c, schema(CLIP_SCHEMA))


class _Server:
    def __init__(self, http: ClipsHTTP) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                http.handle(self, path, query)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[list[_Server]]:
    made: list[_Server] = []
    yield made
    for s in made:
        s.close()


def test_http_lists_and_serves_clips_to_loopback_or_the_token(tmp_path: Path, stream: Any, servers: Any) -> None:
    store = ClipStore(tmp_path / "clips", 1 << 30, 1e9)
    clip = muxed(store, stream, "c0", 0, 3.0)
    open_ = _Server(ClipsHTTP(store, None))
    servers.append(open_)
    status, body, ctype = open_.get("/clips")
    assert status == 200 and ctype == "application/json"
    assert [c["id"] for c in json.loads(body)["clips"]] == ["c0"]
    status, body, ctype = open_.get(clip.url_path)
    assert status == 200 and ctype == "video/mp4" and hashlib.sha256(body).hexdigest() == clip.sha256
    assert open_.get("/clips/nope.mp4")[0] == 404
    assert open_.get("/clips/../../etc/passwd")[0] == 404
    assert open_.get("/clips?limit=x")[0] == 400
    token = "t" * 24
    guarded = _Server(ClipsHTTP(store, token))
    servers.append(guarded)
    assert guarded.get("/clips/c0.mp4", {"Authorization": "Bearer wrong-token-wrong"})[0] == 403
    assert guarded.get("/clips")[0] == 403  # with a token, loopback needs it too (as /live)
    status, body, _ = guarded.get(f"/clips/c0.mp4?token={token}")
    assert status == 200 and len(body) == clip.bytes
    assert guarded.get("/clips", {"Authorization": f"Bearer {token}"})[0] == 200


# --- config --------------------------------------------------------------------------------------------------
def test_the_clips_section_defaults_resolves_and_refuses(tmp_path: Path) -> None:
    base = {"device_id": "d", "model": {"package": "pkg"}, "cameras": [{"name": "c", "uri": "synthetic://"}]}
    cfg = load_config(write_config(tmp_path / "a.yaml", base))
    assert cfg.clips.dir is None and cfg.clips.max_mb == 1024 and not cfg.clips.upload
    cfg = load_config(write_config(tmp_path / "b.yaml", {**base, "clips": {"dir": "evidence", "max_mb": 10}}))
    assert cfg.clips.dir == tmp_path / "evidence" and cfg.clips.max_mb == 10
    with pytest.raises(ConfigError, match=r"clips\.max_mb"):
        load_config(write_config(tmp_path / "c.yaml", {**base, "clips": {"max_mb": 0}}))
    with pytest.raises(ConfigError, match=r"clips\.bogus"):
        load_config(write_config(tmp_path / "d.yaml", {**base, "clips": {"bogus": 1}}))


def test_wall_of_reads_the_wire_times() -> None:
    assert wall_of(iso(T0 + 1.25)) == pytest.approx(T0 + 1.25, abs=1e-3)
    assert wall_of("2026-12-02T10:00:00.500+00:00") == pytest.approx(1796205600.5)


def test_a_flood_of_events_keeps_the_store_within_its_bound(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream, pre_s=0.5, post_s=0.2)
    bound = 200_000
    r.store.max_bytes = bound
    for track, t in enumerate(range(2, 38), start=1):  # a short track every second, apart: one clip each
        r.run_to(t)
        r.event("object_appeared", track, t + 0.05)
        r.run_to(t + 0.4)
        r.event("object_ended", track, t + 0.05, t + 0.3)
        assert r.store.stats.bytes <= bound
        on_disk = sum(p.stat().st_size for p in (tmp_path / "clips" / "cam").glob("*"))
        assert on_disk == r.store.stats.bytes
    r.run_to(39.9)
    written = len(r.ready())
    assert written >= 30 and r.store.stats.removed_bytes > 0
    assert r.store.stats.removed_bytes + r.store.stats.clips == written
    kept = r.store.query(limit=1000)
    assert [c.id for c in kept] == [e["clip"]["id"] for e in reversed(r.ready())][: len(kept)]  # the newest kept
    summary = r.planner.summary()
    assert summary["written"] == written and summary["written_bytes"] > bound and summary["bytes"] <= bound


def test_a_clip_the_muxer_refuses_is_counted_and_leaves_nothing(tmp_path: Path, stream: Any) -> None:
    caps, packets = stream
    r = Rig(tmp_path, ("video/x-h265, stream-format=(string)hvc1, alignment=(string)au", packets))  # H.264 bytes
    r.run_to(5.0)
    doc = r.event("object_appeared", 1, 5.0)
    r.run_to(6.0)
    r.event("object_ended", 1, 5.0, 6.0)
    r.run_to(12.0)
    assert "clip" in doc and r.ready() == [] and r.planner.stats.failed == 1
    assert list((tmp_path / "clips" / "cam").iterdir()) == [] and r.store.query() == []
    assert r.planner.summary()["failed"] == 1 and caps.startswith("video/x-h264")


def test_a_clip_whose_sidecar_the_disk_refuses_leaves_no_unlisted_mp4(tmp_path: Path, stream: Any) -> None:
    r = Rig(tmp_path, stream, pre_s=0.5, post_s=0.5)
    r.run_to(4.0)
    doc = r.event("object_appeared", 1, 4.0)
    blocker = tmp_path / "clips" / "cam" / f"{doc['clip']['id']}.json"
    blocker.mkdir(parents=True)  # the sidecar's place is taken: its atomic write fails, as on a full disk
    r.event("object_ended", 1, 4.0, 5.0)
    r.run_to(10.0)
    assert r.ready() == [] and r.planner.stats.failed == 1 and r.planner.stats.written == 0
    assert sorted(p.name for p in (tmp_path / "clips" / "cam").iterdir()) == [blocker.name]  # no MP4 left
    assert r.store.stats.bytes == 0 and r.store.query() == []
    blocker.rmdir()
    r.event("object_appeared", 2, 11.0)
    r.event("object_ended", 2, 11.0, 12.0)
    r.run_to(16.0)
    (clip,) = r.ready()
    check_clip(clip["clip"], r.store, 10.5, 12.5)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "clips" / "cam").iterdir())
    assert on_disk == r.store.stats.bytes


def test_an_upload_verdict_racing_the_bounds_leaves_no_orphan_sidecar(
    tmp_path: Path, stream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edged.daemon.record.store as store_mod
    from edged.models.store.files import write_atomic as real

    now = [T0]
    store = ClipStore(tmp_path / "clips", 1 << 30, 60.0, clock=lambda: now[0])
    muxed(store, stream, "c0", 0, 2.0, pending=True)

    def prune_first(path: Path, data: bytes) -> None:  # the planner's prune runs while the verdict is written
        now[0] = T0 + 3600.0  # past its age, and the verdict made it no longer pending
        pruner = threading.Thread(target=store.prune)
        pruner.start()
        pruner.join()
        real(path, data)

    monkeypatch.setattr(store_mod, "write_atomic", prune_first)
    store.mark_uploaded("c0", True)
    assert store.get("c0") is None and list((tmp_path / "clips" / "cam").iterdir()) == []
    assert store.stats.bytes == 0 and store.stats.removed_age == 1


def test_a_busy_scene_names_at_most_max_events_and_an_oversize_sidecar_hides_no_other(
    tmp_path: Path, stream: Any
) -> None:
    from edged.daemon.record.planner import MAX_EVENTS
    from edged.protocol.commands import CLIPS_REPLY_BYTES

    r = Rig(tmp_path, stream, pre_s=0.5, post_s=0.5)
    r.run_to(4.0)
    r.event("object_appeared", 1, 4.0)
    for i in range(MAX_EVENTS + 100):  # a zone flapping: far more events than a sidecar names
        r.event("object_zone_entered", 1, 4.0, 4.0 + i / 1000)
    r.event("object_ended", 1, 4.0, 5.0)
    r.run_to(10.0)
    (ready,) = r.ready()
    side = json.loads((tmp_path / "clips" / "cam" / f"{ready['clip']['id']}.json").read_text())
    assert len(side["events"]) == MAX_EVENTS and r.planner.summary()["events_dropped"] == 102
    assert len(json.dumps(side)) < CLIPS_REPLY_BYTES // 2
    # an older sidecar (or another writer's) over the cap alone: the reply skips it, not the clips after it
    big = [{"type": "object_zone_entered", "track_id": i, "label": "face", "ts": iso(T0)} for i in range(4000)]
    muxed(r.store, stream, "huge", 0.0, 2.0).events.extend(big)
    muxed(r.store, stream, "older", 0.0, 1.0)
    r.store.get("older").start -= 100  # type: ignore[union-attr]
    got = clips_reply(r.store, ClipsArgs())
    assert [c["id"] for c in got["clips"]] == [ready["clip"]["id"], "older"] and got["more"]


def test_a_quiet_camera_still_loses_its_clips_past_max_age(tmp_path: Path, stream: Any) -> None:
    from edged.daemon.record.planner import HOUSEKEEP_S

    r = Rig(tmp_path, stream, pre_s=0.5, post_s=0.5)
    r.run_to(4.0)
    r.event("object_appeared", 1, 4.0)
    r.event("object_ended", 1, 4.0, 5.0)
    r.run_to(10.0)
    (ready,) = r.ready()
    r.store.max_age_s = 30.0  # the clip is past it from T0+34 on; no other clip comes to trigger a prune
    r.run_to(HOUSEKEEP_S - 1.0)
    assert r.store.get(ready["clip"]["id"]) is not None  # the bound is applied every HOUSEKEEP_S, not every tick
    r.run_to(HOUSEKEEP_S + 1.0)
    assert r.store.get(ready["clip"]["id"]) is None and r.store.stats.removed_age == 1
    assert list((tmp_path / "clips" / "cam").iterdir()) == []


def test_a_restart_removes_a_sidecars_temporary_file(tmp_path: Path, stream: Any) -> None:
    store = ClipStore(tmp_path / "clips", 1 << 30, 1e9)
    muxed(store, stream, "c0", 0, 2.0)
    tmp = tmp_path / "clips" / "cam" / ".c1.json.tmp"  # a power cut inside write_atomic
    tmp.write_bytes(b'{"schema": "edged.cl')
    again = ClipStore(tmp_path / "clips", 1 << 30, 1e9)
    again.recover()
    assert not tmp.exists() and again.stats.partial_removed == 1 and [c.id for c in again.query()] == ["c0"]


def test_a_rotated_token_opens_clips_and_the_old_one_no_longer_does(tmp_path: Path, stream: Any, servers: Any) -> None:
    from edged.daemon.liveview import read_token

    store = ClipStore(tmp_path / "clips", 1 << 30, 1e9)
    muxed(store, stream, "c0", 0, 2.0)
    token_file = tmp_path / "token"
    old, new = "o" * 24, "n" * 24
    token_file.write_text(old)
    server = _Server(ClipsHTTP(store, lambda: read_token(token_file)))
    servers.append(server)
    assert server.get(f"/clips?token={old}")[0] == 200
    token_file.write_text(new)  # rotated while the daemon runs
    assert server.get(f"/clips?token={old}")[0] == 403
    assert server.get(f"/clips?token={new}")[0] == 200
    token_file.unlink()  # gone: nobody gets in
    assert server.get(f"/clips?token={new}")[0] == 403


def test_clips_upload_without_an_upload_section_is_refused_at_load(tmp_path: Path) -> None:
    base = {"device_id": "d", "model": {"package": "pkg"}, "cameras": [{"name": "c", "uri": "synthetic://"}]}
    with pytest.raises(ConfigError, match=r"clips\.upload needs an upload"):
        load_config(write_config(tmp_path / "a.yaml", {**base, "clips": {"upload": True}}))
    cfg = load_config(write_config(tmp_path / "b.yaml", {**base, "clips": {"upload": True},
                                                         "upload": {"url": "http://127.0.0.1:9/dav"}}))  # fmt: skip
    assert cfg.clips.upload and cfg.upload is not None
