"""Clips end to end: a real daemon (`edged run`) on a real RTSP camera (tests/rtsp_server.py, gst-rtsp-server,
sending the demo video as H.264 with a keyframe every second, no re-encode on the device) with the BlazeFace
demo model and ``record:`` on, through the site's broker as shipped (edged.conf and edged.acl, certificates
from `edged certs`: tests/test_site.py). A face appears: its events name a clip, ``clip_ready`` follows on
MQTT, the clip is fetched over the local HTTP server and is a valid MP4 (GStreamer's discoverer) whose span
covers pre_s + the event + post_s within one keyframe interval. Then a SIGKILL and a restart: the complete
clips are listed again, by the ``clips`` verb through `edged clips` with the backend's identity."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import signal
import subprocess
import sys
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


def test_an_event_clip_over_rtsp_mqtt_and_http_survives_a_sigkill_and_a_restart(
    shipped: SiteBroker,  # noqa: F811
    site: Path,  # noqa: F811
    connect: Callable[..., tuple[mqtt.Client, list[mqtt.MQTTMessage]]],  # noqa: F811
    demo: DemoAssets,
    tmp_path: Path,
    start_daemon: Callable[..., DaemonProc],
    rtsp: str,
) -> None:
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
    doc["clips"] = {"max_mb": 64}
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
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/clips?camera=door", timeout=30) as resp:
        listed = json.loads(resp.read())["clips"]
    assert clip["id"] in [c["id"] for c in listed]
    for c in listed:
        jsonschema.validate(c, schema(CLIP_SCHEMA))
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert "edged_clips_written_total" in metrics and "edged_clips_bytes " in metrics
    wait_until(
        lambda: any(json.loads(m.payload).get("clips", {}).get("written", 0) >= 1 for m in list(seen)
                    if m.topic == "edged/cam-01/telemetry"), 30, "telemetry counting the clip")  # fmt: skip
    tel = [json.loads(m.payload) for m in list(seen) if m.topic == "edged/cam-01/telemetry"]
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

    def listed_again() -> bool:
        assert d2.proc.poll() is None, "the restarted daemon exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/clips?limit=1000", timeout=5) as resp:
                got["clips"] = json.loads(resp.read())["clips"]
        except OSError:
            return False
        return True

    try:
        wait_until(listed_again, 120, "the restarted daemon's /clips")
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
    tel = [m.json()["clips"] for m in sub.on("telemetry") if "clips" in m.json()]
    ready = [m.json() for m in sub.on("events") if m.json()["type"] == "clip_ready"]
    assert tel and all(t["bytes"] <= bound_mb * 2**20 for t in tel)
    last = tel[-1]
    assert len(ready) >= 6 and last["removed_bytes"] >= 3, (len(ready), last)
    assert last["written_bytes"] > 2 * bound_mb * 2**20
    on_disk = sum(p.stat().st_size for p in (tmp_path / "state" / "clips" / "lobby").iterdir())
    assert on_disk <= bound_mb * 2**20 and not list((tmp_path / "state" / "clips" / "lobby").glob("*.part"))
