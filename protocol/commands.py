"""The command contract: what a device takes on ``…/cmd/<verb>`` and what its reply looks like.

A command's payload is capped (16 KiB unless the verb says more), never empty (an empty publish clears
a retained message; ``{}`` means no arguments), and parsed strictly before anything acts on it: UTF-8,
a JSON object without duplicate keys, without NaN or Infinity, nested at most 16 deep. An
``"expires_at": "<ISO-8601 with a UTC offset>"`` field, for senders without MQTT v5's Message Expiry
Interval, is taken out before the verb's own schema is checked. Every refusal is a `CommandError`
whose `Code` goes into the reply:

    {"schema": "edged.reply/1", "verb": "pause", "ok": true, "result": {...}}
    {"schema": "edged.reply/1", "verb": "snapshot", "ok": false, "error": {"code": "...", "message": "..."}}
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edged.errors import Code, CommandError

from .schemas import DIAGNOSE_SCHEMA, REPLY_SCHEMA

MAX_COMMAND_BYTES = 16 * 1024
MAX_DEPTH = 16
MAX_MESSAGE_CHARS = 500  # an error message in a reply or an OTA status is cut to this
EXPIRES_AT = "expires_at"  # the payload's own expiry, for senders without MQTT v5; not part of any verb's schema


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CommandError(Code.DUPLICATE_KEY, f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise CommandError(Code.NOT_A_NUMBER, f"{name} is not allowed")


def _depth(value: Any, limit: int) -> None:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            raise CommandError(Code.TOO_DEEP, f"nested more than {limit} levels")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)


def parse_payload(payload: bytes, cap: int = MAX_COMMAND_BYTES) -> dict[str, Any]:
    """Strictly parse a command payload into a JSON object; raise CommandError(code, message)."""
    if len(payload) > cap:
        raise CommandError(Code.TOO_LARGE, f"{len(payload)} bytes, over the {cap} byte cap")
    if not payload:  # what clearing a retained message delivers: never a command
        raise CommandError(Code.EMPTY, "an empty payload is not a command; send {} for no arguments")
    try:
        text = payload.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise CommandError(Code.NOT_UTF8, f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except RecursionError as exc:
        raise CommandError(Code.TOO_DEEP, f"nested more than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise CommandError(Code.INVALID_JSON, f"not valid JSON: {exc}") from exc
    _depth(doc, MAX_DEPTH)
    if not isinstance(doc, dict):
        raise CommandError(Code.NOT_AN_OBJECT, f"the payload must be a JSON object, not {type(doc).__name__}")
    return doc


def parse_expires_at(value: Any) -> datetime:
    """`expires_at` as an aware UTC datetime; ISO-8601 with its offset (``Z`` or ``+00:00``), never naive."""
    if not isinstance(value, str) or len(value) > 64:
        raise CommandError(Code.INVALID_ARGUMENTS, f"{EXPIRES_AT}: an ISO-8601 string, e.g. 2026-11-30T14:00:00Z")
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CommandError(Code.INVALID_ARGUMENTS, f"{EXPIRES_AT}: {value!r} is not an ISO-8601 timestamp") from exc
    if when.tzinfo is None or when.utcoffset() is None:
        raise CommandError(
            Code.INVALID_ARGUMENTS, f"{EXPIRES_AT}: {value!r} has no UTC offset (write 2026-11-30T14:00:00Z)"
        )
    return when.astimezone(timezone.utc)


def check_not_expired(expires_at: Any, now: datetime) -> None:
    """Raise CommandError(Code.EXPIRED) when the payload's `expires_at` is not after `now` (aware, UTC)."""
    when = parse_expires_at(expires_at)
    if when <= now:
        late = (now - when).total_seconds()
        raise CommandError(
            Code.EXPIRED,
            f"the command expired at {when.isoformat().replace('+00:00', 'Z')} ({late:.1f} s ago by this device's "
            "clock); it was not run",
        )


def reply_doc(verb: str, result: dict[str, Any] | None = None, error: CommandError | None = None) -> dict[str, Any]:
    """An ``edged.reply/1`` document: the verb's result, or the refusal's code and message."""
    doc: dict[str, Any] = {"schema": REPLY_SCHEMA, "verb": verb, "ok": error is None}
    if error is None:
        doc["result"] = result or {}
    else:
        doc["error"] = {"code": error.code, "message": str(error)[:MAX_MESSAGE_CHARS]}
    return doc


