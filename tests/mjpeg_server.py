"""An MJPEG-over-HTTP camera for tests (what many IP cameras serve): multipart JPEG frames.

    python mjpeg_server.py PORT [--fps N] [--hang-after K] [--still VIDEO:N] [--switch-after K --pad-to WxH]
                                [--big JPEG --big-every K]

--hang-after K stops sending after K frames but keeps the connection open (a stalled camera).
--still VIDEO:N serves frame N of VIDEO (e.g. the demo video, whose faces are at known places) again
and again instead of a numbered test card. --switch-after K --pad-to WxH changes the resolution
mid-stream, as a camera reconfigured from its web page does: from the K-th frame of each connection
on, every frame is the original one centred on a WxH canvas (so a face moves by the known offset
((W - w) // 2, (H - h) // 2) and keeps its size). --no-length leaves out each part's Content-Length
(the part then ends at the next boundary, which some cameras rely on). --auth USER:PASS answers 401
(Basic) to a request without those credentials. --big JPEG --big-every K sends the file JPEG (its bytes as
they are: a huge frame of few bytes) as every K-th frame of each connection, between the usual ones.
"""

from __future__ import annotations

import argparse
import base64
import socketserver
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import cv2
import numpy as np


def encode(img: np.ndarray) -> bytes:
    ok, jpg = cv2.imencode(".jpg", img)
    if not ok:
        raise RuntimeError("jpeg encode failed")
    return jpg.tobytes()


def card(n: int) -> np.ndarray:
    img = np.zeros((240, 320, 3), np.uint8)
    img[:] = (40, 80 + n % 100, 120)
    cv2.putText(img, str(n), (20, 120), cv2.FONT_HERSHEY_SIMPLEX, 2, (255, 255, 255), 3)
    return img


def still(spec: str) -> np.ndarray:
    path, _, index = spec.rpartition(":")
    cap = cv2.VideoCapture(path)
    cap.set(cv2.CAP_PROP_POS_FRAMES, int(index))
    ok, img = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"cannot read frame {index} of {path}")
    return np.ascontiguousarray(img)


def padded(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    w, h = size
    canvas = np.full((h, w, 3), 90, np.uint8)
    y, x = (h - img.shape[0]) // 2, (w - img.shape[1]) // 2
    canvas[y : y + img.shape[0], x : x + img.shape[1]] = img
    return canvas


class Handler(BaseHTTPRequestHandler):
    fps = 15.0
    hang_after = 0
    image: np.ndarray | None = None
    switch_after = 0
    pad_to: tuple[int, int] | None = None
    with_length = True
    auth: str | None = None  # "Basic <base64 of user:pass>" that a request must carry
    big: bytes | None = None  # a JPEG sent as every `big_every`-th frame
    big_every = 0

    def frame(self, n: int) -> bytes:
        if self.big is not None and self.big_every and n % self.big_every == self.big_every - 1:
            return self.big
        img = card(n) if self.image is None else self.image
        if self.pad_to is not None and n >= self.switch_after:
            img = padded(img, self.pad_to)
        return encode(img)

    def do_GET(self) -> None:
        if self.auth is not None and self.headers.get("Authorization") != self.auth:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="camera"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        n = 0
        try:
            while True:
                if self.hang_after and n >= self.hang_after:
                    time.sleep(3600)
                data = self.frame(n)
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n")
                length = f"Content-Length: {len(data)}\r\n" if self.with_length else ""
                self.wfile.write(f"{length}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                n += 1
                time.sleep(1.0 / self.fps)
        except (BrokenPipeError, ConnectionResetError):
            return

    def log_message(self, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--fps", type=float, default=15.0)
    ap.add_argument("--hang-after", type=int, default=0)
    ap.add_argument("--still", help="VIDEO:N: serve frame N of VIDEO")
    ap.add_argument("--switch-after", type=int, default=0)
    ap.add_argument("--pad-to", help="WxH: from --switch-after on, frames centred on a canvas this size")
    ap.add_argument("--no-length", action="store_true")
    ap.add_argument("--auth", help="USER:PASS: answer 401 without these Basic credentials")
    ap.add_argument("--big", help="a JPEG file to send as every --big-every-th frame")
    ap.add_argument("--big-every", type=int, default=0)
    a = ap.parse_args()
    Handler.fps, Handler.hang_after = a.fps, a.hang_after
    Handler.image = still(a.still) if a.still else None
    Handler.switch_after = a.switch_after
    if a.pad_to:
        w, h = a.pad_to.lower().split("x")
        Handler.pad_to = (int(w), int(h))
    Handler.with_length = not a.no_length
    Handler.big = Path(a.big).read_bytes() if a.big else None
    Handler.big_every = a.big_every
    Handler.auth = "Basic " + base64.b64encode(a.auth.encode()).decode() if a.auth else None
    Server(("127.0.0.1", a.port), Handler).serve_forever()
