"""Clips end to end: a real daemon (`edged run`) on a real RTSP camera (tests/rtsp_server.py, gst-rtsp-server,
sending the demo video as H.264 with a keyframe every second, no re-encode on the device) with the BlazeFace
demo model and ``record:`` on, through the site's broker as shipped (edged.conf and edged.acl, certificates
from `edged certs`: tests/test_site.py). A face appears: its events name a clip, ``clip_ready`` follows on
MQTT, the clip is fetched over the local HTTP server and is a valid MP4 (GStreamer's discoverer) whose span
covers pre_s + the event + post_s within one keyframe interval. Its upload (``clips.upload`` to a real nginx
WebDAV, tests/nginx_dav.py) waits while nginx is down and lands byte for byte once it is up. Then a SIGKILL and
a restart: the complete clips are listed again, by the ``clips`` verb through `edged clips` with the backend's
identity, and every clip of the first run reaches nginx (none is lost to the kill)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest

from edged.daemon.capture.gstreamer import pipeline as gst
from edged.models.demo import DemoAssets
from edged.protocol.schemas import CLIP_SCHEMA, EVENT_SCHEMA, TELEMETRY_SCHEMA, schema
from tests.conftest import DaemonProc, base_config, edged_cli, free_port, wait_until, write_config
from tests.nginx_dav import DavServer
from tests.test_clips import discover
from tests.test_site import SiteBroker, backend_config, connect, shipped, site, subscribed  # noqa: F401

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer: {gst.why_unavailable()}")

HERE = Path(__file__).parent
KEY_INTERVAL_S = 1.0  # gop-size 15 at the demo video's 15 fps
PRE_S, POST_S = 1.5, 1.0


def wall(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def h264_1s(demo: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo video as H.264 with a keyframe every second, which the RTSP server sends as it is."""
    out = tmp_path_factory.mktemp("clips-h264") / "demo.mp4"
    cmd = f"gst-launch-1.0 -q filesrc location={demo.video} ! qtdemux ! decodebin ! videoconvert ! openh264enc "
    cmd += f"complexity=low bitrate=2000000 gop-size=15 ! h264parse ! mp4mux ! filesink location={out}"
    subprocess.run(cmd.split(), check=True, timeout=120)
    return out


