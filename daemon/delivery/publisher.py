"""Results, events, status and telemetry over MQTT v5 with paho-mqtt 2.x (DESIGN.md §2, §4).

    inference ──submit()──> bounded queue ──publisher thread──> spool (SQLite WAL) ──> paho ──> broker
                                                         PUBACK deletes the row <──┘

- `submit()` never blocks: a full queue drops the result (counted).
- The publisher thread numbers results (`seq`, +1 per spooled result within a `boot_id`), refuses a
  payload over `MAX_PAYLOAD_BYTES` locally (so one message can never become a reconnect loop),
  appends to the spool, commits in groups (a group is committed before more is taken), hands rows to
  paho (`max_inflight` on the wire, half as many again queued in paho, which sends them on each PUBACK
  without waiting for this thread), and deletes a row when its PUBACK arrives. Rows still spooled at a
  restart are sent again.
- The connection (our own supervised network thread, reconnects with full-jitter backoff, the persistent
  session, the retained status and its last will, the Maximum Packet Size) is the `Session` this
  class extends (daemon/delivery/session.py); what comes in is routed by its `Inbox` (daemon/delivery/inbox.py).
- A PUBACK with a failure reason code (0x87 Not authorized from an ACL, say) is a refusal, not a
  delivery: the row stays in the spool, the topic is held and retried with backoff (full jitter, up to
  1 s doubling to 60 s), counted in `refused` and logged once per topic and reason.
- Storage failures (disk full, I/O errors, a deleted or corrupt spool file) never stop the thread:
  appended messages wait in memory (bounded, drops counted) and writes are retried with backoff
  (full jitter, up to 30 s);
  `spool_state` says so in status and telemetry. The thread's progress (`last_progress`) and
  life are the watchdog's business (`Daemon._health`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.protocol import topics
from edged.protocol.backoff import Backoff
from edged.protocol.client import MAX_PAYLOAD_BYTES
from edged.protocol.schemas import dumps, iso

from ..config import MqttConfig, SpoolConfig
from .inbox import Inbox, MessageHandler
from .payload import result_bytes, result_payload
from .session import Session
from .spool import Spool, SpoolCorrupt, SpoolError

if TYPE_CHECKING:  # the inference types need NumPy: only for type checking here
    from ..inference import Result

__all__ = ["MAX_PAYLOAD_BYTES", "Publisher", "iso", "result_payload"]

logger = logging.getLogger(__name__)

EventHandler = Callable[[dict[str, Any]], None]
MAX_BACKOFF_S = 60.0  # refused topics: full jitter up to this (edged.protocol.backoff)
MAX_STORAGE_BACKOFF_S = 30.0
TAKE_ROWS = 1000  # messages taken from the queue per turn, at most: then committed (one group), then sent


@dataclass
class _Hold:
    """A topic the broker refuses: its rows wait in the spool until `until`, then are sent again."""

    first_id: int  # the oldest refused (or skipped) row: sending starts again there
    backoff: Backoff = field(default_factory=lambda: Backoff(1.0, MAX_BACKOFF_S))
    until: float = 0.0
    retrying: bool = False  # the hold ended and the rows were sent again; a refusal now doubles the backoff


class Publisher(Session):
    def __init__(
        self,
        cfg: MqttConfig,
        spool_cfg: SpoolConfig,
        spool: Spool,
        device_id: str,
        topic_root: str,
        boot_id: str,
        status_extra: Callable[[], dict[str, Any]],
        on_command: MessageHandler | None = None,
        queue_size: int = 1024,
        on_event: EventHandler | None = None,
    ) -> None:
        """`on_event`: where the publisher's own events go (`spool_recovered`), the daemon's event path;
        `on_command`: the handler of the device's commands (``…/cmd/+``)."""
        super().__init__(cfg, device_id, topic_root, boot_id, status_extra, Inbox(topic_root, on_command))
        self.spool_cfg = spool_cfg
        self.spool = spool
        self._on_event = on_event
        # submit() -> the publisher thread: a deque (append and popleft are atomic) with a bound checked before
        # each append: a queue.Queue's lock and condition cost more per message than the deque's whole path
        self._q: deque[tuple[str, Any]] = deque()
        self.queue_size = queue_size
        self.seq = 0
        self.results = 0  # results handed to submit()
        self.spooled = 0
        self.published = 0
        self.acked = 0
        self.sent_qos0 = 0  # QoS 0 rows sent (deleted on send: no PUBACK comes)
        self.dropped_queue_full = 0
        self.last_progress = time.monotonic()  # the publisher thread's last turn (the watchdog reads it)
        self.failure = ""  # why the publisher thread died, if it did
        self.refused = 0  # PUBACKs with a failure reason code: the row stays, the topic is retried later
        self.spool_error = ""
        self.left_in_spool = 0  # rows in the spool file after stop
        # paho mid -> (spool row id, topic); touched by the publisher thread only. PUBACKs arrive on the
        # network thread as (mid, failure reason or None) in `_acked_mids` (deque appends are atomic),
        # matched on the publisher thread after the mid is recorded, so no lock is held around paho's
        # own (lock order: no deadlock).
        self._inflight: dict[int, tuple[int, str]] = {}
        self._acked_mids: deque[tuple[int, ReasonCode | None]] = deque()
        self._holds: dict[str, _Hold] = {}  # topics the broker refuses
        self._refusals_logged: set[tuple[str, str]] = set()
        self._unsaved_deletes: list[int] = []  # acknowledged rows whose delete failed: retried
        self._commit_backoff = Backoff(1.0, MAX_STORAGE_BACKOFF_S)  # a failing spool: retried, never fatal
        self._deliver_backoff = Backoff(1.0, MAX_STORAGE_BACKOFF_S)
        self._wake = threading.Event()  # set by submit() and by PUBACKs: the publisher thread has work
        self._ack_batch = max(1, cfg.max_inflight // 4)
        # rows handed to paho, not yet acknowledged: its window and half as many queued (paho's queue holds
        # three windows, protocol/client.py: the other half stays free for the session's status, replies,
        # model state, OTA status)
        self._handoff = cfg.max_inflight + max(1, cfg.max_inflight // 2)
        self._take_bytes = max(1, spool.max_unsaved_bytes // 4)  # a group's bytes, at most (see _take)
        self._last_sent = 0
        self._maybe_unsent = True  # committed rows past _last_sent may exist (after a commit, or at start)
        self.client.on_publish = self._on_publish
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    # --- PUBACKs (network thread) -------------------------------------------------------------
    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, rc: ReasonCode, props: Properties | None
    ) -> None:
        # matched to a spool row by the publisher thread; a failure reason code is a refusal, not a delivery
        self._acked_mids.append((mid, rc if rc.is_failure else None))
        # wake the publisher for a batch, not for each PUBACK (and take no lock when it is awake already)
        if (rc.is_failure or len(self._acked_mids) >= self._ack_batch) and not self._wake.is_set():
            self._wake.set()

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background; a broker that is away at start does not stop the daemon."""
        self._net_thread.start()
        self._thread.start()

    def submit(self, result: Result) -> None:
        self.results += 1
        self._put("result", result)

    def submit_event(self, doc: dict[str, Any]) -> None:
        """Events are spooled like results (QoS 1, nothing lost)."""
        self._put("event", doc)

    def _put(self, kind: str, item: Any) -> None:
        if len(self._q) >= self.queue_size:  # (two threads submitting at once may both pass: one over, harmless)
            self.dropped_queue_full += 1
            return
        self._q.append((kind, item))
        if not self._wake.is_set():
            self._wake.set()

    @property
    def queue_full(self) -> bool:
        return len(self._q) >= self.queue_size

    # --- the publisher thread ----------------------------------------------------------------------
    def _spool_one(self, kind: str, item: Any) -> int:
        """Number and append one message; returns its size in bytes (0 when refused)."""
        if kind == "result":
            self.seq += 1
            # the same bytes as dumps(result_payload(...)), for less work per result (payload.py)
            payload = result_bytes(item, self.device_id, self.boot_id, self.seq)
            topic, qos = topics.results(self.root, item.camera), self.cfg.qos
        else:
            payload, topic, qos = dumps(item), topics.events(self.root), 1
        if len(payload) > MAX_PAYLOAD_BYTES:
            self.oversized += 1
            if kind == "result":
                self.seq -= 1  # refused locally: seq counts spooled results, so no gap
            logger.error("mqtt: %s payload of %d bytes is over %d; refused", topic, len(payload), MAX_PAYLOAD_BYTES)
            return 0
        self.spool.append(topic, payload, qos)
        self.spooled += 1
        return len(payload)

    def _refused(self, row_id: int, topic: str, rc: ReasonCode, now: float) -> None:
        """A PUBACK with a failure reason code: the row stays; its topic is held, then retried."""
        self.refused += 1
        hold = self._holds.get(topic)
        if hold is None:
            hold = self._holds[topic] = _Hold(first_id=row_id)
        elif hold.retrying:  # sent again after the hold and refused again
            hold.first_id = row_id
        else:  # another refusal of the same round
            hold.first_id = min(hold.first_id, row_id)
            return
        hold.retrying = False
        hold.until = now + hold.backoff.next_s()  # full jitter: a fleet does not retry in step
        reason = f"{rc} (0x{rc.value:02x})"
        self.last_error = f"the broker refused a publish to {topic}: {reason}"
        if (topic, reason) not in self._refusals_logged:
            self._refusals_logged.add((topic, reason))
            logger.error(
                "mqtt: %s; the message stays in the spool and %s is retried with backoff up to %.0f s",
                self.last_error,
                topic,
                MAX_BACKOFF_S,
            )

    def _deliver(self) -> None:
        now = time.monotonic()
        acked, self._unsaved_deletes = self._unsaved_deletes, []
        while self._acked_mids:
            mid, refusal = self._acked_mids.popleft()
            entry = self._inflight.pop(mid, None)
            if entry is None:  # the PUBACK of a message that was not spooled (status, a reply)
                continue
            row_id, topic = entry
            if refusal is not None:
                self._refused(row_id, topic, refusal, now)
                continue
            acked.append(row_id)
            self.acked += 1
            hold = self._holds.get(topic)
            if hold is not None and hold.retrying:
                del self._holds[topic]
                self._refusals_logged = {k for k in self._refusals_logged if k[0] != topic}
                logger.info("mqtt: the broker accepts publishes to %s again", topic)
        if acked:
            try:
                self.spool.delete(acked)
            except SpoolError:
                self._unsaved_deletes = acked  # acknowledged: not sent again in this run, deleted later
                raise
        if not self.connected:
            return
        for hold in self._holds.values():
            if not hold.retrying and now >= hold.until:  # the hold is over: send its rows again
                hold.retrying = True
                self._last_sent = min(self._last_sent, hold.first_id - 1)
                self._maybe_unsent = True
        sending = {row_id for row_id, _ in self._inflight.values()} if self._holds else set()
        for _ in range(20):  # rows of held topics are skipped: look further, boundedly
            room = self._handoff - len(self._inflight)
            if room <= 0 or not self._maybe_unsent:
                return
            rows = self.spool.after(self._last_sent, room)
            if len(rows) < room:
                self._maybe_unsent = False
            for row in rows:
                hold = self._holds.get(row.topic)
                if (hold is not None and not hold.retrying) or row.id in sending:
                    if hold is not None and not hold.retrying:
                        hold.first_id = min(hold.first_id, row.id)
                    self._last_sent = row.id
                    continue
                info = self.client.publish(row.topic, row.payload, qos=row.qos)
                if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                    self._maybe_unsent = True
                    return  # paho's queue is full: try again on the next turn
                if row.qos > 0:
                    self._inflight[info.mid] = (row.id, row.topic)
                else:
                    self.spool.delete([row.id])
                    self.sent_qos0 += 1  # QoS 0: handed to the socket is all the delivery there is
                self._last_sent = row.id
                self.published += 1
            if not rows:
                return

    def _storage(self, backoff: Backoff, op: Callable[[], None], now: float) -> bool:
        """Run a spool operation; a storage failure is reported and retried with backoff, never fatal."""
        try:
            op()
        except SpoolCorrupt as exc:
            self._spool_failed(exc)
            try:
                self.spool.recover_corrupt(str(exc))
            except SpoolError as again:
                self._spool_failed(again)
                backoff.failed(now)
                return False
            self._maybe_unsent = True
            backoff.reset()
            return False
        except SpoolError as exc:
            self._spool_failed(exc)
            backoff.failed(now)
            return False
        backoff.reset()
        if self.spool_state != "ok" and self._commit_backoff.failures == 0 and self._deliver_backoff.failures == 0:
            self._spool_ok()
        return True

    def _spool_failed(self, exc: SpoolError) -> None:
        msg = str(exc)
        was = self.spool_state
        if was == "ok" or msg != self.spool_error:
            logger.error(
                "%s; %d messages wait in memory (up to %.1f MB, then the oldest are dropped, counted); "
                "retrying with backoff up to 30 s",
                msg,
                self.spool.pending_commit,
                self.spool.max_unsaved_bytes / 2**20,
            )
        self.spool_state, self.spool_error = "failing", msg
        if was == "ok" and self.connected:
            self.publish_status("online")  # the retained status says "spool": "failing"

    def _spool_ok(self) -> None:
        logger.warning(
            "spool: storage works again; %d messages were dropped from memory while it failed",
            self.spool.dropped_unsaved,
        )
        self.spool_state, self.spool_error = "ok", ""
        if self.connected:
            self.publish_status("online")

    def _announce_recoveries(self) -> None:
        while self.spool.recoveries:
            doc = self.spool.recoveries.popleft()
            if self._on_event is not None:
                self._on_event(doc)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a bug: the thread ends; the daemon sees it (Daemon._health) and exits
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.critical("publisher: the thread died: %s", self.failure, exc_info=True)

    def _take(self) -> None:
        """Take what waits, up to a group (TAKE_ROWS, or a quarter of the spool's max_unsaved_bytes), so that a
        producer that keeps the queue full never makes the spool drop from memory what is not committed yet."""
        n = size = 0
        try:
            while n < TAKE_ROWS and size < self._take_bytes:
                kind, item = self._q.popleft()
                n += 1
                size += self._spool_one(kind, item)
        except IndexError:  # empty
            pass
        except Exception:  # a loop boundary: log once, count, keep going
            logger.exception("publisher: cannot spool a message")

    def _loop(self) -> None:
        last_commit = time.monotonic()
        interval = self.spool_cfg.commit_interval_ms / 1000.0
        while True:
            if not self._q:  # a full group was taken last turn: what is left is taken at once
                self._wake.wait(min(0.05, interval))
            self._wake.clear()
            now = self.last_progress = time.monotonic()
            self._take()
            # Commit as soon as the queue is drained (low latency at camera rates), when a group is full (see
            # _take), and at least every commit_interval_ms (the loss window). The commit also enforces the
            # age bound: it runs every interval even when nothing comes.
            pending = self.spool.pending_commit
            full = pending >= TAKE_ROWS or self.spool.pending_bytes >= self._take_bytes
            due = now - last_commit >= interval or (pending and (not self._q or full))
            if due and self._commit_backoff.due(now) and self._storage(self._commit_backoff, self.spool.commit, now):
                last_commit = now
                if pending:
                    self._maybe_unsent = True
            if self._deliver_backoff.due(now):
                self._storage(self._deliver_backoff, self._deliver, now)
            self._announce_recoveries()
            if self._stop.is_set() and not self._q:
                if self._storage(self._commit_backoff, self.spool.commit, now):
                    self._maybe_unsent = True
                return

    def alive(self, now: float, stall_s: float) -> tuple[bool, str]:
        """The watchdog's question about the publisher thread: alive and turning?"""
        if not self._thread.is_alive():
            return False, f"the publisher thread died ({self.failure or 'no reason recorded'})"
        stalled = now - self.last_progress
        if stalled > stall_s:
            return False, f"the publisher thread has made no progress for {stalled:.1f} s"
        return True, ""

    @property
    def thread_died(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set()

    def stats(self) -> dict[str, Any]:
        inflight = len(self._inflight)
        return {
            "connected": self.connected,
            "results": self.results,
            "spooled": self.spooled,
            "published": self.published,
            "acked": self.acked,
            "refused": self.refused,
            "inflight": inflight,
            "spool_rows": self.spool.rows,
            "spool_mb": round(self.spool.bytes / 2**20, 3),
            "spool_dropped": self.spool.dropped,
            "spool_state": self.spool_state,
            "spool_error": self.spool_error,
            "spool_errors": self.spool.errors,
            "spool_unsaved": self.spool.pending_commit,
            "spool_dropped_unsaved": self.spool.dropped_unsaved,
            "spool_lost": self.spool.lost,
            "spool_recovered": self.spool.recovered,
            "dropped_queue_full": self.dropped_queue_full,
            "oversized": self.oversized,
            "connects": self.connects,
            "connect_failures": self.connect_failures,
            "network_alive": self.network_alive(),
            "network_restarts": self.network_restarts,
            "last_error": self.last_error,
        }

    def stop(self, timeout_s: float = 5.0) -> None:
        """Spool what is queued, wait (up to `timeout_s`) for the broker to acknowledge the spool,
        announce `stopped`, disconnect. What is left stays in the spool for the next start."""
        self._stop.set()
        self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            # wait for what is in flight and what can still be sent; rows of topics the broker refuses
            # (held) wait for the next start, not for this timeout
            while self.connected and (self._inflight or self._maybe_unsent) and time.monotonic() < deadline:
                self._deliver()
                time.sleep(0.02)
            self._deliver()
        except SpoolError as exc:
            logger.error("mqtt: delivery at stop ended early: %s", exc)
        if self.connected:
            info = self.publish_status("stopped")
            try:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            except (RuntimeError, ValueError):
                logger.warning("mqtt: 'stopped' status not acknowledged before disconnecting")
        self.disconnect()
        # paho opens a wake-up socket pair in reconnect() and closes it only in loop_stop() (which we do
        # not use: our own thread drives loop()) or when the client is garbage-collected; close it now.
        self.client._reset_sockets()
        self.spool.close()  # writes what is pending, re-creates a deleted file; says what it lost
        self.left_in_spool = self.spool.rows
        if self.left_in_spool:
            logger.warning(
                "mqtt: %d messages not acknowledged at stop; they stay in the spool (%s) for the next start",
                self.left_in_spool,
                self.spool.path,
            )
