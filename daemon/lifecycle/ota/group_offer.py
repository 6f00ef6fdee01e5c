"""A group's retained offer, the device's side: how a device that was offline during a rollout catches up.

``edged push --group G`` publishes the rollout's offer, retained, on ``<prefix>/_groups/G/ota`` when the
rollout reaches its last wave (`edged.protocol.ota.GroupOffer`). A device subscribes to the offer topic of
each of its `groups` and, when one arrives (at every connect the broker sends the retained one again),
hands it to the OTA receiver exactly as a ``cmd/ota`` offer: the signature, the version ordering (older
than the highest accepted: refused), a version rolled back here (never retried) and the compatibility
are checked as for any offer, and its progress goes to ``…/ota/status`` under the rollout's transfer id,
which the pusher follows. Each transfer id is acted on once: the ids taken are kept in
``<state_dir>/ota-groups.json``, so an offer refused or rolled back is not tried again at each reconnect
— unless its transfer stopped short (stalled, or a failed download: the bytes are kept): then the offer,
seen again at the next connect, resumes it (a mirror back up, a link back), as a restart would. An offer
that finds another transfer running here (``busy``: a transfer a previous run left, resumed at start) is not
kept as taken: it is tried again every `RETRY_BUSY_S` until the receiver takes it, a newer offer replaces it
or the group's offer is withdrawn.

An offer with ``shadow`` (a rollout's ``--shadow``) is evaluated here like a ``cmd/ota`` one, whenever the
device joins the group: once judged (promoted, rejected, no evidence) its id is taken and a restart does not
evaluate it again; a stop in the middle of the evaluation leaves the transfer to the start's resume, which
evaluates it from nothing (the offer seen then is the running transfer's: ignored).

The message arrives on paho's network thread, which only queues it (at most `MAX_PENDING`); a thread of
its own checks and offers it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Protocol

from paho.mqtt.client import MQTTMessage
from pydantic import ValidationError

from edged.errors import Code, EdgedError
from edged.models.store.files import write_atomic
from edged.protocol.ota import MAX_OFFER_BYTES, GroupOffer, OfferArgs

logger = logging.getLogger(__name__)

MAX_PENDING = 8  # group offers waiting to be checked (one per group is all a broker sends)
MAX_REMEMBERED = 64  # transfer ids kept per device
RETRY_BUSY_S = 5.0  # an offer refused as busy (another transfer runs here) is offered again this often


class Offerable(Protocol):
    def offer(self, args: OfferArgs) -> dict[str, object]: ...

    def unfinished(self, args: OfferArgs) -> bool: ...


class GroupOffers:
    def __init__(
        self, receiver: Offerable, state_dir: Path, stop: threading.Event, retry_busy_s: float = RETRY_BUSY_S
    ) -> None:
        self._receiver = receiver
        self._seen_path = state_dir / "ota-groups.json"
        self._stop = stop
        self._retry_busy_s = retry_busy_s
        self._queue: queue.Queue[tuple[str, bytes]] = queue.Queue(MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="group-offers", daemon=True)
        self.taken = 0  # offers handed to the receiver (accepted or refused there)
        self._busy: dict[str, bytes] = {}  # topic -> its offer, refused as busy: offered again (this thread's)
        self._retry_at = 0.0
        self._waited: set[str] = set()  # transfer ids said to wait (logged once, not every retry)

    def start(self) -> None:
        self._thread.start()

    def on_message(self, msg: MQTTMessage) -> None:
        """paho's network thread: queue it (an empty retained message is a cleared offer: it only drops an
        offer of that group waiting to be offered again)."""
        if len(msg.payload) > MAX_OFFER_BYTES:
            return
        try:
            self._queue.put_nowait((msg.topic, bytes(msg.payload)))
        except queue.Full:
            logger.warning("ota: a group offer on %s dropped (%d waiting)", msg.topic, MAX_PENDING)

    def _seen(self) -> list[str]:
        try:
            ids = json.loads(self._seen_path.read_text())
        except (OSError, ValueError):
            return []
        return [str(i) for i in ids] if isinstance(ids, list) else []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                topic, payload = self._queue.get(timeout=0.5)
            except queue.Empty:
                self._again()
                continue
            self._busy.pop(topic, None)  # a newer offer of the group, or the offer withdrawn
            if payload:
                self._take(topic, payload)

    def _take(self, topic: str, payload: bytes) -> None:
        try:
            self.handle(topic, payload)
        except Exception:  # a thread boundary: log it, take the next one
            logger.exception("ota: the group offer on %s failed", topic)

    def _again(self) -> None:
        """The offers refused as busy, offered again once `RETRY_BUSY_S` has passed."""
        if not self._busy or time.monotonic() < self._retry_at:
            return
        waiting, self._busy = self._busy, {}
        for topic, payload in waiting.items():
            self._take(topic, payload)

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            offer = GroupOffer.model_validate_json(payload)
        except ValidationError as exc:
            logger.warning("ota: malformed group offer on %s: %s", topic, exc.errors()[0].get("msg", exc))
            return
        if not topic.endswith(f"/{offer.group}/ota"):
            logger.warning("ota: a group offer for %r on another group's topic %s; ignored", offer.group, topic)
            return
        seen = self._seen()
        if offer.transfer in seen and not self._receiver.unfinished(offer.args()):
            logger.info("ota: group %s's offer %s was taken before; ignored", offer.group, offer.transfer)
            return
        if offer.transfer in seen:
            logger.info("ota: group %s's offer %s stopped short here: taken again", offer.group, offer.transfer)
        self.taken += 1
        if offer.transfer not in self._waited:
            logger.info("ota: taking group %s's offer (transfer %s)", offer.group, offer.transfer)
        busy = False
        try:
            result = self._receiver.offer(offer.args())
        except EdgedError as exc:  # refused: the receiver reported it on ota/status already
            busy = exc.code == Code.BUSY  # another transfer runs: nothing was checked, offered again
            if busy:
                self._busy[topic] = payload
                self._retry_at = time.monotonic() + self._retry_busy_s
                if offer.transfer not in self._waited:
                    self._waited.add(offer.transfer)
                    logger.info("ota: group %s's offer %s waits: %s; offered again every %.0f s", offer.group,
                                offer.transfer, exc, self._retry_busy_s)  # fmt: skip
            else:
                logger.info("ota: group %s's offer %s refused: %s", offer.group, offer.transfer, exc)
            return
        finally:
            if not busy and offer.transfer not in seen:  # acted on (accepted, or refused on its merits): once
                write_atomic(self._seen_path, json.dumps(([*seen, offer.transfer])[-MAX_REMEMBERED:]).encode())
        logger.info("ota: group %s's offer %s: %s", offer.group, offer.transfer, result.get("state"))
