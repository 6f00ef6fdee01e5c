"""Clips uploaded (``clips.upload``): the planner hands each clip to the real uploader (daemon/delivery/upload.py),
which PUTs it to a real nginx with WebDAV (tests/nginx_dav.py); the sidecar records it. A server that is down
keeps the clip queued and the store keeps it past its age; a restart queues again what was not uploaded."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.capture.encoded import EncodedRing, Packet
from edged.daemon.capture.gstreamer import pipeline as gst
from edged.daemon.config.cameras import RecordConfig
from edged.daemon.config.upload import UploadConfig
from edged.daemon.delivery.upload import Uploader
from edged.daemon.record.mux import write_mp4
from edged.daemon.record.planner import ClipPlanner
from edged.daemon.record.store import ClipStore
from edged.protocol.schemas import iso
from tests.conftest import wait_until
from tests.nginx_dav import DavServer
from tests.test_clips import T0, encode

pytestmark = pytest.mark.skipif(not gst.available(), reason=f"GStreamer: {gst.why_unavailable()}")


@pytest.fixture(scope="module")
def packets() -> tuple[str, list[Packet]]:
    caps, units = encode(12)
    return caps, [Packet(T0 + pts / 1e9, pts, dur, key, data) for pts, dur, key, data in units]


class Site:
    """A ring full of packets, a store on the test's clock, an uploader to `url` and a planner over them."""

    def __init__(self, tmp: Path, packets: tuple[str, list[Packet]], url: str) -> None:
        caps, pk = packets
        self.ring = EncodedRing(64 << 20, 60.0)
        self.ring.new_segment(caps)
        for p in pk:
            self.ring.add(p)
        self.now = T0 + 12.0
        self.tmp = tmp
        self.url = url
        self.uploaders: list[Uploader] = []
        self.open()

    def open(self) -> None:
        """(Again, as a restart does:) the store recovered, a new uploader over the same state, a new planner."""
        self.store = ClipStore(self.tmp / "clips", 1 << 30, 60.0, clock=lambda: self.now)
        self.store.recover(uploads=True)  # as build_clips does with clips.upload on
        cfg = UploadConfig(url=self.url, retry_min_s=0.05, retry_max_s=0.3, timeout_s=5)
        self.uploader = Uploader(cfg, self.tmp / "state", threading.Event())
        self.uploaders.append(self.uploader)
        self.store.on_removed = self.uploader.forget
        self.ready: list[dict[str, Any]] = []
        rec = {"cam": RecordConfig(pre_s=1.0, post_s=1.0)}
        self.planner = ClipPlanner({"cam": self.ring}, rec, self.store, write_mp4, self.ready.append, 32 << 20,
                                   self.uploader, clock=lambda: self.now)  # fmt: skip

    def clip(self, track: int, first: float, last: float) -> str:
        for kind in ("object_appeared", "object_ended"):
            doc = {"type": kind, "camera": "cam", "track_id": track, "first_seen": iso(T0 + first),
                   "last_seen": iso(T0 + last)}  # fmt: skip
            self.planner.observe(doc)
        self.planner.tick()
        return str(self.ready[-1]["clip"]["id"])

    def sidecar(self, clip_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.tmp / "clips" / "cam" / f"{clip_id}.json").read_text())
        return doc

    def close(self) -> None:
        for u in self.uploaders:
            u.stop()


@pytest.fixture
def sites() -> Iterator[list[Site]]:
    made: list[Site] = []
    yield made
    for s in made:
        s.close()


def test_a_clip_is_put_to_the_server_and_its_sidecar_says_uploaded(
    tmp_path: Path, packets: Any, dav: DavServer, sites: list[Site]
) -> None:
    site = Site(tmp_path, packets, dav.url + "/dav/")
    sites.append(site)
    site.uploader.start()
    clip_id = site.clip(1, 3.0, 5.0)
    wait_until(lambda: site.sidecar(clip_id)["uploaded"], 30, "the clip's upload")
    put = dav.root / "dav" / "cam" / f"{clip_id}.mp4"
    side = site.sidecar(clip_id)
    assert hashlib.sha256(put.read_bytes()).hexdigest() == side["sha256"]
    assert site.store.summary()["uploaded"] == 1 and site.store.summary()["pending"] == 0


