"""``edged watch``: subscribe to a device's topics and print what arrives, one line per message.

A consumer's view of the MQTT contract, for the demo and for debugging on a device. With
``--snapshot OUT.jpg`` it asks the device for a camera's last frame with its detections drawn (the
``snapshot`` command: the device publishes the JPEG on ``…/snapshot/<camera>`` and replies with its topic
and size) and writes the JPEG it gets; what the model sees, from any camera, an RTSP one too. Offline, with
``--video FILE`` as well, it draws the newest result that has detections onto the matching frame of FILE
instead (results of a ``file://`` camera name the frame's index in the file); nothing is asked of the device.

It needs only broker settings and a device id (``edged watch --host … --device …``, or ``-c`` with any
file that has an ``mqtt:`` section): no model or cameras, and OpenCV is loaded only to draw offline.
"""

from __future__ import annotations

import json
import queue
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
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
    if kind == topics.SHADOW:
        return shadow_line(doc)
    if kind == "status":
        refused = "".join(
            f"  REFUSED {r.get('topic')} ({r.get('reason')})" for r in doc.get("refused_subscriptions") or []
        )
        return f"status  {doc.get('state')}  model={doc.get('model')}  boot_id={str(doc.get('boot_id'))[:8]}{refused}"
    return f"{topic}  {json.dumps(doc)[:200]}"


def shadow_line(doc: dict[str, Any]) -> str:
    """A shadow report (``edged.shadow/1``): the candidate against the serving version, its totals, each camera."""
    from edged.deploy.promote import ShadowView, figures_text  # no device runtime: protocol and words only

    view = ShadowView()
    view.take_report(doc)
    cand, serving = doc.get("candidate") or {}, doc.get("serving") or {}
    ref = f"{cand.get('name')}@{cand.get('version')} vs {serving.get('name')}@{serving.get('version')}"
    cams = "; ".join(f"{cam}: {figures_text(figs)}" for cam, figs in sorted(view.per_camera.items()))
    return f"shadow  {ref}  {view.line()}" + (f"  [{cams}]" if cams else "")


SNAPSHOT_WAIT_S = 30.0  # how long --snapshot keeps asking (a camera without a frame yet, the rate limit)
ASK_AGAIN_S = 2.5  # after `no_frame` or `rate_limited` (the device allows one snapshot per camera every 2 s)


@dataclass
class SnapshotAsk:
    """``--snapshot`` from the device: the command sent, its reply awaited, then the JPEG on the topic the
    reply names. `camera`: the one asked for (None: the first the device reports, from its telemetry or a
    result). `done`: the JPEG was written or the device refused for good; `note`: what to print."""

    out_path: Path
    root: str
    camera: str | None
    reply_topic: str
    deadline: float
    correlation: bytes = b""
    ask_at: float = 0.0
    jpeg_topic: str | None = None
    done: bool = False
    ok: bool = False
    notes: list[str] = field(default_factory=list)
    jpegs: dict[str, bytes] = field(default_factory=dict)  # JPEGs that came before the reply naming their topic

    def learn(self, topic: str, doc: dict[str, Any] | None) -> None:
        """A camera name from the device's telemetry or a result, when none was given."""
        if self.camera is not None or doc is None:
            return
        if topic.endswith("/telemetry") and doc.get("cameras"):
            self.camera = sorted(doc["cameras"])[0]
        elif "/results/" in topic and doc.get("camera"):
            self.camera = str(doc["camera"])

    def tick(self, client: mqtt.Client, now: float) -> None:
        if self.done:
            return
        if now > self.deadline:
            self._end(False, f"snapshot: no snapshot in {SNAPSHOT_WAIT_S:g} s" + "".join(f"; {n}" for n in self.notes))
            return
        if self.camera is None or self.correlation or now < self.ask_at:
            return
        self.correlation = uuid.uuid4().hex.encode()
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = self.correlation
        props.MessageExpiryInterval = 10
        payload = json.dumps({"camera": self.camera}).encode()
        client.publish(topics.command(self.root, "snapshot"), payload, qos=1, properties=props)

    def on_message(self, topic: str, payload: bytes, correlation: bytes, now: float) -> bool:
        """Whether the message was ours (a reply or the JPEG): not printed as a line of its own."""
        if self.done:
            return topic == self.reply_topic
        if topic == self.reply_topic:
            if correlation != self.correlation:
                return True  # a redelivered reply to an earlier ask
            self.correlation = b""
            doc = json.loads(payload)
            if doc.get("ok"):
                self.jpeg_topic = doc["result"]["topic"]
                early = self.jpegs.get(self.jpeg_topic)  # QoS 0 JPEG and QoS 1 reply: either may come first
                if early is not None:
                    self._write(early)
                return True
            err = doc.get("error") or {}
            code, message = err.get("code"), err.get("message")
            if code in ("no_frame", "rate_limited"):  # not yet: ask again
                self.ask_at = now + ASK_AGAIN_S
                self.notes[-1:] = [f"{code}: {message}"]
            else:
                self._end(False, f"snapshot: the device refused: {code}: {message}")
            return True
        if self.jpeg_topic is not None and topic == self.jpeg_topic:
            self._write(payload)
            return True
        if self.correlation and topic.startswith(f"{self.root}/snapshot/"):  # asked, not yet answered
            self.jpegs[topic] = payload
            return True
        return False

    def _write(self, jpeg: bytes) -> None:
        self.out_path.write_bytes(jpeg)
        self._end(True, f"snapshot: {self.out_path} ({len(jpeg)} bytes from the device, camera {self.camera})")

    def _end(self, ok: bool, line: str) -> None:
        self.done, self.ok = True, ok
        self.notes = [line]


