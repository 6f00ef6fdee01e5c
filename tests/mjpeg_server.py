"""An MJPEG-over-HTTP camera for tests (what many IP cameras serve): multipart JPEG frames.

    python mjpeg_server.py PORT [--fps N] [--hang-after K]

--hang-after K stops sending after K frames but keeps the connection open (a stalled camera).
"""

from __future__ import annotations

import argparse
import socketserver
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import cv2
import numpy as np


def frame(n: int) -> bytes:
    img = np.zeros((240, 320, 3), np.uint8)
    img[:] = (40, 80 + n % 100, 120)
    cv2.putText(img, str(n), (20, 120), cv2.FONT_HERSHEY_SIMPLEX, 2, (255, 255, 255), 3)
    ok, jpg = cv2.imencode(".jpg", img)
    if not ok:
        raise RuntimeError("jpeg encode failed")
    return jpg.tobytes()


class Handler(BaseHTTPRequestHandler):
    fps = 15.0
    hang_after = 0

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        n = 0
        try:
            while True:
                if self.hang_after and n >= self.hang_after:
                    time.sleep(3600)
                data = frame(n)
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n")
                self.wfile.write(f"Content-Length: {len(data)}\r\n\r\n".encode() + data + b"\r\n")
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
    a = ap.parse_args()
    Handler.fps, Handler.hang_after = a.fps, a.hang_after
    Server(("127.0.0.1", a.port), Handler).serve_forever()