def test_a_server_down_keeps_the_clip_past_its_age_and_a_restart_queues_it_again(
    tmp_path: Path, packets: Any, dav: DavServer, sites: list[Site]
) -> None:
    dav.stop()
    site = Site(tmp_path, packets, dav.url + "/dav/")
    sites.append(site)
    site.uploader.start()
    clip_id = site.clip(1, 3.0, 5.0)
    old = site.clip(2, 8.0, 9.0)
    assert site.store.get(clip_id) is not None and site.store.get(clip_id).pending  # type: ignore[union-attr]
    site.now += 3600.0  # far past max_age (60 s): still waiting for the server, so still kept
    assert site.store.prune() == []
    assert {c.id for c in site.store.query()} == {clip_id, old}
    site.close()  # the daemon stops with both queued; the uploader's queue file keeps them
    site.open()  # a restart: the store lists both, the planner queues them again
    assert site.planner.resume_uploads() == 2
    assert site.store.prune() == []  # pending again: kept
    dav.start()
    site.uploader.start()
    wait_until(lambda: all(site.sidecar(i)["uploaded"] for i in (clip_id, old)), 60, "both uploads after the restart")
    for i in (clip_id, old):
        put = (dav.root / "dav" / "cam" / f"{i}.mp4").read_bytes()
        assert put == (tmp_path / "clips" / "cam" / f"{i}.mp4").read_bytes()
    assert sorted(site.store.prune()) == [f"removed clip {i} (older than max_age_h)" for i in sorted((clip_id, old))]


def test_a_clip_the_start_removes_leaves_the_upload_queue_too(
    tmp_path: Path, packets: Any, dav: DavServer, sites: list[Site]
) -> None:
    from dataclasses import dataclass

    from edged.daemon.config import load_config
    from edged.daemon.record.planner import build_clips
    from tests.conftest import write_config

    site = Site(tmp_path, packets, dav.url + "/dav/")  # the uploader never starts: the clip stays queued
    sites.append(site)
    clip_id = site.clip(1, 3.0, 5.0)
    assert site.uploader.stats()["queued"] == 1
    site.close()

    @dataclass
    class Cam:
        name: str
        ring: EncodedRing | None
        record_why: str = ""

    doc = {
        "device_id": "d",
        "state_dir": str(tmp_path / "state"),
        "model": {"package": "pkg"},
        "cameras": [{"name": "cam", "uri": "synthetic://", "record": {"pre_s": 1.0, "post_s": 1.0}}],
        "clips": {"dir": str(tmp_path / "clips"), "max_mb": 0.001, "upload": True},  # shrunk below the clip
        "upload": {"url": dav.url + "/dav/"},
    }
    cfg = load_config(write_config(tmp_path / "edged.yaml", doc))
    again = Uploader(cfg.upload, tmp_path / "state", threading.Event())  # type: ignore[arg-type]
    planner = build_clips(cfg, [Cam("cam", site.ring)], write_mp4, lambda _e: None, again)
    assert planner is not None and planner.store.get(clip_id) is None
    assert planner.store.stats.removed_bytes == 1
    s = again.stats()
    assert (s["queued"], s["dropped"]) == (0, 1)  # the clip's PUT is forgotten with its file
    assert json.loads((tmp_path / "state/uploads/queue.json").read_text())["queue"] == []


def test_a_clip_a_full_queue_refused_goes_once_there_is_room(
    tmp_path: Path, packets: Any, dav: DavServer, sites: list[Site]
) -> None:
    from edged.daemon.record.planner import HOUSEKEEP_S

    site = Site(tmp_path, packets, dav.url + "/dav/")
    sites.append(site)
    site.uploader.cfg = site.uploader.cfg.model_copy(update={"max_queue": 1})
    site.store.max_age_s = 1e6  # the age bound stays out of it
    first = site.clip(1, 1.0, 2.0)
    second = site.clip(2, 5.0, 6.0)  # the queue holds the first: refused
    assert site.planner.stats.upload_refused == 1 and not site.store.get(second).pending  # type: ignore[union-attr]
    site.uploader.start()
    wait_until(lambda: site.sidecar(first)["uploaded"], 30, "the first upload")
    site.planner.tick()
    assert not site.sidecar(second)["uploaded"]  # offered again only every HOUSEKEEP_S
    site.now += HOUSEKEEP_S
    site.planner.tick()
    wait_until(lambda: site.sidecar(second)["uploaded"], 30, "the refused clip's upload, offered again")
    put = dav.root / "dav" / "cam" / f"{second}.mp4"
    assert hashlib.sha256(put.read_bytes()).hexdigest() == site.sidecar(second)["sha256"]
