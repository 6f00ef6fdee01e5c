"""``edged push PKG --device ID …``: the operator's side of the over-the-air transfer (DESIGN §6).

It offers the signed manifest on each device's ``cmd/ota``, serves the chunks each device asks for on
``…/ota/req`` (from a verified local copy of the package), and follows ``…/ota/status`` and the
retained ``…/model/state`` until every device has an outcome. Nothing but the broker is involved.
Each device answers the offer on its own ``…/reply/_push/<transfer>`` (the offer's response topic), so
the ACL lets a device answer only for itself; devices that predate it accept that topic as well.

A device downloads one package at a time. When another pusher offers the same package while a
transfer runs, the device carries on with the bytes it has under the newer offer's transfer id (so a
push that was stopped can be resumed by a new one), publishes ``joined`` (``by`` the new id) on the old
id's ``…/ota/status`` and names the old id in its reply to the new offer (``joined``). The pusher whose
transfer was taken over follows the transfer named in ``by`` to its outcome (``via transfer …`` in its
report) instead of waiting its whole timeout for statuses of its own; a device too old to say
``joined`` is recognised by its live status naming another transfer of this very package. Should the
followed transfer go quiet while downloading (its pusher gone), the pusher offers again and so takes
the transfer back and serves it itself. Another package offered meanwhile is refused (``busy``).

A group (``--group G``) is the devices whose retained ``…/status`` lists G among its groups. Which
devices get the offer when (``--canary N``, ``--waves``), when the rest is abandoned (``--max-failures``),
what devices that were offline get (the group's retained offer) and how a stopped push resumes: a push
is a rollout, deploy/rollout/__init__.py (its pusher, `RolloutPusher` in deploy/rollout/pusher.py, extends this one).

``edged push --cancel --device ID`` (`edged.deploy.cancel`) stops the transfer a device runs (chunks or
HTTP(S)), which drops its files and publishes ``cancelled``; a push following it ends with that outcome.

With ``--mirror`` (`edged.deploy.mirror`) the offer names where the files are on a web server and the
devices download them from there over HTTP(S); the pusher then serves no bytes itself.

With ``--shadow`` (`edged.deploy.promote`) the offer asks each device to evaluate the candidate on its live
frames beside the serving version first: the pusher follows each device's ``…/shadow`` report (shown live),
and the device ends ``probation`` (promoted on the evidence) or ``rejected`` with the report's figures.

Exit status: 0 when every device succeeded, 1 when any did not (each is reported), 2 for usage, 3 when
the rollout aborted, 130 when stopped (resumable).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.errors import Code, PublishError
from edged.models.package import Manifest, open_package
from edged.models.store.files import read_head
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client, reconnect_backoff
from edged.protocol.ota import OfferArgs, OtaState, chunk, offer_args, offer_payload
from edged.protocol.shadow import ShadowAsk

from .progress import Progress as Progress  # what a push prints lives in deploy/progress.py; importable here as before
from .progress import report as report
from .promote import ShadowView

SHADOW_CODES = (Code.MODEL_REJECTED.value, Code.NO_EVIDENCE.value)  # a rejection on shadow evidence
MAX_CHUNK = 4 << 20  # the most a device may ask for at once
RECONNECT_MAX_S = 5.0  # the pusher's reconnect waits: full jitter up to this
TAKE_BACK_S = 10.0  # a followed transfer silent this long while downloading: offer again and serve it
DONE_OK = {OtaState.PROBATION: "swap", "committed": "commit", OtaState.UNCHANGED: "swap"}
SHADOW_SETTLE_S = 3.0  # a device rejected on shadow evidence: its final report may follow its status this long
DONE_BAD = ("rejected", "failed", "rolled_back", "timed_out", "skipped", "offline", "cancelled")

Wait = Literal["swap", "commit"]


@dataclass
class Device:
    id: str
    state: str = "offered"
    bytes: int = 0
    total: int = 0
    error: str = ""
    served: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    active: bool = False  # in the wave being pushed now
    offered_at: float | None = None  # when our offer went out (monotonic)
    via: str = ""  # another transfer of this same package that the device runs in place of ours
    took_over: str = ""  # the transfer the device was running when our offer joined it (its reply says)
    heard_at: float = field(default_factory=time.monotonic)  # the device's last status for our transfer
    shadow: ShadowView | None = None  # a --shadow push: the device's evaluation of the candidate as last heard

    def finish(self, state: str, error: str = "") -> None:
        if self.ended is None:
            self.state, self.error, self.ended = state, error, time.monotonic()

    def ok(self, wait: Wait) -> bool:
        return self.state == "committed" or self.state == "unchanged" or (wait == "swap" and self.state == "probation")


class Pusher:
    def __init__(
        self, mqtt_cfg: MqttSettings, package: Path, out: TextIO = sys.stderr, transfer: str | None = None
    ) -> None:
        self.prefix = mqtt_cfg.topic_prefix
        self.out = out
        self.manifest_bytes, self.sig_bytes = read_head(package)
        self._tmp = Path(tempfile.mkdtemp(prefix="edged-push-"))
        pkg = open_package(package, scratch=self._tmp)  # sizes and hashes: never serve a corrupt copy
        self.manifest: Manifest = pkg.manifest
        self.files = {name: pkg.root / name for name in pkg.manifest.files}
        self.total = sum(e.size for e in pkg.manifest.files.values())
        self.transfer = transfer or uuid.uuid4().hex[:16]  # a resumed rollout keeps its transfer id
        self._offers_until = 0.0  # monotonic: an offer must not outlive this pusher's wait for it
        self.replies = topics.push_replies(self.prefix, self.transfer)  # each device answers under its own root
        self.urls: dict[str, list[str]] | None = None  # --mirror: devices download the files from there
        self.shadow_ask: ShadowAsk | None = None  # --shadow: devices evaluate the candidate before it serves
        self.stage: str | None = None  # --stage: the package replaces that cascade stage's model (not the primary)
        self.verbose = False  # the live lines show each camera's shadow figures too
        self.offer = self._offer_payload()
        self.devices: dict[str, Device] = {}
        self._lock = threading.Lock()
        self._subs: list[str] = [self.replies]
        self._unacked: set[int] = set()  # SUBSCRIBE message ids the broker has not acknowledged yet
        self._early_acks: set[int] = set()  # SUBACKs that came before subscribe() returned their id
        self._topic_of: dict[int, str] = {}  # SUBSCRIBE message id -> its topic, to name a refusal
        self._refused: dict[int, str] = {}  # SUBSCRIBE message id -> the failure reason codes of its SUBACK
        self._statuses: dict[str, dict[str, Any]] = {}
        self._connected = threading.Event()
        self.client = make_client(mqtt_cfg, f"edged-push-{self.transfer}")
        self.client.max_queued_messages_set(0)
        # paho's own reconnect loop (loop_start) doubles a fixed delay; each wait is drawn here instead,
        # with full jitter up to RECONNECT_MAX_S, and the count starts again once connected
        self._reconnect = reconnect_backoff(RECONNECT_MAX_S)
        self._jitter_reconnect()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_connect_fail = lambda *a: self._jitter_reconnect()
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.host, self.port = mqtt_cfg.host, mqtt_cfg.port

    @property
    def ref(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}"

    def use_urls(self, urls: dict[str, list[str]]) -> None:
        """Offer the files at these URLs (``--mirror``): devices download them over HTTP(S), not from us."""
        self.urls = urls
        self.offer = self._offer_payload()

    def use_shadow(self, ask: ShadowAsk) -> None:
        """Offer the package for shadow evaluation (``--shadow``): each device runs it beside the serving
        version on live frames and promotes it only on the evidence `ask` names."""
        self.shadow_ask = ask
        self.offer = self._offer_payload()

    def use_stage(self, stage: str) -> None:
        """Offer the package as the cascade stage `stage`'s next version (``--stage``): the device swaps it in
        for that stage alone, judges it on its own probation and says the outcome on ``…/ota/status``."""
        self.stage = stage
        self.offer = self._offer_payload()

    def offer_args(self) -> OfferArgs:
        """This push's offer: the signed manifest, the mirror's URLs, the shadow ask, the stage."""
        return offer_args(self.transfer, self.manifest_bytes, self.sig_bytes, self.urls, self.shadow_ask, self.stage)

    def _offer_payload(self) -> bytes:
        return offer_payload(self.offer_args())

    # ---- connection ------------------------------------------------------------------------
    def connect(self, timeout_s: float = 15.0) -> None:
        try:
            self.client.connect(self.host, self.port, keepalive=30)
        except OSError as exc:
            raise PublishError(f"cannot reach the broker at {self.host}:{self.port}: {exc}") from exc
        self.client.loop_start()
        if not self._connected.wait(timeout_s):
            raise PublishError(f"the broker at {self.host}:{self.port} did not accept us within {timeout_s:.0f} s")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _jitter_reconnect(self) -> None:
        """The next reconnect wait of paho's loop: min and max set to one full-jitter draw."""
        delay = self._reconnect.next_s()
        self.client.reconnect_delay_set(delay, delay)  # type: ignore[arg-type]  # paho sleeps for floats too

    def _on_disconnect(self, *args: Any) -> None:
        self._connected.clear()
        with self._lock:  # on_connect subscribes everything again, and waits for those SUBACKs
            self._unacked.clear()
            self._early_acks.clear()
        self._jitter_reconnect()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if getattr(rc, "is_failure", False):
            self._jitter_reconnect()
            return
        self._reconnect.reset()
        self._jitter_reconnect()  # the wait after the next loss: the first step again
        for topic in list(self._subs):  # again after every reconnect (a broker restart forgets them)
            self._track(client.subscribe(topic, qos=1)[1], topic)
        self._connected.set()

    def _subscribe(self, topic: str) -> None:
        self._subs.append(topic)
        _, mid = self.client.subscribe(topic, qos=1)
        self._track(mid, topic)

    def _track(self, mid: int | None, topic: str) -> None:
        """Wait for this SUBSCRIBE's SUBACK in `_subscribed` — unless it came already: paho's network thread can
        run `_on_subscribe` before `subscribe()` has returned the id here."""
        if mid is None:  # not connected; on_connect subscribes again
            return
        with self._lock:
            self._topic_of[mid] = topic
            if mid in self._early_acks:
                self._early_acks.discard(mid)
            else:
                self._unacked.add(mid)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        failed = [str(c) for c in codes if getattr(c, "is_failure", False)]
        with self._lock:
            if failed:  # named by its topic in `_subscribed` (the SUBACK can beat subscribe()'s return)
                self._refused[mid] = ", ".join(failed)
            if mid in self._unacked:
                self._unacked.discard(mid)
            else:
                self._early_acks.add(mid)

    def _subscribed(self, timeout_s: float = 10.0) -> None:
        """Wait for the broker to confirm our subscriptions, so no device answers before we listen."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if self._refused:
                    what = "; ".join(f"{self._topic_of.get(m, f'id {m}')} ({r})" for m, r in self._refused.items())
                    raise PublishError(
                        f"the broker refused our subscription to {what}: without it no device's answer reaches us; "
                        "check the broker's ACL for this user"
                    )
                if not self._unacked:
                    return
            time.sleep(0.02)

    # ---- discovery -------------------------------------------------------------------------
    def discover(self, group: str, wait_s: float) -> tuple[list[str], list[str]]:
        """Devices whose retained status lists `group`: (online, offline)."""
        self._subscribe(topics.every_status(self.prefix))
        self._subscribed()
        time.sleep(wait_s)  # retained statuses arrive right after the SUBACK; live ones may take a moment
        return self.members(group)

    def members(self, group: str) -> tuple[list[str], list[str]]:
        """The devices whose status seen so far lists `group`: (online, offline), each sorted."""
        online: list[str] = []
        offline: list[str] = []
        with self._lock:
            for dev, doc in sorted(self._statuses.items()):
                if group in (doc.get("groups") or []):
                    (online if doc.get("state") == "online" else offline).append(dev)
        return online, offline

    # ---- the push --------------------------------------------------------------------------
    def push(self, ids: list[str], wait: Wait, timeout_s: float) -> list[Device]:
        wave = []
        for dev in ids:
            d = self.devices.setdefault(dev, Device(dev, total=self.total))
            d.active = True
            wave.append(d)
            root = topics.device_root(self.prefix, dev)
            for topic in (topics.ota_request(root), topics.ota_status(root), topics.model_state(root)):
                self._subscribe(topic)
            self._follow_shadow(d)
        self._subscribed()
        deadline = time.monotonic() + timeout_s
        self._offers_until = deadline
        for d in wave:
            self._offer(d)
        progress = Progress(self.out, wave, self.verbose)
        while True:
            with self._lock:
                pending = [d for d in wave if d.ended is None and not (wait == "swap" and d.ok(wait))]
                silent = [
                    d
                    for d in pending
                    if d.via and d.state == "downloading" and time.monotonic() - d.heard_at > TAKE_BACK_S
                ]
                for d in silent:  # the pusher we followed is gone: offering again makes the transfer ours
                    d.via = ""
                    d.heard_at = time.monotonic()
            for d in silent:
                self._offer(d)
            progress.draw()
            if not pending:
                break
            if time.monotonic() > deadline:
                for d in pending:
                    d.finish("timed_out", f"no outcome within {timeout_s:.0f} s (last state: {d.state})")
                break
            time.sleep(0.2)
        self.settle_shadow(wave)
        progress.draw(final=True)
        for d in wave:
            d.active = False
            if d.ended is None:
                d.finish(d.state)
        return wave

    # ---- shadow evaluation (--shadow) --------------------------------------------------------
    def _follow_shadow(self, d: Device) -> None:
        """Listen to the device's shadow report (a --shadow push)."""
        if self.shadow_ask is None:
            return
        if d.shadow is None:
            d.shadow = ShadowView()
        self._subscribe(topics.shadow(topics.device_root(self.prefix, d.id)))

    def settle_shadow(self, wave: list[Device]) -> None:
        """A device rejected on its shadow evidence publishes its final report beside the status that says
        so; wait a moment for it (at most SHADOW_SETTLE_S), so the report names the figures it ended on."""
        end = time.monotonic() + SHADOW_SETTLE_S
        while time.monotonic() < end:
            with self._lock:
                waiting = [d for d in wave if d.shadow is not None and d.state == "rejected" and not d.shadow.failed]
                waiting = [d for d in waiting if d.error.split(":", 1)[0] in SHADOW_CODES]
            if not waiting:
                return
            time.sleep(0.1)

    def _on_shadow(self, d: Device, doc: dict[str, Any]) -> None:
        """A report on ``…/shadow``: kept when it is of this transfer (or the one the device runs ours under)."""
        ours = {t for t in (self.transfer, d.via, d.took_over) if t}
        if d.shadow is None or doc.get("transfer") not in ours:
            return
        cand = doc.get("candidate") or {}
        if cand.get("name") != self.manifest.name or cand.get("version") != self.manifest.version:
            return
        with self._lock:
            d.shadow.take_report(doc)

    def _offer(self, d: Device) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        root = topics.device_root(self.prefix, d.id)
        props.ResponseTopic = topics.push_reply(root, self.transfer)
        props.CorrelationData = d.id.encode()
        # An offer waiting in an offline device's session must not be taken after this pusher has given up
        # (nobody would serve its chunks): the broker drops it then, and the device refuses it if it is late.
        props.MessageExpiryInterval = max(1, math.ceil(self._offers_until - time.monotonic()))
        with self._lock:
            d.offered_at = time.monotonic()
        self.client.publish(topics.command(root, "ota"), self.offer, qos=1, properties=props)

    # ---- messages (paho's thread) ----------------------------------------------------------
    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self._handle(msg)
        except Exception as exc:  # never into paho
            print(f"push: bad message on {msg.topic}: {exc}", file=self.out)

    def _handle(self, msg: mqtt.MQTTMessage) -> None:
        topic = msg.topic
        dev, suffix = topics.split(self.prefix, topic)
        if topic == topics.push_reply(topics.device_root(self.prefix, dev), self.transfer):
            return self._on_reply(dev, json.loads(msg.payload))  # the device named by its own topic
        if suffix == topics.STATUS:
            if msg.payload:
                with self._lock:
                    self._statuses[dev] = json.loads(msg.payload)
            return
        d = self.devices.get(dev)
        if d is None or not d.active or not msg.payload:
            return
        doc = json.loads(msg.payload)
        if suffix == topics.OTA_REQUEST:
            self._serve(d, doc)
        elif suffix == topics.OTA_STATUS:
            if doc.get("state") == OtaState.JOINED:
                self._on_joined(d, doc)
            elif doc.get("transfer") in (self.transfer, d.via or self.transfer) or self._taken_over(
                d, doc, bool(msg.retain)
            ):
                self._on_status(d, doc)
        elif suffix == topics.MODEL_STATE:
            self._on_model_state(d, doc)
        elif suffix == topics.SHADOW:
            self._on_shadow(d, doc)

    def _on_reply(self, dev: str, doc: dict[str, Any]) -> None:
        d = self.devices.get(dev)
        if d is None:
            return
        with self._lock:
            if not doc.get("ok"):
                err = doc.get("error") or {}
                d.finish("rejected", f"{err.get('code', '?')}: {err.get('message', '')}")
            elif (doc.get("result") or {}).get("state") == OtaState.UNCHANGED:
                d.bytes = 0
                d.finish(OtaState.UNCHANGED, "already current")
            else:
                d.took_over = str((doc.get("result") or {}).get("joined") or "")
                if d.state == "offered":
                    d.state = OtaState.ACCEPTED

    def _chunk_request(self, doc: dict[str, Any]) -> tuple[str, int, int] | None:
        """The (file, offset, length) a device asks of this transfer; None for another transfer's request or
        one outside the declared sizes (a device only asks inside them: anything else is not ours to answer)."""
        if doc.get("transfer") != self.transfer:
            return None
        name, offset, length = str(doc.get("file")), int(doc.get("offset", -1)), int(doc.get("length", 0))
        entry = self.manifest.files.get(name)
        if entry is None or offset < 0 or length <= 0 or length > MAX_CHUNK or offset + length > entry.size:
            return None
        return name, offset, length

    def _serve(self, d: Device, doc: dict[str, Any]) -> None:
        request = self._chunk_request(doc)
        if request is None:
            return
        name, offset, length = request
        with open(self.files[name], "rb") as f:
            f.seek(offset)
            data = f.read(length)
        root = topics.device_root(self.prefix, d.id)
        self.client.publish(topics.ota_data(root), chunk(self.transfer, name, offset, data), qos=0)
        d.served += len(data)

    def _on_joined(self, d: Device, doc: dict[str, Any]) -> None:
        """The device says a transfer was joined by a newer offer of the package: when it is ours (or the one
        we follow), follow the newer one. Another transfer joined to ours needs nothing: ours runs on."""
        by, joined = str(doc.get("by") or ""), doc.get("transfer")
        with self._lock:
            if by and by != self.transfer and d.ended is None and joined in (self.transfer, d.via or self.transfer):
                d.via = by
                d.heard_at = time.monotonic()

    def _taken_over(self, d: Device, doc: dict[str, Any], retained: bool) -> bool:
        """For a device too old to publish `joined`: whether this status is of another transfer that the
        device runs in place of ours: a live
        (not retained) status, after our offer, of another transfer id for this very package. The
        device joins an offer of the package it is downloading to the running transfer, under the
        newer offer's id; a different package would have been refused as busy."""
        other = str(doc.get("transfer") or "")
        model = doc.get("model") or {}
        if retained or not other or d.offered_at is None or d.ended is not None:
            return False
        if model.get("name") != self.manifest.name or model.get("version") != self.manifest.version:
            return False
        with self._lock:
            d.via = other
        return True

    def _on_status(self, d: Device, doc: dict[str, Any]) -> None:
        with self._lock:
            d.heard_at = time.monotonic()
            if doc.get("transfer") == self.transfer:
                d.via = ""  # ours again (our offer came after the other one's)
            state = str(doc.get("state"))
            if isinstance(doc.get("bytes"), int):
                d.bytes = doc["bytes"]
            if d.shadow is not None and state == OtaState.SHADOWING:
                d.shadow.take_status(doc.get("detail") or {}, float(doc.get("ts") or 0.0))
            detail = doc.get("detail") or {}
            if state == OtaState.PROBATION and detail.get("stage") and detail.get("committed"):
                d.finish("committed")  # a stage's probation passed (cascade/swap.py): its status says so
            elif state == OtaState.REJECTED and detail.get("stage") and "rolled_back_to" in detail:
                err = doc.get("error") or {}
                d.finish("rolled_back", f"{err.get('code', '?')}: {err.get('message', '')}")
            elif state in (OtaState.REJECTED, OtaState.FAILED):
                err = doc.get("error") or {}
                d.finish(state, f"{err.get('code', '?')}: {err.get('message', '')}")
            elif state == OtaState.CANCELLED:
                d.finish(state, "cancelled on the device (edged push --cancel)")
            elif state == OtaState.UNCHANGED:
                d.finish(state, "already current")
            elif d.ended is None and d.state not in ("committed", "rolled_back"):
                d.state = state

    def _on_model_state(self, d: Device, doc: dict[str, Any]) -> None:
        """After the swap: the retained model state says whether probation passed or rolled back."""
        if doc.get("name") != self.manifest.name or d.state != OtaState.PROBATION:
            return
        v = self.manifest.version
        with self._lock:
            if v in (doc.get("bad") or []):
                last = doc.get("last") or {}
                d.finish("rolled_back", str(last.get("reason", "rolled back on the device")))
            elif doc.get("active") == v and doc.get("probation") is None:
                d.finish("committed")


def push_stage(
    mqtt_cfg: MqttSettings, package: Path, stage: str, devices: list[str], wait: Wait, timeout_s: float,
    out: TextIO = sys.stderr,
) -> int:  # fmt: skip
    """``edged push PKG --stage NAME --device ID…``: the package offered as that cascade stage's next version to
    each device at once (no waves, no state file); each device's outcome reported. Exit 0 when every device
    succeeded (``--wait commit``: its probation passed), else 1."""
    pusher = Pusher(mqtt_cfg, package, out)
    pusher.use_stage(stage)
    print(f"push: {pusher.ref} as stage {stage!r} ({pusher.total / 2**20:.1f} MiB, transfer {pusher.transfer}) "
          f"via {mqtt_cfg.host}:{mqtt_cfg.port}", file=out)  # fmt: skip
    t0 = time.monotonic()
    try:
        pusher.connect()
        pusher.push(devices, wait, timeout_s)
        return report(pusher, wait, time.monotonic() - t0, out)
    finally:
        pusher.close()
