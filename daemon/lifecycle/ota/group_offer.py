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
seen again at the next connect, resumes it (a mirror back up, a link back), as a restart would.

The message arrives on paho's network thread, which only queues it (at most `MAX_PENDING`); a thread of
its own checks and offers it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path
from typing import Protocol

from paho.mqtt.client import MQTTMessage
from pydantic import ValidationError

from edged.errors import EdgedError
from edged.models.store.files import write_atomic
from edged.protocol.ota import MAX_OFFER_BYTES, GroupOffer, OfferArgs

logger = logging.getLogger(__name__)

MAX_PENDING = 8  # group offers waiting to be checked (one per group is all a broker sends)
MAX_REMEMBERED = 64  # transfer ids kept per device


class Offerable(Protocol):
    def offer(self, args: OfferArgs) -> dict[str, object]: ...

    def unfinished(self, args: OfferArgs) -> bool: ...


class GroupOffers:
    def __init__(self, receiver: Offerable, state_dir: Path, stop: threading.Event) -> None:
        self._receiver = receiver
        self._seen_path = state_dir / "ota-groups.json"
        self._stop = stop
        self._queue: queue.Queue[tuple[str, bytes]] = queue.Queue(MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="group-offers", daemon=True)
        self.taken = 0  # offers handed to the receiver (accepted or refused there)

    def start(self) -> None:
        self._thread.start()

    def on_message(self, msg: MQTTMessage) -> None:
        """paho's network thread: queue it (an empty retained message is a cleared offer: nothing to do)."""
        if not msg.payload or len(msg.payload) > MAX_OFFER_BYTES:
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
                continue
            try:
                self.handle(topic, payload)
            except Exception:  # a thread boundary: log it, take the next one
                logger.exception("ota: the group offer on %s failed", topic)

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
        else:
            write_atomic(self._seen_path, json.dumps(([*seen, offer.transfer])[-MAX_REMEMBERED:]).encode())
        self.taken += 1
        logger.info("ota: taking group %s's offer (transfer %s)", offer.group, offer.transfer)
        try:
            result = self._receiver.offer(offer.args())
        except EdgedError as exc:  # refused: the receiver reported it on ota/status already
            logger.info("ota: group %s's offer %s refused: %s", offer.group, offer.transfer, exc)
            return
        logger.info("ota: group %s's offer %s: %s", offer.group, offer.transfer, result.get("state"))
