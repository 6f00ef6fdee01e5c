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
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
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

logger = logging.getLogger(__name__)

MAX_COMMAND_BYTES = 16 * 1024
MAX_DEPTH = 16
REPLY_SCHEMA = "edged.reply/1"
_PUSH_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
EXPIRES_AT = "expires_at"  # the payload's own expiry, for senders without MQTT v5; not part of any verb's schema


class CommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Handler = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Verb:
    args: type[BaseModel]
    handler: Handler
    idempotent: bool
    max_bytes: int = MAX_COMMAND_BYTES


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CommandError("duplicate_key", f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise CommandError("not_a_number", f"{name} is not allowed")


def _depth(value: Any, limit: int) -> None:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            raise CommandError("too_deep", f"nested more than {limit} levels")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)


def parse_payload(payload: bytes, cap: int = MAX_COMMAND_BYTES) -> dict[str, Any]:
    """Strictly parse a command payload into a JSON object; raise CommandError(code, message)."""
    if len(payload) > cap:
        raise CommandError("too_large", f"{len(payload)} bytes, over the {cap} byte cap")
    if not payload:  # what clearing a retained message delivers: never a command
        raise CommandError("empty", "an empty payload is not a command; send {} for no arguments")
    try:
        text = payload.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise CommandError("not_utf8", f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except RecursionError as exc:
        raise CommandError("too_deep", f"nested more than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise CommandError("invalid_json", f"not valid JSON: {exc}") from exc
    _depth(doc, MAX_DEPTH)
    if not isinstance(doc, dict):
        raise CommandError("not_an_object", f"the payload must be a JSON object, not {type(doc).__name__}")
    return doc


def parse_expires_at(value: Any) -> datetime:
    """`expires_at` as an aware UTC datetime; ISO-8601 with its offset (``Z`` or ``+00:00``), never naive."""
    if not isinstance(value, str) or len(value) > 64:
        raise CommandError("invalid_arguments", f"{EXPIRES_AT}: an ISO-8601 string, e.g. 2026-11-30T14:00:00Z")
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError("invalid_arguments", f"{EXPIRES_AT}: {value!r} is not an ISO-8601 timestamp") from exc
    if when.tzinfo is None or when.utcoffset() is None:
        raise CommandError(
            "invalid_arguments", f"{EXPIRES_AT}: {value!r} has no UTC offset (write 2026-11-30T14:00:00Z)"
        )
    return when.astimezone(timezone.utc)


def check_not_expired(expires_at: Any, now: datetime) -> None:
    """Raise CommandError('expired') when the payload's `expires_at` is not after `now` (aware, UTC)."""
    when = parse_expires_at(expires_at)
    if when <= now:
        late = (now - when).total_seconds()
        raise CommandError(
            "expired",
            f"the command expired at {when.isoformat().replace('+00:00', 'Z')} ({late:.1f} s ago by this device's "
            "clock); it was not run",
        )


def response_topic_allowed(topic: str, root: str) -> bool:
    """Whether a device whose topics are under `root` (``<prefix>/<device>``) may reply on `topic`."""
    if not topic or len(topic.encode()) > 1024 or any(c in topic for c in "+#\x00") or topic.startswith("$"):
        return False
    if topic.startswith(root + "/reply/") and "//" not in topic:
        return True
    prefix = root.rpartition("/")[0]
    head, _, rest = topic.partition(prefix + "/_push/")
    token, _, tail = rest.partition("/")
    return head == "" and tail == "reply" and _PUSH_ID.fullmatch(token) is not None


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
            self._answer(msg, self._verb_of(msg.topic), error=CommandError("busy", "too many commands waiting"))

    def _verb_of(self, topic: str) -> str:
        prefix = self.root + "/cmd/"
        return topic[len(prefix) :] if topic.startswith(prefix) else ""

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
                self._answer(msg, verb, error=CommandError("failed", f"{type(exc).__name__}: {exc}"))

    def _check_response_topic(self, msg: MQTTMessage) -> None:
        topic = self._response_topic(msg)
        if topic is not None and not response_topic_allowed(topic, self.root):
            raise CommandError(
                "bad_response_topic",
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
                "expired",
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
            raise CommandError("unknown_verb", f"unknown verb {verb!r}; known: {', '.join(sorted(self.verbs))}")
        if retained and not spec.idempotent:
            raise CommandError("retained_ignored", f"a retained {verb!r} is not acted on (it is not idempotent)")
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
            raise CommandError("invalid_arguments", problems or "invalid arguments") from exc
        return spec.handler(args)

    def _answer(self, msg: MQTTMessage, verb: str, result: dict[str, Any] | None = None,
                error: CommandError | None = None) -> None:  # fmt: skip
        doc: dict[str, Any] = {"schema": REPLY_SCHEMA, "verb": verb, "ok": error is None}
        if error is None:
            doc["result"] = result or {}
        else:
            doc["error"] = {"code": error.code, "message": str(error)[:500]}
        in_props = getattr(msg, "properties", None)
        topic = self._response_topic(msg)
        if topic is None or not response_topic_allowed(topic, self.root):
            topic = f"{self.root}/cmd/{verb or 'unknown'}/reply"
        props = None
        corr = getattr(in_props, "CorrelationData", None) if in_props is not None else None
        if corr is not None:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.CorrelationData = corr
        try:
            self._reply(topic, json.dumps(doc).encode(), props)
        except Exception:  # a reply that cannot be sent must not take the command thread down
            logger.exception("command %s: cannot send the reply", verb)
