"""Record what one version of edged puts on the wire (bench/wire_compare.py compares two recordings).

`record(python, work)` runs, for the interpreter `python` (whose ``python -m edged`` is the version):

- a real mosquitto on 127.0.0.1 (tests/conftest.py's Broker) and a subscriber on ``#`` (MQTT v5, QoS 2,
  retain-as-published, no-local): every message's topic, QoS, retain flag, payload bytes and properties;
- the daemon, ``python -m edged run -c CFG``, as its own process in its own folder (never the checkout:
  the checkout's ``edged/`` would shadow the interpreter's own), on a deterministic config: the demo
  BlazeFace on ONNX Runtime (one thread), one ``file://`` camera on the demo video with ``realtime: false``
  and ``loop: false`` (every one of its 300 frames is inferred once), zones, a mask, tracking, object events
  with snapshots, Home Assistant discovery, the health endpoint, telemetry only at the stop;
- once the file has ended (its last result is in), a fixed sequence of commands (COMMANDS), one at a time,
  each waiting for its reply; GET /healthz, /readyz and /metrics; then SIGTERM, and the wait for the
  daemon's exit and its last retained messages.

Commands are sent only after the file has ended: a pause while the file plays would let the camera read
frames that are never inferred, and a snapshot would draw whichever frame happened to be the last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.conftest import Broker, free_port  # noqa: E402  (the tests' mosquitto, as bench/soak_rig.py uses it)

DEVICE = "wire-01"
CAMERA = "lobby"
IDLE = "gate"  # the camera that never comes up
CLOSED_PORT = 9  # discard: nothing listens there, and the port is in the payloads (a free one would differ)
ROOT = f"edged/{DEVICE}"
REPLY_TO = f"{ROOT}/reply/wire"  # the response topic the commands name (the device may reply under its root)
DEMO = Path(os.environ.get("EDGED_DEMO_DIR", Path.home() / ".cache" / "edged" / "demo"))
VIDEO_FRAMES = 300  # the demo video: 20 s at 15 fps (demo.json)

# (verb, payload, whether to name a response topic): every verb of the command channel (daemon/control.py)
# and the channel's own refusals. reload reads the same file again (nothing changes); rollback, ota and
# cancel are refused on a daemon that runs model.package (no store), which is what they answer here; an
# OTA transfer itself is not exercised (it needs a signed package, a store and `edged push`).
COMMANDS: list[tuple[str, bytes, bool]] = [
    ("status", b"{}", True),
    ("status", b"{}", False),  # no response topic: the reply goes to …/cmd/status/reply
    ("snapshot", json.dumps({"camera": CAMERA}).encode(), True),
    ("snapshot", json.dumps({"camera": "nope"}).encode(), True),  # unknown_camera
    ("pause", b"{}", True),
    ("status", b"{}", True),
    ("resume", b"{}", True),
    ("reload", b"{}", True),
    ("rollback", b"{}", True),
    ("ota", b"{}", True),  # the offer's schema refuses it first
    ("cancel", b"{}", True),
    ("nope", b"{}", True),  # an unknown verb
    ("status", b"not json", True),  # the channel's strict parsing
    ("status", b'{"a": 1, "a": 2}', True),  # duplicate keys
    ("pause", b'{"extra": true}', True),  # a verb's schema: no extra keys
]
HTTP_PATHS = ("/healthz", "/readyz", "/metrics")


@dataclass
class Message:
    """One message as the subscriber got it. `props`: its MQTT v5 properties, JSON-able."""

    topic: str
    qos: int
    retain: bool
    payload: bytes
    props: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        try:
            d["payload"] = self.payload.decode("utf-8")
        except UnicodeDecodeError:
            d["payload"] = {"hex_prefix": self.payload[:64].hex(), "bytes": len(self.payload)}
        return d


@dataclass
class Recording:
    """What one version put on the wire, its HTTP answers, and how the run went."""

    python: str
    version: str
    messages: list[Message]
    http: dict[str, tuple[int, str]]
    exit_code: int
    seconds: float
    log_tail: str


def _props(p: Properties | None) -> dict[str, Any]:
    if p is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("UserProperty", "ResponseTopic", "CorrelationData", "ContentType", "PayloadFormatIndicator"):
        if hasattr(p, name):
            v = getattr(p, name)
            out[name] = v.hex() if isinstance(v, bytes) else [list(x) for x in v] if name == "UserProperty" else v
    if hasattr(p, "MessageExpiryInterval"):
        out["MessageExpiryInterval"] = p.MessageExpiryInterval
    return out


class Subscriber:
    """A paho client on ``#``: keeps every message, in arrival order."""

    def __init__(self, broker: Broker) -> None:
        self.messages: list[Message] = []
        self.cond = threading.Condition()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="wire-compare", protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        if not self.subscribed.wait(30):
            raise RuntimeError("the subscriber did not get its SUBACK in 30 s")

    def _on_connect(self, c: mqtt.Client, u: Any, f: Any, rc: Any, p: Any) -> None:
        c.subscribe("#", options=SubscribeOptions(qos=2, noLocal=True, retainAsPublished=True))

    def _on_message(self, c: mqtt.Client, u: Any, m: mqtt.MQTTMessage) -> None:
        msg = Message(m.topic, m.qos, bool(m.retain), bytes(m.payload), _props(getattr(m, "properties", None)))
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def wait_for(self, pred: Any, timeout_s: float, what: str) -> Message:
        """The first message (from the start) for which pred(msg) holds; waits up to `timeout_s`."""
        end = time.monotonic() + timeout_s
        seen = 0
        with self.cond:
            while True:
                for m in self.messages[seen:]:
                    if pred(m):
                        return m
                seen = len(self.messages)
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
                self.cond.wait(min(left, 0.5))

    def count(self) -> int:
        with self.cond:
            return len(self.messages)

    def send(self, verb: str, payload: bytes, corr: bytes | None) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if corr is not None:
            props.ResponseTopic = REPLY_TO
            props.CorrelationData = corr
        info = self.client.publish(f"{ROOT}/cmd/{verb}", payload, qos=1, properties=props)
        info.wait_for_publish(30)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def daemon_config(work: Path, broker: Broker, health_port: int) -> Path:
    doc: dict[str, Any] = {
        "device_id": DEVICE,
        "state_dir": str(work / "state"),
        "mqtt": {"host": broker.host, "port": broker.port},
        "model": {"package": str(DEMO / "packages" / "blazeface-back"), "onnxruntime": {"threads": 1}},
        "cameras": [
            {
                "name": CAMERA,
                "uri": f"file://{DEMO / 'video' / 'demo.mp4'}",
                "realtime": False,
                "loop": False,
                "detection": {
                    "publish": "both",
                    "zones": [
                        {"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]], "normalized": True},
                        {"name": "door", "points": [[400, 50], [960, 50], [960, 400], [400, 400]]},
                    ],
                    "masks": [{"name": "floor", "points": [[0, 500], [960, 500], [960, 540], [0, 540]]}],
                    "tracking": {"enabled": True, "min_hits": 2, "max_age": 5},
                },
            },
            # never up (a closed port), so never ended: the daemon stops when every camera has ended, and the
            # commands come after the file's end. An http:// camera is read by edged itself: no decoder.
            {"name": IDLE, "uri": f"http://127.0.0.1:{CLOSED_PORT}/video.mjpg", "reconnect_max_s": 60},
        ],
        "inference": {"max_wait_ms": 20},
        "detection": {"score_threshold": 0.6},
        "telemetry": {"interval_s": 3600},  # only the stop's document: a periodic one lands at random frames
        "homeassistant": {"enabled": True},
        "health": {"enabled": True, "port": health_port},
    }
    path = work / "edged.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _payload(m: Message) -> Any:
    try:
        return json.loads(m.payload)
    except ValueError:
        return None


def _http(port: int) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for path in HTTP_PATHS:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
                out[path] = (r.status, r.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            out[path] = (exc.code, exc.read().decode("utf-8", "replace"))
    return out


def version_of(python: str) -> str:
    """What `python` imports as edged: its version and where from (the checkout, a venv, a perturbed copy)."""
    r = subprocess.run([python, "-c", "import edged; print(edged.__version__, edged.__file__)"], **_quiet())
    out: str = r.stdout.strip() or r.stderr.strip()[-300:]
    return out


def _quiet() -> dict[str, Any]:
    """Run an interpreter outside the checkout, without $PYTHONPATH: it imports its own edged."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {"capture_output": True, "text": True, "timeout": 120, "cwd": "/", "env": env}


def record(python: str, work: Path, limit_s: float = 300.0, log: Any = print) -> Recording:
    """Run one version through the script of the module docstring; `work` (created) keeps its files."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    broker = Broker(work)
    broker.start()
    sub = Subscriber(broker)
    health_port = free_port()
    cfg = daemon_config(work, broker, health_port)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    logfile = work / "daemon.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "edged", "run", "-c", str(cfg)], stdout=out, stderr=subprocess.STDOUT, cwd=work, env=env
        )
    http: dict[str, tuple[int, str]] = {}
    try:
        last = f"{ROOT}/results/{CAMERA}"

        def file_done(m: Message) -> bool:
            doc = _payload(m)
            return m.topic == last and isinstance(doc, dict) and doc.get("frame") == VIDEO_FRAMES - 1

        _wait_alive(sub, proc, file_done, started + limit_s, "the video's last result")
        log(f"    file done after {time.monotonic() - started:.1f} s ({sub.count()} messages)")
        for n, (verb, payload, named) in enumerate(COMMANDS):
            corr = f"c{n:02d}".encode() if named else None
            sub.send(verb, payload, corr)
            want = REPLY_TO if named else f"{ROOT}/cmd/{verb}/reply"

            def is_reply(m: Message, want: str = want, corr: bytes | None = corr) -> bool:
                return m.topic == want and (corr is None or m.props.get("CorrelationData") == corr.hex())

            _wait_alive(sub, proc, is_reply, started + limit_s, f"the reply to {verb} {payload!r}")
        http = _http(health_port)
        proc.send_signal(signal.SIGTERM)
        proc.wait(max(10.0, started + limit_s - time.monotonic()))

        def stopped(m: Message) -> bool:
            doc = _payload(m)
            return m.topic == f"{ROOT}/status" and isinstance(doc, dict) and doc.get("state") != "online"

        sub.wait_for(stopped, 30, "the status after the stop")
        _settle(sub)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        sub.close()
        broker.stop()
    tail = logfile.read_text(errors="replace")[-3000:]
    seconds = round(time.monotonic() - started, 1)
    return Recording(python, version_of(python), list(sub.messages), http, proc.returncode, seconds, tail)


def _wait_alive(sub: Subscriber, proc: subprocess.Popen[bytes], pred: Any, deadline: float, what: str) -> None:
    """Wait for a message while the daemon runs: fails at once when it exits, and at `deadline`."""
    while True:
        try:
            sub.wait_for(pred, 1.0, what)
            return
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({proc.returncode}) while waiting for {what}") from None
            if time.monotonic() > deadline:
                raise


def _settle(sub: Subscriber) -> None:
    """The daemon has exited and its stopped status is in: the broker has sent everything the daemon published
    before it (one connection, in order). A round trip of our own confirms the subscriber has it all."""
    fence = f"{ROOT}/_wire/fence"
    sub.client.subscribe(fence, options=SubscribeOptions(qos=1, noLocal=False))
    sub.client.publish(fence, b"fence", qos=1).wait_for_publish(30)
    sub.wait_for(lambda m: m.topic == fence, 30, "our own fence message")
    with sub.cond:
        sub.messages = [m for m in sub.messages if m.topic != fence]