@pytest.fixture
def rtsp(h264_1s: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "rtsp_server.py"), str(port), str(h264_1s), "--h264"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"rtsp://127.0.0.1:{port}/cam"
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def events(seen: list[mqtt.MQTTMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in list(seen) if m.topic == "edged/cam-01/events"]


@pytest.fixture
def dav_down(tmp_path: Path) -> Iterator[DavServer]:
    """A real nginx WebDAV server for the clips' uploads, not started: down until the test starts it."""
    dav = DavServer(tmp_path)
    yield dav
    dav.stop()


def telemetry(seen: list[mqtt.MQTTMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in list(seen) if m.topic == "edged/cam-01/telemetry"]


def landed(dav: DavServer, camera: str, clip: dict[str, Any], device: str = "cam-01") -> bool:
    """The clip is on nginx, whole: its bytes hash to the sha256 its clip_ready (or listing) named."""
    put = dav.root / "dav" / device / camera / f"{clip['id']}.mp4"
    return put.exists() and hashlib.sha256(put.read_bytes()).hexdigest() == clip["sha256"]


def listed_by(d: DaemonProc, port: int, got: dict[str, Any]) -> bool:
    """The daemon's /clips into got["clips"]; False while it does not answer yet (it must still run)."""
    assert d.proc.poll() is None, "the restarted daemon exited"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/clips?limit=1000", timeout=5) as resp:
            got["clips"] = json.loads(resp.read())["clips"]
    except OSError:
        return False
    return True


def test_an_event_clip_over_rtsp_mqtt_and_http_survives_a_sigkill_and_a_restart(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., tuple[mqtt.Client, list[mqtt.MQTTMessage]]],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProc],
    rtsp: str,
    dav_down: DavServer,
) -> None:
    dav = dav_down
    pki = site / "certs"
    http_port = free_port()
    cam = {
        "name": "door",
        "uri": rtsp,
        "record": {"pre_s": PRE_S, "post_s": POST_S, "max_clip_s": 60},
        "detection": {"tracking": {"min_hits": 3, "max_age": 5}, "publish": "events"},
    }
    doc = base_config(shipped, demo, tmp_path, [cam], device_id="cam-01")
    doc["mqtt"]["tls"] = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "cam-01.crt"),
                          "key_file": str(pki / "cam-01.key")}  # fmt: skip
    doc["health"] = {"enabled": True, "port": http_port}
    doc["clips"] = {"max_mb": 64, "upload": True}
    doc["upload"] = {"url": f"{dav.url}/dav/cam-01", "retry_min_s": 0.2, "retry_max_s": 1.0, "timeout_s": 10}
    cfg = write_config(tmp_path / "cam-01.yaml", doc)
    backend, seen = connect(shipped, "backend")
    subscribed(backend, "edged/cam-01/#")
    d = start_daemon(cfg)
    try:
        wait_until(
            lambda: d.proc.poll() is not None or any(e["type"] == "clip_ready" for e in events(seen)),
            150,
            "a clip_ready event",
        )
        assert d.proc.poll() is None, "the daemon exited"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d.output()[-4000:]}") from None
    evs = events(seen)
    ready = next(e for e in evs if e["type"] == "clip_ready")
    for e in evs:
        jsonschema.validate(e, schema(EVENT_SCHEMA))
    clip = ready["clip"]
    mine = [e for e in evs if e["type"].startswith("object_") and e.get("clip", {}).get("id") == clip["id"]]
    appeared = [e for e in mine if e["type"] == "object_appeared"]
    ended = [e for e in mine if e["type"] == "object_ended"]
    assert appeared and ended, f"the clip's events: {[(e['type'], e.get('track_id')) for e in mine]}"
    assert {e["track_id"] for e in ended} == {e["track_id"] for e in appeared}, "the clip closed with a track open"

    # nginx is down: the upload fails, is tried again and stays queued; once nginx is up the clip lands, whole
    wait_until(lambda: any(t.get("uploads", {}).get("failed_attempts", 0) >= 1 and t["clips"]["pending"] >= 1
                           for t in telemetry(seen)), 30, "a failed upload attempt, the clip pending")  # fmt: skip
    assert not landed(dav, "door", clip)
    dav.start()
    wait_until(lambda: landed(dav, "door", clip), 30, "the clip on nginx with the clip_ready's sha256")

    # fetched through the daemon's own HTTP server (loopback: no token needed)
    url = f"http://127.0.0.1:{http_port}{clip['url_path']}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
        assert resp.headers["Content-Type"] == "video/mp4"
    assert len(body) == clip["bytes"] and hashlib.sha256(body).hexdigest() == clip["sha256"]
    mp4 = tmp_path / "fetched.mp4"
    mp4.write_bytes(body)
    duration = discover(mp4)
    assert duration == pytest.approx(clip["duration_s"], abs=0.2)
    # its span covers pre_s + the event + post_s, starting at most one keyframe interval early
    first = min(wall(e["first_seen"]) for e in appeared)
    last = max(wall(e["last_seen"]) for e in ended)
    start = wall(clip["start"])
    assert first - PRE_S - KEY_INTERVAL_S - 0.2 <= start <= first - PRE_S + 0.2, (start - first, PRE_S)
    assert start + duration >= last + POST_S - 0.2, (start + duration - last, POST_S)
    assert start + duration <= last + POST_S + KEY_INTERVAL_S + 0.5

    def listed_now() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/clips?camera=door", timeout=30) as resp:
            clips: list[dict[str, Any]] = json.loads(resp.read())["clips"]
        return clips

    # the sidecar says uploaded once nginx took it
    wait_until(lambda: any(c["id"] == clip["id"] and c["uploaded"] for c in listed_now()), 30, "uploaded: true")
    listed = listed_now()
    for c in listed:
        jsonschema.validate(c, schema(CLIP_SCHEMA))
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert "edged_clips_written_total" in metrics and "edged_clips_bytes " in metrics
    wait_until(
        lambda: any(json.loads(m.payload).get("clips", {}).get("written", 0) >= 1 for m in list(seen)
                    if m.topic == "edged/cam-01/telemetry"), 30, "telemetry counting the clip")  # fmt: skip
    tel = telemetry(seen)
    jsonschema.validate(tel[-1], schema(TELEMETRY_SCHEMA))
    assert tel[-1]["clips"]["clips"] >= 1 and tel[-1]["clips"]["written_bytes"] >= clip["bytes"]

    # the `clips` verb through `edged clips` with the backend's identity and the shipped ACL
    ops = backend_config(shipped, site, doc, tmp_path / "backend.yaml")
    r = edged_cli("clips", "-d", "cam-01", "-c", str(ops), "--json", "--camera", "door", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    by_verb = {c["id"]: c for c in json.loads(r.stdout)}
    assert by_verb[clip["id"]]["sha256"] == clip["sha256"]
    for c in by_verb.values():
        jsonschema.validate(c, schema(CLIP_SCHEMA))
    out = tmp_path / "via-cli.mp4"
    base = f"http://127.0.0.1:{http_port}"
    r = edged_cli("clips", "-d", "cam-01", "-c", str(ops), "--fetch", clip["id"], "--http", base, "--out", str(out))
    assert r.returncode == 0 and out.read_bytes() == body, r.stdout + r.stderr

    # SIGKILL (whatever it was writing), then a restart on the same state directory lists the complete clips
    d.stop(signal.SIGKILL)
    d2 = start_daemon(cfg)
    got: dict[str, Any] = {}
    try:
        wait_until(lambda: listed_by(d2, http_port, got), 120, "the restarted daemon's /clips")
        # nothing lost: every clip of the first run reaches nginx whole (those the kill left queued, queued again)
        wait_until(lambda: all(landed(dav, "door", c) for c in by_verb.values()), 60, "every clip on nginx")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d2.output()[-4000:]}") from None
    after = got["clips"]
    assert clip["id"] in {c["id"] for c in after} and set(by_verb) <= {c["id"] for c in after}
    store = tmp_path / "state" / "clips" / "door"
    assert not list(store.glob("*.part")), "a .part left by the SIGKILL is removed at the start"
    for c in after:  # every clip listed is whole: its file is its sidecar's bytes and hash
        data = (store / f"{c['id']}.mp4").read_bytes()
        assert len(data) == c["bytes"] and hashlib.sha256(data).hexdigest() == c["sha256"]
    assert d2.stop() == 0