def watch(
    cfg: MqttSettings,
    device_id: str,
    duration_s: float | None,
    count: int | None,
    snapshot: Path | None,
    video: Path | None,
    out: TextIO = sys.stdout,
    only_detections: bool = False,
    camera: str | None = None,
) -> int:
    """Print messages until `duration_s` passes or `count` results arrived; return results seen.

    `snapshot` without `video`: ask the device for one (`camera`, else the first it reports) and write it;
    without `duration_s` and `count`, stop once it is written. With `video`: draw the newest result with
    detections onto its frame of `video` at the end (offline; nothing asked). A snapshot that did not come
    raises PublishError once the watch ends."""
    inbox: queue.Queue[tuple[str, bytes, bytes]] = queue.Queue()
    client = make_client(cfg, f"edged-watch-{int(time.time() * 1000) % 10**9}")
    root = topics.device_root(cfg.topic_prefix, device_id)
    ask = None
    if snapshot is not None and video is None:
        reply = f"{root}/reply/watch-{uuid.uuid4().hex[:12]}"
        ask = SnapshotAsk(snapshot, root, camera, reply, time.monotonic() + SNAPSHOT_WAIT_S)
    subscribed = queue.Queue[bool]()

    def on_connect(c: mqtt.Client, u: Any, f: Any, rc: ReasonCode, p: Properties | None) -> None:
        if not rc.is_failure:
            c.subscribe(topics.everything(root), qos=1)

    client.on_connect = on_connect
    client.on_subscribe = lambda c, u, mid, codes, p: subscribed.put(True)
    client.on_message = lambda c, u, msg: inbox.put(
        (msg.topic, bytes(msg.payload), bytes(getattr(msg.properties, "CorrelationData", b"") or b""))
    )
    try:
        client.connect(cfg.host, cfg.port, keepalive=30)
    except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
        raise PublishError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {exc}") from exc
    client.loop_start()
    results = 0
    best: dict[str, Any] | None = None
    end = None if duration_s is None else time.monotonic() + duration_s
    until_snapshot = ask is not None and duration_s is None and count is None
    listening = False
    try:
        while (end is None or time.monotonic() < end) and (count is None or results < count):
            if not listening and not subscribed.empty():
                listening = True  # ask only once subscribed: the JPEG and the reply must reach us
            if ask is not None and listening:
                ask.tick(client, time.monotonic())
                if until_snapshot and ask.done:
                    break
            try:
                topic, payload, corr = inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if ask is not None and ask.on_message(topic, payload, corr, time.monotonic()):
                if ask.done:
                    print(ask.notes[-1], file=out, flush=True)
                continue
            try:
                doc = json.loads(payload)
            except ValueError:
                print(f"{topic}  <{len(payload)} bytes, not JSON>", file=out)
                continue
            if ask is not None and isinstance(doc, dict):
                ask.learn(topic, doc)
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
    if ask is not None and not ask.ok:
        why = ask.notes[-1] if ask.done else "snapshot: the watch ended before the snapshot came"
        if ask.camera is None:
            why += " (no camera named: --camera NAME, or wait for the device's telemetry)"
        raise PublishError(why)
    if snapshot is not None and video is not None:
        draw_offline(snapshot, video, best, out)
    return results


def draw_offline(snapshot: Path, video: Path, best: dict[str, Any] | None, out: TextIO) -> None:
    """The newest result with detections drawn onto its frame of `video` (a file:// camera's file)."""
    if best is None:
        print("snapshot: no result with detections to draw", file=out)
        return
    frame = read_frame(video, int(best["frame"]))
    if frame is None:
        print(f"snapshot: frame {best['frame']} not in {video}", file=out)
        return
    import cv2

    from edged.daemon.scene.draw import draw  # OpenCV drawing, only offline

    cv2.imwrite(str(snapshot), draw(frame, best["detections"]))
    print(
        f"snapshot: {snapshot} (camera {best['camera']}, frame {best['frame']}, {len(best['detections'])} detections)",
        file=out,
    )


def _camera(name: str, c: dict[str, Any]) -> str:
    refused = c.get("frames_refused")
    return f"{name} {c.get('state')} {c.get('fps')} fps" + (f" ({refused} too large)" if refused else "")
