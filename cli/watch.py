"""``edged watch``: subscribe to a device's topics and print what arrives, one line per message.

A consumer's view of the MQTT contract, for the demo and for debugging on a device. With
``--snapshot OUT.jpg --video FILE`` it also draws the newest result that has detections onto the
matching frame of FILE (results of a ``file://`` camera name the frame's index in the file).

It needs only broker settings and a device id (``edged watch --host … --device …``, or ``-c`` with any
file that has an ``mqtt:`` section): no model or cameras, and OpenCV is loaded only to draw a snapshot.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.errors import PublishError
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client

if TYPE_CHECKING:
    import numpy as np


def read_frame(video: Path, index: int) -> np.ndarray | None:
    import cv2  # only for --snapshot: a subscriber does not load OpenCV

    cap = cv2.VideoCapture(str(video))
    try:
        cap.set(cv2.CAP_PROP_POS_FRAMES, index)
        ok, frame = cap.read()
        return frame if ok else None
    finally:
        cap.release()


def line_for(topic: str, doc: dict[str, Any]) -> str:
    kind = topic.split("/")[2] if topic.count("/") >= 2 else topic
    if kind == "results":
        dets = doc.get("detections", [])
        lat = doc.get("latency_ms", {})
        boxes = " ".join(f"{d['label']}:{d['score']:.2f}@{[round(v) for v in d['box']]}" for d in dets[:4])
        return (
            f"result  {doc.get('camera'):<10} seq={doc.get('seq'):<6} frame={doc.get('frame'):<5} "
            f"{len(dets)} det  {lat.get('capture_to_result', 0):6.1f} ms  {boxes}"
        )
    if kind == "telemetry":
        inf = doc.get("inference", {})
        mem = doc.get("memory", {})
        cams = ", ".join(_camera(n, c) for n, c in doc.get("cameras", {}).items())
        return (
            f"telemetry  {inf.get('fps')} inferences/s  infer p50 {inf.get('infer_ms', {}).get('p50')} ms  "
            f"rss {mem.get('rss_mb')} MB (peak {mem.get('peak_rss_mb')})  [{cams}]"
        )
    if kind == "status":
        refused = "".join(
            f"  REFUSED {r.get('topic')} ({r.get('reason')})" for r in doc.get("refused_subscriptions") or []
        )
        return f"status  {doc.get('state')}  model={doc.get('model')}  boot_id={str(doc.get('boot_id'))[:8]}{refused}"
    return f"{topic}  {json.dumps(doc)[:200]}"


def watch(
    cfg: MqttSettings,
    device_id: str,
    duration_s: float | None,
    count: int | None,
    snapshot: Path | None,
    video: Path | None,
    out: TextIO = sys.stdout,
    only_detections: bool = False,
) -> int:
    """Print messages until `duration_s` passes or `count` results arrived; return results seen."""
    inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
    client = make_client(cfg, f"edged-watch-{int(time.time() * 1000) % 10**9}")
    root = topics.device_root(cfg.topic_prefix, device_id)

    def on_connect(c: mqtt.Client, u: Any, f: Any, rc: ReasonCode, p: Properties | None) -> None:
        if not rc.is_failure:
            c.subscribe(topics.everything(root), qos=1)

    client.on_connect = on_connect
    client.on_message = lambda c, u, msg: inbox.put((msg.topic, bytes(msg.payload)))
    try:
        client.connect(cfg.host, cfg.port, keepalive=30)
    except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
        raise PublishError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {exc}") from exc
    client.loop_start()
    results = 0
    best: dict[str, Any] | None = None
    end = None if duration_s is None else time.monotonic() + duration_s
    try:
        while (end is None or time.monotonic() < end) and (count is None or results < count):
            try:
                topic, payload = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                doc = json.loads(payload)
            except ValueError:
                print(f"{topic}  <{len(payload)} bytes, not JSON>", file=out)
                continue
            if "/results/" in topic:
                results += 1
                if doc.get("detections"):
                    best = doc
                elif only_detections:
                    continue
            print(line_for(topic, doc), file=out, flush=True)
    finally:
        client.disconnect()
        client.loop_stop()
    if snapshot is not None:
        if best is None or video is None:
            print(
                "snapshot: no result with detections to draw"
                if best is None
                else "snapshot: --video is needed to draw on",
                file=out,
            )
        else:
            frame = read_frame(video, int(best["frame"]))
            if frame is None:
                print(f"snapshot: frame {best['frame']} not in {video}", file=out)
            else:
                import cv2

                from edged.daemon.scene.draw import draw  # OpenCV drawing, only for --snapshot

                cv2.imwrite(str(snapshot), draw(frame, best["detections"]))
                print(
                    f"snapshot: {snapshot} (camera {best['camera']}, frame {best['frame']}, "
                    f"{len(best['detections'])} detections)",
                    file=out,
                )
    return results


def _camera(name: str, c: dict[str, Any]) -> str:
    refused = c.get("frames_refused")
    return f"{name} {c.get('state')} {c.get('fps')} fps" + (f" ({refused} too large)" if refused else "")
