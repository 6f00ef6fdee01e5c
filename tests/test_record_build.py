"""The build steps app.py calls for uploads and evidence (delivery/upload.py `build_uploader`, record/build.py):
each part exists exactly when its config section asks for it, is built from that section's values, and the
``/clips`` token is checked at the start and read again per request (a rotated token is taken up). The parts
themselves run in tests/test_upload.py, tests/test_labelling*.py and tests/test_clips*.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from edged.daemon.config import Config
from edged.daemon.delivery.upload import build_uploader
from edged.daemon.liveview import read_token
from edged.daemon.record.build import build_labelling, clips_http
from edged.daemon.record.store import ClipStore
from edged.errors import ConfigError


def config(tmp_path: Path, **sections: Any) -> Config:
    cams = [
        {"name": "door", "uri": "file:///door.mp4", "detection": {"score_threshold": 0.4}},
        {"name": "yard", "uri": "file:///yard.mp4"},
    ]
    doc = {"device_id": "t-01", "state_dir": str(tmp_path / "state"), "model": {"package": str(tmp_path)}}
    return Config.model_validate(doc | {"cameras": cams, "detection": {"score_threshold": 0.7}} | sections)


def test_the_uploader_and_the_labelling_frames_follow_their_sections(tmp_path: Path) -> None:
    stop = threading.Event()
    bare = config(tmp_path)
    assert build_uploader(bare, stop) is None and build_labelling(bare, ["face"], None) is None
    cfg = config(
        tmp_path,
        upload={"url": "http://127.0.0.1:9/up/", "max_queue": 7},
        labelling={"enabled": True, "upload": True, "max_frames": 5},
    )
    uploader = build_uploader(cfg, stop)
    assert uploader is not None and uploader.cfg.max_queue == 7 and uploader.dir == cfg.state_dir / "uploads"
    frames = build_labelling(cfg, ["face"], uploader)
    assert frames is not None and frames.cfg.max_frames == 5 and frames.uploader is uploader
    assert frames.thresholds == {"door": 0.4, "yard": 0.7}  # a camera's own threshold, else the global one
    quiet = config(tmp_path, labelling={"enabled": True})  # labelling.upload off: nothing goes to the uploader
    off = build_labelling(quiet, ["face"], uploader)
    assert off is not None and off.uploader is None


def test_the_clips_token_is_checked_at_the_start_and_read_per_request(tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "clips", 1 << 20, 3600.0)
    assert clips_http(store, None, read_token).token is None  # no token file: loopback only
    tf = tmp_path / "token"
    tf.write_text("first-token-0123456789\n")
    paths = clips_http(store, tf, read_token)
    assert callable(paths.token) and paths.token() == "first-token-0123456789"
    tf.write_text("rotated-token-9876543210")
    assert paths.token() == "rotated-token-9876543210"
    tf.write_text("short")
    with pytest.raises(ConfigError, match=r"health\.token_file: .*at least 16 characters"):
        clips_http(store, tf, read_token)
