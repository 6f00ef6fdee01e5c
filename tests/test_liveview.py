"""The live view (issue 32 item 1) on a real daemon on the demo video: a real headless Chromium opens the page
and its screenshot shows the overlay's box colour on a ground-truth face and the zone's outline; the access
rule (loopback only without a token, the token and nothing else with one); nothing encoded while nobody
watches; the MJPEG stream's parts are JPEGs."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edged.daemon.scene.draw import BOX_BGR, ZONE_BGR
from edged.models.demo import DemoAssets

from .conftest import base_config, free_port, wait_until, write_config

TOKEN = "live-view-token-0123456789"
ZONE = [[0.05, 0.06], [0.95, 0.06], [0.95, 0.94], [0.05, 0.94]]  # normalised: a rectangle near the edges


def chromium() -> str | None:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return None


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except OSError:
        return 0, {}, b""


def state(port: int, **headers: str) -> dict[str, Any]:
    status, _, body = get(f"http://127.0.0.1:{port}/live/state", headers)
    return json.loads(body) if status == 200 else {}


def live_config(broker: Any, demo: DemoAssets, tmp: Path, health: dict[str, Any]) -> Path:
    cams = [
        {
            "name": "lobby",
            "uri": f"file://{demo.video}",
            "loop": True,
            "detection": {"zones": [{"name": "hall", "points": ZONE, "normalized": True}]},
        }
    ]
    return write_config(tmp / "edged.yaml", base_config(broker, demo, tmp, cams, health=health))


def colour_mask(img: np.ndarray, bgr: tuple[int, int, int], tol: int = 45) -> np.ndarray:
    hit: np.ndarray = np.all(np.abs(img.astype(np.int32) - np.array(bgr)) <= tol, axis=2)
    return hit


def outline_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """The bounding box of the long runs in `mask` (the zone's outline: rows and columns with many hits)."""
    rows = np.where(mask.sum(axis=1) > 0.5 * mask.shape[1] * 0.3)[0]
    cols = np.where(mask.sum(axis=0) > 0.5 * mask.shape[0] * 0.3)[0]
    assert len(rows) and len(cols), "no zone outline in the screenshot"
    return int(cols.min()), int(rows.min()), int(cols.max()), int(rows.max())


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium-headless-shell)")
def test_a_browser_sees_boxes_on_faces_and_the_zone(broker, start_daemon, demo: DemoAssets, tmp_path: Path) -> None:
    port = free_port()
    token_file = tmp_path / "live_token"
    token_file.write_text(TOKEN + "\n")
    health = {"enabled": True, "port": port, "live_view": True, "token_file": str(token_file), "live_max_fps": 5}
    d = start_daemon(live_config(broker, demo, tmp_path, health))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    truth = {f["frame"]: f["faces"] for f in json.loads(demo.ground_truth.read_text())["frames"]}
    try:
        wait_until(lambda: d.proc.poll() is not None or state(port, **auth).get("fps", 0) > 0, 90, "serving")
        assert d.proc.poll() is None, d.output()[-3000:]
        assert state(port, **auth)["encoded"] == 0, "a view was encoded while nobody watched"
        shot = tmp_path / "shot.png"
        url = f"http://127.0.0.1:{port}/live?token={TOKEN}&still=1"
        for _ in range(20):
            shot.unlink(missing_ok=True)
            subprocess.run(
                [chromium() or "", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--window-size=1000,760", f"--screenshot={shot}", url],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            served = state(port, **auth)["cameras"]["lobby"]["served"]
            faces = truth.get(served["frame"], [])
            if faces and served["detections"] >= len(faces):
                break
        else:
            pytest.fail("no screenshot of a frame with faces and detections in 20 tries")
        img = cv2.imread(str(shot))
        assert img is not None, "chromium wrote no screenshot"
        # where the frame lies in the page: the zone's outline, drawn at known fractions of the frame
        x1, y1, x2, y2 = outline_box(colour_mask(img, ZONE_BGR))
        w_frame, h_frame = 960, 540  # the demo video's size (models/demo/video.py); the view's max width is 960
        sx = (x2 - x1) / ((ZONE[1][0] - ZONE[0][0]) * w_frame)
        sy = (y2 - y1) / ((ZONE[2][1] - ZONE[0][1]) * h_frame)
        assert abs(sx - 1.0) < 0.05 and abs(sy - 1.0) < 0.05, (sx, sy)  # shown at its size: the outline fits
        ox, oy = x1 - ZONE[0][0] * w_frame * sx, y1 - ZONE[0][1] * h_frame * sy
        green = colour_mask(img, BOX_BGR)
        for fx1, fy1, fx2, fy2 in faces:
            # the drawn box lies on the face's edges: look inside the true box, widened by a few pixels
            m = 6
            bx1, by1 = round(ox + fx1 * sx) - m, round(oy + fy1 * sy) - m
            bx2, by2 = round(ox + fx2 * sx) + m, round(oy + fy2 * sy) + m
            inside = int(green[by1:by2, bx1:bx2].sum())
            perimeter = 2 * ((bx2 - bx1) + (by2 - by1))
            print(f"\nframe {served['frame']}: face {fx1:.0f},{fy1:.0f}-{fx2:.0f},{fy2:.0f}: {inside} box pixels")
            assert inside > 0.5 * perimeter, f"the box colour covers {inside} px in the true face box"
        # and not everywhere: a band of the frame away from the faces and labels holds no box colour
        assert green[round(oy + 0.97 * h_frame * sy) - 2 : round(oy + 0.97 * h_frame * sy) + 2].sum() < 20
        assert state(port, **auth)["encoded"] > 0
    finally:
        assert d.stop() == 0, d.output()[-3000:]


def lan_address() -> str | None:
    """A non-loopback address of this machine, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is chosen
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_the_live_view_answers_loopback_without_a_token_and_only_the_token_with_one(
    broker, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    port = free_port()
    health = {"enabled": True, "host": "0.0.0.0", "port": port, "live_view": True, "live_max_fps": 5}
    d = start_daemon(live_config(broker, demo, tmp_path, health))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: d.proc.poll() is not None or state(port).get("fps", 0) > 0, 90, "serving")
        assert d.proc.poll() is None, d.output()[-3000:]
        status, headers, page = get(f"{base}/live")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"/live/frame?camera=lobby" in page and b"http" not in page.lower().replace(b"http-equiv", b"")
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        doc = state(port)
        assert doc["model"]["name"] and doc["version"] and "fps" in doc["status_line"]
        lan = lan_address()
        if lan is not None:  # the same server from another address: refused without a token
            status, _, body = get(f"http://{lan}:{port}/live")
            assert status == 403 and b"loopback" in body
            assert get(f"http://{lan}:{port}/healthz")[0] == 200  # the probes keep their rule
        # the MJPEG stream: a multipart answer whose first part is a JPEG of the view's size
        with urllib.request.urlopen(f"{base}/live/stream?camera=lobby", timeout=10) as r:
            assert r.headers["Content-Type"] == "multipart/x-mixed-replace; boundary=edgedframe"
            head = r.readline() + r.readline() + r.readline() + r.readline()
            assert head.startswith(b"--edgedframe\r\nContent-Type: image/jpeg\r\n"), head
            n = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            jpg = cv2.imdecode(np.frombuffer(r.read(n), np.uint8), cv2.IMREAD_COLOR)
            assert jpg is not None and jpg.shape[:2] == (540, 960)
        assert get(f"{base}/live/frame?camera=nope")[0] == 404
    finally:
        assert d.stop() == 0, d.output()[-3000:]
    if lan is None:
        print("\nno non-loopback address here: the refusal of other addresses was not tried")

    # with a token: only with it, from anywhere (loopback too); the page's ?token= sets the cookie
    token_file = tmp_path / "live_token"
    token_file.write_text(TOKEN)
    port = free_port()
    health = {"enabled": True, "port": port, "live_view": True, "token_file": str(token_file)}
    d = start_daemon(live_config(broker, demo, tmp_path, health))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(f"{base}/healthz")[0] == 200, 90, "the health server")
        assert get(f"{base}/live")[0] == 403
        assert get(f"{base}/live?token=wrong-{TOKEN}")[0] == 403
        assert get(f"{base}/live/state", {"Cookie": "edged_live=nope"})[0] == 403
        status, headers, _ = get(f"{base}/live?token={TOKEN}")
        assert status == 200 and headers["Set-Cookie"].startswith(f"edged_live={TOKEN};")
        assert "HttpOnly" in headers["Set-Cookie"]
        assert get(f"{base}/live/state", {"Cookie": f"edged_live={TOKEN}"})[0] == 200
        assert get(f"{base}/metrics")[0] == 200  # the probes keep their rule
    finally:
        assert d.stop() == 0, d.output()[-3000:]