@pytest.mark.slow
def test_a_flood_of_events_on_a_looping_camera_keeps_the_store_within_its_bound(
    broker: Any, subscribe: Any, demo: DemoAssets, tmp_path: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    """The long variant of test_clips.py's flood: a real daemon on the demo video looping (faces come and go
    every few seconds), encoded for the ring (the encoder path), short clips and a store of 0.6 MB: clips are
    written and removed for the bound, which telemetry and the files on disk hold to."""
    bound_mb = 0.6
    cam = {
        "name": "lobby",
        "uri": f"file://{demo.video}",
        "loop": True,
        "realtime": True,
        "record": {"pre_s": 0.5, "post_s": 0.5, "max_clip_s": 3, "bitrate_kbps": 500},
        "detection": {"tracking": {"min_hits": 3, "max_age": 5}, "publish": "events"},
    }
    doc = base_config(broker, demo, tmp_path, [cam], clips={"max_mb": bound_mb})
    sub = subscribe(broker, "edged/#")
    d = start_daemon(write_config(tmp_path / "flood.yaml", doc), "--duration", "45")
    assert d.proc.wait(240) == 0, d.output()[-4000:]
    sub.wait_stopped()  # the last telemetry and clip_ready events were sent before it
    tel = [m.json()["clips"] for m in sub.on("telemetry") if "clips" in m.json()]
    ready = [m.json() for m in sub.on("events") if m.json()["type"] == "clip_ready"]
    assert tel and all(t["bytes"] <= bound_mb * 2**20 for t in tel)
    last = tel[-1]
    assert len(ready) >= 6 and last["removed_bytes"] >= 3, (len(ready), last)
    assert last["written_bytes"] > 2 * bound_mb * 2**20
    on_disk = sum(p.stat().st_size for p in (tmp_path / "state" / "clips" / "lobby").iterdir())
    assert on_disk <= bound_mb * 2**20 and not list((tmp_path / "state" / "clips" / "lobby").glob("*.part"))


def kill_mid_write(d: DaemonProc, store: Path, within_s: float) -> tuple[str, int, set[str], int]:
    """SIGKILL the daemon while it writes a clip. The moment a ``.part`` with bytes shows in `store` the daemon
    is stopped (SIGSTOP: every thread frozen where it is); if the ``.part`` is still there it is mid-write, and the
    complete clips (MP4 and sidecar) are noted before the SIGKILL. If the write finished between the look and the
    stop, SIGCONT and wait for the next clip. Returns (the .part's name, its bytes, the complete clips, the
    stops)."""
    end = time.monotonic() + within_s
    stops = 0
    while time.monotonic() < end:
        assert d.proc.poll() is None, "the daemon exited"
        try:  # a .part with bytes in it: the muxer has begun writing the MP4
            parts = [e.name for e in os.scandir(store) if e.name.endswith(".mp4.part") and e.stat().st_size > 0]
        except FileNotFoundError:
            parts = []
        if not parts:
            time.sleep(0.0005)  # a clip's write lasts tens of ms: looked at every half millisecond
            continue
        os.kill(d.proc.pid, signal.SIGSTOP)
        stops += 1
        left = [p for p in parts if (store / p).exists()]
        if left:
            size = (store / left[0]).stat().st_size
            complete = {p.stem for p in store.glob("*.json") if (store / f"{p.stem}.mp4").exists()}
            d.proc.kill()
            d.proc.wait(10)
            return left[0], size, complete, stops
        os.kill(d.proc.pid, signal.SIGCONT)
    raise AssertionError(f"no clip was caught mid-write within {within_s:.0f} s ({stops} stops)")


@pytest.mark.slow
def test_a_sigkill_while_a_clip_is_written_lists_only_whole_clips_and_loses_no_upload(
    broker: Any,
    subscribe: Any,
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProc],
    dav_down: DavServer,
) -> None:
    """The must-show "a SIGKILL while a clip is written leaves no corrupt clip listed; a restart lists the clips
    that were complete", on a real daemon killed with a ``.part`` on disk (the RTSP test above kills at whatever
    moment it reaches; test_clips.py forces the timing on the writer alone). The demo video loops (a clip every
    few seconds, the encoder path) and nginx is down all the first run, so every clip is waiting for its upload
    when the kill comes. The restart removes the ``.part`` (counted), lists every clip that was complete, each
    whole (sha256 = its sidecar, the discoverer reads it), and with nginx up every clip of the first run lands
    byte for byte: the kill lost neither a clip nor its upload."""
    dav = dav_down  # down for the first run
    port = free_port()
    cam = {
        "name": "lobby",
        "uri": f"file://{demo.video}",
        "loop": True,
        "realtime": True,
        # short clips (written often) of a high bitrate (a longer write: ~1.5 MB, tens of ms)
        "record": {"pre_s": 0.5, "post_s": 0.5, "max_clip_s": 3, "bitrate_kbps": 4000},
        "detection": {"tracking": {"min_hits": 3, "max_age": 5}, "publish": "events"},
    }
    upload = {"url": f"{dav.url}/dav/dev", "retry_min_s": 0.2, "retry_max_s": 1.0, "timeout_s": 10}
    doc = base_config(broker, demo, tmp_path, [cam], clips={"max_mb": 256, "upload": True}, upload=upload,
                      health={"enabled": True, "port": port})  # fmt: skip
    cfg = write_config(tmp_path / "kill.yaml", doc)
    store = tmp_path / "state" / "clips" / "lobby"
    sub = subscribe(broker, "edged/#")
    d = start_daemon(cfg)
    try:
        wait_until(lambda: d.proc.poll() is not None or sum(
            m.json()["type"] == "clip_ready" for m in sub.on("events")) >= 2, 120, "two clip_ready")  # fmt: skip
        part, part_bytes, complete, stops = kill_mid_write(d, store, 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d.output()[-4000:]}") from None
    ready = {m.json()["clip"]["id"]: m.json()["clip"] for m in sub.on("events") if m.json()["type"] == "clip_ready"}
    assert len(ready) >= 2 and set(ready) <= complete, "a clip announced before the kill was not complete on disk"
    assert (store / part).exists(), "the kill left its .part"
    print(f"killed mid-write of {part} ({part_bytes} bytes, after {stops} stop(s)); {len(complete)} complete")
    seen_before = len(sub.messages)
    dav.start()
    d2 = start_daemon(cfg)
    got: dict[str, Any] = {}
    try:
        wait_until(lambda: listed_by(d2, port, got), 120, "the restarted daemon's /clips")
        # nothing lost: every clip complete at the kill reaches nginx, whole (queued again at the start)
        wait_until(lambda: all(landed(dav, "lobby", c, "dev") for c in ready.values()), 90, "the clips on nginx")
        # and the restarted daemon knows it: each of those clips' sidecar says uploaded, so it is pending no more
        # and its age bound applies again (the start queues them again to hear the uploader's verdict)
        wait_until(
            lambda: listed_by(d2, port, got) and all(c["uploaded"] for c in got["clips"] if c["id"] in ready),
            60,
            "/clips saying every clip complete at the kill uploaded",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d2.output()[-4000:]}") from None
    after = {c["id"]: c for c in got["clips"]}
    assert not (store / part).exists(), "the .part the kill left is removed at the start"
    assert complete <= set(after), f"complete at the kill, not listed after: {complete - set(after)}"
    assert part.removesuffix(".mp4.part") not in after
    for c in after.values():  # every clip listed is whole: its bytes hash to its sidecar's, a valid MP4
        mp4 = store / f"{c['id']}.mp4"
        data = mp4.read_bytes()
        assert len(data) == c["bytes"] and hashlib.sha256(data).hexdigest() == c["sha256"], c["id"]
        assert discover(mp4) == pytest.approx(c["duration_s"], abs=0.3), c["id"]
    wait_until(lambda: any(m.json().get("clips", {}).get("partial_removed", 0) >= 1
                           for m in sub.messages[seen_before:] if m.topic.endswith("/telemetry")),
               30, "telemetry counting the removed .part")  # fmt: skip
    assert d2.stop() == 0
