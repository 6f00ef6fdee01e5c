"""The command channel: ``<prefix>/<device>/cmd/<verb>`` in, a reply for every command out.

A command's payload is capped (16 KiB), never empty (an empty publish clears a retained message;
``{}`` means no arguments), and parsed strictly before anything acts on it: UTF-8, a
JSON object without duplicate keys, without NaN or Infinity, nested at most 16 deep, then validated
against the verb's schema (unknown fields are errors). The reply goes to the MQTT v5 response topic
with the correlation data when the command carries them, else to ``…/cmd/<verb>/reply``. A response
topic is confined to what the shipped ACL (systemd/mosquitto/edged.acl) lets a device publish, so a
command can never steer a reply into another device's topics, ``$SYS/…`` or anywhere a strict broker
would disconnect the device for:

    <prefix>/<device>/reply/<anything>          the device's own reply namespace
    <prefix>/_push/<id>/reply                   a pusher's (``edged push``) reply topic

Any other response topic is refused: the command is not run, and the refusal (code
``bad_response_topic``, with the correlation data) goes to ``…/cmd/<verb>/reply``.

    {"schema": "edged.reply/1", "verb": "pause", "ok": true, "result": {...}}
    {"schema": "edged.reply/1", "verb": "snapshot", "ok": false, "error": {"code": "...", "message": "..."}}

A command can expire, so one that waited (in the broker's persistent session while the device was
offline, or behind a slow command on the device) is never run late: the sender sets an MQTT v5 Message
Expiry Interval (the broker drops it when that runs out; what reaches us carries the time left, and the
device refuses it when it has waited longer than that here), and/or, for senders without MQTT v5, an
``"expires_at": "<ISO-8601 with a UTC offset>"`` field in any verb's payload (taken out before the
verb's own schema is checked). A stale command is not run: the reply says so, code ``expired``.

Retained commands are acted on only when the verb is idempotent (a retained ``reload`` would
re-run at every reconnect). Commands run one at a time on their own thread, off paho's network
thread; no exception escapes to paho. Verbs are registered by the daemon (``register``); later
parts add model verbs the same way.

The wire side (strict payload parsing, ``expires_at``, reply documents, allowed response topics, the
error codes) is the contract's, in `edged.protocol.commands` and `edged.protocol.topics`; this module
runs commands by it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from paho.mqtt.client import MQTTMessage
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel, ConfigDict, ValidationError

from edged.errors import Code, CommandError
from edged.protocol import topics
from edged.protocol.commands import EXPIRES_AT, MAX_COMMAND_BYTES, check_not_expired, parse_payload, reply_doc
from edged.protocol.topics import response_topic_allowed

__all__ = ["CommandError", "Commands", "NoArgs", "Verb"]  # CommandError: edged.errors'; the verbs raise it

logger = logging.getLogger(__name__)


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Handler = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Verb:
    args: type[BaseModel]
    handler: Handler
    idempotent: bool
    max_bytes: int = MAX_COMMAND_BYTES


class Commands:
    def __init__(
        self,
        root: str,
        reply: Callable[[str, bytes, Properties | None], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        """`root`: the device's topics, ``<prefix>/<device>``; `reply(topic, payload, properties)` sends.
        `clock` times how long a command waits here (its Message Expiry Interval); `wall` is UTC now
        (a payload's ``expires_at``)."""
        self.root = root
        self._reply = reply
        self._clock = clock
        self._wall = wall
        self.verbs: dict[str, Verb] = {}
        self.handled = 0
        self.rejected = 0
        self._q: queue.Queue[tuple[MQTTMessage, float] | None] = queue.Queue(maxsize=32)  # (message, received)
        self._thread = threading.Thread(target=self._run, name="commands", daemon=True)

    def register(
        self, verb: str, args: type[BaseModel], handler: Handler, idempotent: bool, max_bytes: int = MAX_COMMAND_BYTES
    ) -> None:
        """`max_bytes`: this verb's payload cap (the model offer carries a manifest; the rest stay at 16 KiB)."""
        self.verbs[verb] = Verb(args, handler, idempotent, max_bytes)

    def max_bytes(self) -> int:
        """The largest payload any registered verb takes (what the broker may send us on cmd/+)."""
        return max((v.max_bytes for v in self.verbs.values()), default=MAX_COMMAND_BYTES)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)
        self._thread.join(5.0)

    def on_message(self, msg: MQTTMessage) -> None:
        """Called on paho's network thread: only queue the message (reply 'busy' when the queue is full)."""
        try:
            self._q.put_nowait((msg, self._clock()))
        except queue.Full:
            self._answer(msg, self._verb_of(msg.topic), error=CommandError(Code.BUSY, "too many commands waiting"))

    def _verb_of(self, topic: str) -> str:
        return topics.verb_of(self.root, topic)

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            msg, received = item
            verb = self._verb_of(msg.topic)
            try:
                self._check_response_topic(msg)
                self._check_expiry_interval(msg, received)
                result = self.execute(verb, bytes(msg.payload), bool(msg.retain))
                self._answer(msg, verb, result=result)
                self.handled += 1
            except CommandError as exc:
                self.rejected += 1
                logger.warning("command %s refused: %s: %s", verb or msg.topic, exc.code, exc)
                self._answer(msg, verb, error=exc)
            except Exception as exc:  # a loop boundary: the daemon keeps serving
                self.rejected += 1
                logger.exception("command %s failed", verb)
                self._answer(msg, verb, error=CommandError(Code.FAILED, f"{type(exc).__name__}: {exc}"))

    def _check_response_topic(self, msg: MQTTMessage) -> None:
        topic = self._response_topic(msg)
        if topic is not None and not response_topic_allowed(topic, self.root):
            raise CommandError(
                Code.BAD_RESPONSE_TOPIC,
                f"response topic {topic[:200]!r} is outside this device's reply topics ({self.root}/reply/… or "
                f"{self.root.rpartition('/')[0]}/_push/<id>/reply); the command was not run",
            )

    def _check_expiry_interval(self, msg: MQTTMessage, received: float) -> None:
        """The MQTT v5 Message Expiry Interval as delivered: the seconds it had left when the broker sent it
        (whole seconds, rounded down: so up to one more). Expired when it waited here longer than that."""
        in_props = getattr(msg, "properties", None)
        left = getattr(in_props, "MessageExpiryInterval", None) if in_props is not None else None
        if not isinstance(left, int):
            return
        waited = self._clock() - received
        if waited > left + 1:
            raise CommandError(
                Code.EXPIRED,
                f"the command's Message Expiry Interval ran out while it waited on the device ({left} s left when "
                f"it arrived, {waited:.1f} s ago); it was not run",
            )

    @staticmethod
    def _response_topic(msg: MQTTMessage) -> str | None:
        in_props = getattr(msg, "properties", None)
        topic = getattr(in_props, "ResponseTopic", None) if in_props is not None else None
        return topic if isinstance(topic, str) and topic else None  # an empty one is no response topic

    def execute(self, verb: str, payload: bytes, retained: bool = False) -> dict[str, Any]:
        spec = self.verbs.get(verb)
        if spec is None:
            raise CommandError(Code.UNKNOWN_VERB, f"unknown verb {verb!r}; known: {', '.join(sorted(self.verbs))}")
        if retained and not spec.idempotent:
            raise CommandError(Code.RETAINED_IGNORED, f"a retained {verb!r} is not acted on (it is not idempotent)")
        doc = parse_payload(payload, spec.max_bytes)
        if EXPIRES_AT in doc:
            check_not_expired(doc.pop(EXPIRES_AT), self._wall())
        try:
            args = spec.args.model_validate(doc)
        except ValidationError as exc:
            problems = "; ".join(
                ".".join(str(p) for p in e["loc"]) + ": " + ("unknown field" if e["type"] == "extra_forbidden"
                                                             else e["msg"])
                for e in exc.errors()
            )  # fmt: skip
            raise CommandError(Code.INVALID_ARGUMENTS, problems or "invalid arguments") from exc
        return spec.handler(args)

    def _answer(self, msg: MQTTMessage, verb: str, result: dict[str, Any] | None = None,
                error: CommandError | None = None) -> None:  # fmt: skip
        doc = reply_doc(verb, result, error)
        in_props = getattr(msg, "properties", None)
        topic = self._response_topic(msg)
        if topic is None or not response_topic_allowed(topic, self.root):
            topic = topics.command_reply(self.root, verb)
        props = None
        corr = getattr(in_props, "CorrelationData", None) if in_props is not None else None
        if corr is not None:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.CorrelationData = corr
        try:
            self._reply(topic, json.dumps(doc).encode(), props)
        except Exception:  # a reply that cannot be sent must not take the command thread down
            logger.exception("command %s: cannot send the reply", verb)
