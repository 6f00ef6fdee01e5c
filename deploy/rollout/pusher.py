"""The pusher a rollout drives (``edged.deploy.rollout``): `Pusher` with what a fleet needs.

- Discovery that does not guess: subscribed to every retained status, the pusher publishes a fence on
  ``<prefix>/_push/<transfer>/sync`` and has every retained status when its own fence comes back (the
  broker delivers one subscriber's messages in order); without the fence (an ACL that refuses it) it
  falls back on listening for ``discover_s``.
- A bounded outgoing queue: the chunks devices ask for are read and handed to paho by one sender thread
  only while fewer than `max_out_bytes` are written to paho and not yet on the socket (QoS 0 chunks:
  paho reports each once written); a device's further requests wait as small descriptors (at most
  `MAX_PENDING_PER_DEVICE` each; the device asks again for what was dropped). Memory stays bounded with
  1,000 devices asking at once.
- Waves that follow devices it does not offer to (`run_wave`'s `follow`): devices of the group that were
  offline, which take the group's retained offer when they connect again.
- A device whose retained model state already runs this version, committed, is done without an offer,
  and a device that answers ``unchanged`` while on probation waits for its commit where the wave does.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import paho.mqtt.client as mqtt

from edged.protocol import topics
from edged.protocol.client import MqttSettings
from edged.protocol.ota import OtaState, chunk

from ..progress import Progress
from ..push import TAKE_BACK_S, Device, Pusher, Wait

MAX_OUT_BYTES = 32 << 20  # chunk bytes handed to paho and not yet written to the socket
MAX_PENDING_PER_DEVICE = 32  # chunk requests waiting per device (a device asks `ota.window` at a time)
FENCE = b"fence"
MAX_PROGRESS_LINES = 50  # a wave bigger than this prints a line of counts every SUMMARY_EVERY_S instead
SUMMARY_EVERY_S = 5.0
QUEUE_WARN = 1000  # statuses at discovery from which a broker's queue limit may have cut some off


class RolloutPusher(Pusher):
    def __init__(
        self,
        mqtt_cfg: MqttSettings,
        package: Path,
        out: TextIO = sys.stderr,
        transfer: str | None = None,
        max_out_bytes: int = MAX_OUT_BYTES,
    ) -> None:
        super().__init__(mqtt_cfg, package, out, transfer)
        self.max_out_bytes = max_out_bytes
        self.out_bytes = 0  # handed to paho, not yet written
        self.peak_out_bytes = 0
        self.dropped_requests = 0
        self._out_mids: dict[int, int] = {}
        self._requests: collections.deque[tuple[Device, str, int, int]] = collections.deque()
        self._pending: collections.Counter[str] = collections.Counter()
        self._send_cv = threading.Condition()
        self._fenced = threading.Event()
        self._model_states: dict[str, dict[str, Any]] = {}
        self.group_offered: str | None = None  # the group whose retained offer we published
        self.resumed = False  # a resumed rollout: a wave first learns which devices committed in an earlier run
        self.refused: dict[int, str] = {}  # message id -> the broker's reason, for QoS 1 publishes it refused
        self.silent: set[str] = set()  # followed, never offered to (offline: the group offer is theirs)
        self.wave_wait: Wait = "swap"
        self._sending = True
        self.client.on_publish = self._on_publish
        self._sender = threading.Thread(target=self._send_loop, name="push-sender", daemon=True)
        self._sender.start()

    def close(self) -> None:
        with self._send_cv:
            self._sending = False
            self._send_cv.notify_all()
        self._sender.join(timeout=5)
        super().close()

    # ---- discovery and the fence -----------------------------------------------------------
    def fence(self, timeout_s: float) -> bool:
        """Publish the fence and wait for it: every retained message of the subscriptions made so far has
        arrived once it does. False when it did not come back within `timeout_s`."""
        sync = topics.push_sync(self.prefix, self.transfer)
        if sync not in self._subs:
            self._subscribe(sync)
        self._subscribed()
        self._fenced.clear()
        self.client.publish(sync, FENCE, qos=1)
        return self._fenced.wait(timeout_s)

    def discover(self, group: str, wait_s: float) -> tuple[list[str], list[str]]:
        """Devices whose retained status lists `group`: (online, offline)."""
        self._subscribe(topics.every_status(self.prefix))
        if not self.fence(max(wait_s, 10.0)):
            print(f"push: the discovery fence did not come back; using what arrived in {wait_s:.0f} s", file=self.out)
            time.sleep(wait_s)
        if len(self._statuses) >= QUEUE_WARN:
            print(
                f"push: {len(self._statuses)} retained statuses: a broker sends one subscriber at most its "
                "max_queued_messages (+ max_inflight_messages) at once and drops the rest silently; the shipped "
                "edged.conf sets 100000 (mosquitto's default of 1000 would hide devices beyond 1020)",
                file=self.out,
            )
        return self.members(group)

    def _handle(self, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == topics.push_sync(self.prefix, self.transfer):
            self._fenced.set()
            return
        dev, suffix = topics.split(self.prefix, msg.topic)
        if suffix == topics.MODEL_STATE and msg.payload:
            with self._lock:
                self._model_states[dev] = self._json(msg.payload)
        super()._handle(msg)

    @staticmethod
    def _json(payload: bytes | bytearray) -> dict[str, Any]:
        doc = json.loads(payload)
        return doc if isinstance(doc, dict) else {}

    def committed_here(self, dev: str) -> bool:
        """Whether the device's retained model state runs this version, past its probation."""
        doc = self._model_states.get(dev) or {}
        m = self.manifest
        return bool(doc.get("name") == m.name and doc.get("active") == m.version and doc.get("probation") is None)

    # ---- a wave ----------------------------------------------------------------------------
    def run_wave(
        self,
        ids: list[str],
        follow: list[str],
        wait: Wait,
        timeout_s: float,
        tick: Any = None,
        wait_follow: bool = False,
        offered: Any = None,
    ) -> list[Device]:
        """Offer to `ids` and follow them (and `follow`, never offered to: served once they take the
        group's offer) until each has an outcome or `timeout_s` passes; a device of `follow` not heard
        from yet is waited for only with `wait_follow`. `tick()` is called about every 0.2 s (the rollout
        saves its state there); `offered()` once the offers are out (the group's offer is published then,
        when every device of the wave is subscribed to)."""
        self.wave_wait = wait
        self.silent = set(follow)
        wave: list[Device] = []
        for dev in [*ids, *follow]:
            d = self.devices.get(dev)
            if d is None or d.ended is not None:
                d = self.devices[dev] = Device(dev, total=self.total)
            d.active = True
            if dev in self.silent:
                d.state = "offline"
            wave.append(d)
            root = topics.device_root(self.prefix, dev)
            # its chunk requests last: a device downloading from another pusher asks many a second, and the
            # broker would queue the SUBACKs of later subscriptions behind them
            for topic in (topics.ota_status(root), topics.model_state(root), topics.ota_request(root)):
                self._subscribe(topic)
            self._follow_shadow(d)
        if self.resumed:  # the retained model states of this wave are in: who committed before is not offered
            self.fence(10.0)
        else:  # a new rollout offers everyone (a current device answers unchanged): subscribed is enough, and
            self._subscribed()  # a fence can queue behind a busy device's chunk requests to another pusher
        deadline = time.monotonic() + timeout_s
        self._offers_until = deadline
        for d in wave:
            with self._lock:
                if d.ended is None and self.committed_here(d.id):
                    d.finish("committed", "")
                    d.error = "already committed (its retained model state)"
            if d.ended is None and d.id not in self.silent:
                self._offer(d)
        if offered is not None:
            offered()
        progress = Progress(self.out, wave, self.verbose) if len(wave) <= MAX_PROGRESS_LINES else None
        next_summary = time.monotonic() + SUMMARY_EVERY_S
        while True:
            with self._lock:
                pending = [
                    d
                    for d in wave
                    if d.ended is None
                    and not (wait == "swap" and d.ok(wait))
                    and (wait_follow or d.id not in self.silent or d.state != "offline")
                ]
                silent = [
                    d
                    for d in pending
                    if d.via and d.state == "downloading" and time.monotonic() - d.heard_at > TAKE_BACK_S
                ]
                for d in silent:
                    d.via = ""
                    d.heard_at = time.monotonic()
            for d in silent:
                self._offer(d)
            if progress is not None:
                progress.draw()
            elif time.monotonic() >= next_summary:  # a big wave: one line of counts
                next_summary = time.monotonic() + SUMMARY_EVERY_S
                self.summary(wave, wait)
            if tick is not None:
                tick()
            if not pending:
                break
            if time.monotonic() > deadline:
                for d in pending:
                    if d.id in self.silent and d.state == "offline":
                        d.finish("offline", "did not come back while the rollout ran; push again to serve it")
                    else:
                        d.finish("timed_out", f"no outcome within {timeout_s:.0f} s (last state: {d.state})")
                break
            time.sleep(0.2)
        self.settle_shadow(wave)
        if progress is not None:
            progress.draw(final=True)
        else:
            self.summary(wave, wait)
        for d in wave:
            d.active = False
            if d.ended is None:
                d.finish(d.state)
        return wave

    def summary(self, wave: list[Device], wait: Wait) -> None:
        with self._lock:
            ok = sum(1 for d in wave if d.ok(wait))
            bad = sum(1 for d in wave if d.ended is not None and not d.ok(wait) and d.state != "offline")
            moving = sum(d.bytes for d in wave if d.ended is None)
            shadowing = sum(1 for d in wave if d.ended is None and d.state == OtaState.SHADOWING)
        print(
            f"push: {ok} of {len(wave)} done, {bad} failed, {len(wave) - ok - bad} in progress "
            f"({moving / 2**20:.1f} MiB downloaded by those"
            + (f", {shadowing} shadowing" if shadowing else "")
            + f"); sending {self.out_bytes / 2**20:.1f} MiB",
            file=self.out,
            flush=True,
        )

    def _offer(self, d: Device) -> None:
        if d.id not in self.silent:
            super()._offer(d)

    def _on_reply(self, dev: str, doc: dict[str, Any]) -> None:
        super()._on_reply(dev, doc)
        d = self.devices.get(dev)
        if d is None or d.state != OtaState.UNCHANGED or self.wave_wait != "commit":
            return
        with self._lock:  # already swapped in (a resumed rollout): its commit is what this wave waits for
            if not self.committed_here(dev):
                d.ended, d.error, d.state = None, "", OtaState.PROBATION
            else:
                d.state = "committed"

    # ---- the bounded sender ----------------------------------------------------------------
    def _serve(self, d: Device, doc: dict[str, Any]) -> None:
        """paho's thread: check the request and queue its descriptor (the bytes are read by the sender)."""
        request = self._chunk_request(doc)
        if request is None:
            return
        name, offset, length = request
        with self._send_cv:
            if self._pending[d.id] >= MAX_PENDING_PER_DEVICE:
                self.dropped_requests += 1  # the device asks again after ota.retry_s
                return
            self._pending[d.id] += 1
            self._requests.append((d, name, offset, length))
            self._send_cv.notify()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        # paho's reconnect() drops the QoS 0 chunks it had not written without an on_publish for them: forget
        # them here, or they would count against max_out_bytes for good and the sender would stop (the
        # devices ask again for what they lack)
        with self._send_cv:
            self._out_mids.clear()
            self.out_bytes = 0
            self._send_cv.notify_all()
        super()._on_connect(client, userdata, flags, rc, props)

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        if getattr(rc, "is_failure", False):  # a QoS 1 PUBACK refusing it (e.g. 0x87: the ACL)
            self.refused[mid] = str(rc)
        with self._send_cv:
            n = self._out_mids.pop(mid, 0)
            if n:
                self.out_bytes -= n
                self._send_cv.notify()

    def _send_loop(self) -> None:
        while True:
            with self._send_cv:
                while self._sending and (not self._requests or self.out_bytes >= self.max_out_bytes):
                    self._send_cv.wait(0.5)
                if not self._sending:
                    return
                d, name, offset, length = self._requests.popleft()
                self._pending[d.id] -= 1
                if self._pending[d.id] <= 0:
                    del self._pending[d.id]
            try:
                self._send(d, name, offset, length)
            except Exception as exc:  # a thread boundary: report, go on with the next request
                print(f"push: serving {d.id} {name}@{offset} failed: {exc}", file=self.out)

    def _send(self, d: Device, name: str, offset: int, length: int) -> None:
        with open(self.files[name], "rb") as f:
            f.seek(offset)
            data = f.read(length)
        payload = chunk(self.transfer, name, offset, data)
        with self._send_cv:  # counted before paho can report it written
            info = self.client.publish(topics.ota_data(topics.device_root(self.prefix, d.id)), payload, qos=0)
            if info.rc == mqtt.MQTT_ERR_SUCCESS and info.mid not in self._out_mids and not info.is_published():
                self._out_mids[info.mid] = len(payload)
                self.out_bytes += len(payload)
                self.peak_out_bytes = max(self.peak_out_bytes, self.out_bytes)
        d.served += len(data)
