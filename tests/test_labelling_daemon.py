"""The frames worth labelling in a real daemon (`edged run`) on the demo video with the BlazeFace demo model: with
``labelling.near_threshold`` it keeps frames whose faces score near the threshold, serves the index, the COCO file
and each JPEG on the health endpoint (loopback), counts them on /metrics, and PUTs them to a real nginx (WebDAV)
through the uploader; nginx down while the daemon stops, the next start resumes the queue and every file arrives."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np

from edged.models.demo import DemoAssets
from edged.protocol.schemas import TELEMETRY_SCHEMA, schema
from tests.conftest import base_config, free_port, wait_until, write_config
from tests.nginx_dav import DavServer
from tests.test_health import get, metrics
from tests.test_labelling import check_coco, check_the_videos_frame

TOKEN = "labelling-token-0123456789"


def fetch(port: int, path: str, token: str | None = TOKEN) -> tuple[int, str, bytes]:
    """GET with the token as a bearer header (None: without)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()
    except OSError:
        return 0, "", b""


def index(port: int) -> dict[str, Any]:
    status, _, body = fetch(port, "/labelling")
    return json.loads(body) if status == 200 else {"frames": []}


def test_a_daemon_keeps_serves_and_uploads_near_threshold_frames_across_restarts(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    dav = DavServer(tmp_path)
    dav.start()
    port = free_port()
    token = tmp_path / "health-token"
    token.write_text(TOKEN + "\n")
    cams = [{"name": "door", "uri": f"file://{demo.video}", "loop": True, "realtime": True}]
    cfg = base_config(
        broker,
        demo,
        tmp_path,
        cams,
        health={"enabled": True, "port": port, "token_file": str(token)},
        labelling={"enabled": True, "near_threshold": 0.3, "sample_s": 0.3, "max_frames": 50, "upload": True},
        upload={"url": dav.url + "/dav/dev1", "retry_min_s": 0.1, "retry_max_s": 1.0, "timeout_s": 10},
    )
    config = write_config(tmp_path / "edged.yaml", cfg)
    state = tmp_path / "state"
    sub = subscribe(broker, "edged/+/telemetry")
    try:
        d = start_daemon(config)
        wait_until(lambda: len(index(port)["frames"]) >= 3, 120, "three frames kept for labelling")
        # the token's rule (as /live's): with health.token_file even a loopback client needs it
        assert fetch(port, "/labelling", token=None)[0] == 403
        assert fetch(port, "/labelling/coco.json", token="wrong-token-0123456789")[0] == 403
        assert get(port, f"/labelling/coco.json?token={TOKEN}")[0] == 200
        status, ctype, body = fetch(port, "/labelling/coco.json")
        assert (status, ctype) == (200, "application/json")
        coco = json.loads(body)
        check_coco(coco)
        assert {c["name"] for c in coco["categories"]} >= {"face"}
        for image in coco["images"][:3]:
            status, ctype, jpg = fetch(port, f"/labelling/{image['file_name']}")
            assert (status, ctype) == (200, "image/jpeg")
            img = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR)
            assert img is not None and img.shape[:2] == (image["height"], image["width"]) == (540, 960)
            anns = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
            assert anns and all(a["attributes"]["model"] == "serving" for a in anns)
            assert any(0.7 <= a["score"] < 1.0 for a in anns)  # near the threshold (0.7, band 0.3)
            assert image["edged"]["reason"] == "near_threshold"
            check_the_videos_frame(jpg, image, demo.video)  # the frame its boxes were found in
        assert fetch(port, "/labelling/../edged.yaml")[0] == 404
        assert fetch(port, "/labelling/%2e%2e/edged.yaml")[0] == 404
        assert fetch(port, "/labelling/000001-nothing.jpg")[0] == 404
        m = metrics(port)
        assert m[("edged_labelling_frames", ())] >= 3

        def telemetry() -> list[dict[str, Any]]:
            return [t.json() for t in sub.on("telemetry") if t.json().get("labelling", {}).get("frames", 0) >= 3]

        wait_until(lambda: bool(telemetry()), 30, "telemetry counting the kept frames")
        tel = telemetry()[-1]
        jsonschema.validate(tel, schema(TELEMETRY_SCHEMA))
        assert tel["labelling"]["kept"] >= 3 and "queued" in tel["uploads"]

        # the uploads land, byte for byte
        remote = dav.root / "dav/dev1/labelling"
        wait_until(lambda: metrics(port)[("edged_uploads_uploaded_total", ())] >= 4, 60, "uploads to nginx")
        up = [p for p in (remote / "images").iterdir()]
        assert up and all(
            (state / "labelling/images" / p.name).read_bytes() == p.read_bytes()
            for p in up
            if (state / "labelling/images" / p.name).exists()
        )

        # nginx goes down; the daemon keeps frames (and queues them), then stops with files waiting
        dav.stop()
        kept_before = set(os.listdir(state / "labelling/images"))
        wait_until(lambda: set(os.listdir(state / "labelling/images")) - kept_before != set(), 60, "a new frame")
        wait_until(lambda: metrics(port)[("edged_uploads_queued", ())] >= 1, 30, "an upload waiting")
        assert d.stop() == 0
        queue = json.loads((state / "uploads/queue.json").read_text())["queue"]
        assert queue, "the stop left no upload waiting"
        waiting = {e["remote"] for e in queue}

        # nginx back, the daemon started again: the queue resumes and every waiting file arrives
        dav.start()
        start_daemon(config)
        wait_until(lambda: all((dav.root / "dav/dev1" / r).exists() for r in waiting), 90, "the resumed uploads")
        for e in queue:
            local = Path(e["local"])
            if local.exists() and local.suffix == ".jpg":
                assert (dav.root / "dav/dev1" / e["remote"]).read_bytes() == local.read_bytes()
        check_coco(json.loads((remote / "coco.json").read_text()))
    finally:
        dav.stop()