# --- diagnose: a document larger than one message, in parts ----------------------------------------
# ``diagnose`` ({"lines": N}) builds the device's diagnostics document once, holds it, and replies with part 0;
# the asker then sends ``{"id": <id>, "part": k}`` for k = 1 … parts-1 (any order, again after a loss).
# Each part's result is ``{"id", "part", "parts", "sha256", "data"}``: `data` is the k-th slice of the
# document's JSON text (ASCII), so joining every part's `data` in part order gives the text back, whose
# SHA-256 is `sha256`. PART_CHARS keeps a reply under the message cap (protocol/client.py
# MAX_PAYLOAD_BYTES, 256 KiB) even when JSON escapes every character of a slice (``"`` → ``\\"``).
DIAGNOSE_VERB = "diagnose"
PART_CHARS = 96 * 1024
DIAGNOSE_MAX_LINES = 2000


def split_parts(text: str, part_chars: int = PART_CHARS) -> list[str]:
    """`text` in slices of at most `part_chars` characters (one empty slice for an empty text)."""
    if part_chars < 1:
        raise ValueError(f"part_chars must be >= 1, not {part_chars}")
    return [text[i : i + part_chars] for i in range(0, len(text), part_chars)] or [""]


def join_parts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The diagnostics document from every part's reply result (any order); CommandError when a part is
    missing, repeated with other data, of another document, or the text does not match its SHA-256."""
    import hashlib

    if not results:
        raise CommandError(Code.INVALID_ARGUMENTS, "no parts")
    first = results[0]
    n, ident, digest = first.get("parts"), first.get("id"), first.get("sha256")
    if not isinstance(n, int) or n < 1:
        raise CommandError(Code.INVALID_ARGUMENTS, f"a part names {n!r} parts")
    slices: dict[int, str] = {}
    for r in results:
        if (r.get("id"), r.get("parts"), r.get("sha256")) != (ident, n, digest):
            raise CommandError(Code.INVALID_ARGUMENTS, f"part {r.get('part')} is of another document")
        k, data = r.get("part"), r.get("data")
        if not isinstance(k, int) or not 0 <= k < n or not isinstance(data, str):
            raise CommandError(Code.INVALID_ARGUMENTS, f"part {k!r} of {n}: not a part")
        if slices.setdefault(k, data) != data:
            raise CommandError(Code.INVALID_ARGUMENTS, f"part {k} came twice with different data")
    missing = [k for k in range(n) if k not in slices]
    if missing:
        raise CommandError(Code.INVALID_ARGUMENTS, f"parts missing: {missing[:10]} of {n}")
    text = "".join(slices[k] for k in range(n))
    if hashlib.sha256(text.encode()).hexdigest() != digest:
        raise CommandError(Code.INVALID_ARGUMENTS, "the joined parts do not match their SHA-256")
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("schema") != DIAGNOSE_SCHEMA:
        raise CommandError(Code.INVALID_ARGUMENTS, f"not an {DIAGNOSE_SCHEMA} document")
    return doc


# --- clips: the clip store's list (daemon/record/store.py) -------------------------------------------
# ``clips`` ({"camera": C, "since": "<ISO-8601 with offset>", "limit": N}, each optional) replies with
# ``{"clips": [<edged.clip/1 sidecar>, ...], "more": bool}``, newest first; `since` keeps the clips that end
# after it. A reply is kept under CLIPS_REPLY_BYTES (fewer clips, ``"more": true``); each clip's MP4 is
# fetched from the device's local HTTP server at its ``url_path`` (``edged clips --fetch`` says how).
CLIPS_VERB = "clips"
CLIPS_MAX_LIMIT = 500
CLIPS_REPLY_BYTES = 192 * 1024


class ClipsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    camera: str | None = None
    since: str | None = Field(None, description="ISO-8601 with its UTC offset: clips that end after it")
    limit: int = Field(50, ge=1, le=CLIPS_MAX_LIMIT)

    @field_validator("since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        if v is not None:
            _iso_wall(v)
        return v

    def since_wall(self) -> float | None:
        return None if self.since is None else _iso_wall(self.since)


def _iso_wall(text: str) -> float:
    """ISO-8601 with its UTC offset (``Z`` or ``+00:00``) in seconds since the epoch; ValueError otherwise."""
    when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{text!r} has no UTC offset (write 2026-11-30T14:00:00Z)")
    return when.timestamp()
