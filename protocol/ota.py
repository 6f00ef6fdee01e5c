"""Over-the-air transfer framing and states (DESIGN §6): what the pusher and the device exchange.

    pusher ── cmd/ota {transfer, manifest, sig[, urls]} ──> device the offer (`OfferArgs`, base64 fields)
    pusher ── cmd/cancel {[transfer]} ──> device                    stop the running transfer (`CancelArgs`)
    device ── ota/req {transfer, file, offset, length} ──> pusher  a chunk request (`ChunkRequest`)
    pusher ── ota/data [2-byte header length][header JSON][bytes] ──> device   a chunk (`pack_chunk`)
    device ── ota/status {schema, transfer, state, ts, …} ──> pusher            progress (`status_doc`)
    pusher ── _groups/<group>/ota {schema, group, transfer, manifest, sig} (retained) ──> every device of
              the group, those offline included when they connect again (`GroupOffer`)

A chunk's header is a JSON object with ``transfer``, ``file`` and ``offset`` (its `chunk_key`); the
data follows it. Anything else on ota/data is malformed (`ProtocolError`, code ``malformed``) and is
dropped on arrival. States of a transfer are `OtaState`.

An offer with ``urls`` (file name -> one or more http(s) URLs, tried in order) has the device download
each file over HTTP(S) from a web server, CDN or S3-compatible store instead of asking for chunks; the
sizes and sha256s are the signed manifest's, so a URL, which is not signed, can make a download fail but
never make the device take bytes the manifest does not name.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import time
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from edged.errors import Code, CommandError, EdgedError, ProtocolError

from .commands import MAX_MESSAGE_CHARS
from .schemas import GROUP_OFFER_SCHEMA, OTA_SCHEMA
from .shadow import ShadowAsk

MAX_OFFER_BYTES = 512 * 1024  # a base64 manifest of up to 256 KiB and its signature
MAX_HEADER_BYTES = 0xFFFF  # a chunk header's length is two bytes
TRANSFER_ID = r"^[A-Za-z0-9_-]{1,64}$"
MAX_URLS_PER_FILE = 4  # mirrors of one file, tried in order
MAX_URL_CHARS = 2048
HTTP_URL = r"^https?://[^\s/]+[^\s]*$"  # http or https, a host, no whitespace

Url = Annotated[str, Field(pattern=HTTP_URL, max_length=MAX_URL_CHARS)]
FileUrls = dict[str, Annotated[list[Url], Field(min_length=1, max_length=MAX_URLS_PER_FILE)]]
GROUP_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class OtaState(str, Enum):
    """The states of a transfer on ``…/ota/status`` (and the offer's reply, for accepted and unchanged)."""

    def __str__(self) -> str:
        return str(self.value)

    ACCEPTED = "accepted"  # the offer passed every manifest check; chunks are asked for next
    DOWNLOADING = "downloading"  # chunks arrive (`bytes` of `total`)
    VERIFYING = "verifying"  # every file is in: hashes are checked
    INSTALLING = "installing"  # the package is staged through the store
    PROBATION = "probation"  # swapped in, on probation (success; the model state says when it commits)
    UNCHANGED = "unchanged"  # already current: a no-op
    REJECTED = "rejected"  # a check refused it (`error`)
    FAILED = "failed"  # the transfer could not complete (`error`; what arrived is kept for a resume)
    JOINED = "joined"  # the same package was offered again: the transfer carries on under the id in `by`
    CANCELLED = "cancelled"  # stopped by the cancel command (`edged push --cancel`): its files dropped
    SHADOWING = "shadowing"  # an offer with `shadow`: the candidate runs beside the serving model (`detail.shadow`)


@dataclass(frozen=True)
class ModelRef:
    """A model's identity as every OTA message names it: ``{"name", "version"}`` on the wire, ``name@version``
    in words."""

    name: str
    version: int

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    def doc(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


class OfferArgs(BaseModel):
    """The ``cmd/ota`` arguments: base64 of the exact manifest.json bytes and of manifest.sig; `urls`, where
    the files are on a web server (every file of the manifest, else the offer is refused), or None for
    chunks over MQTT."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    transfer: str = Field(pattern=TRANSFER_ID)
    manifest: str
    sig: str
    urls: FileUrls | None = None
    shadow: ShadowAsk | None = None  # evaluate on live frames before serving (protocol/shadow.py)
    # a cascade stage's package: the configured stage it replaces (daemon/lifecycle/stage_swap.py); None: the primary
    stage: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

    def decode(self) -> tuple[bytes, bytes]:
        """(manifest bytes, signature bytes); CommandError(invalid_arguments) when either is not base64."""
        try:
            return base64.b64decode(self.manifest, validate=True), base64.b64decode(self.sig, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CommandError(Code.INVALID_ARGUMENTS, f"manifest/sig must be base64: {exc}") from exc


def offer_args(
    transfer: str,
    manifest: bytes,
    sig: bytes,
    urls: dict[str, list[str]] | None = None,
    shadow: ShadowAsk | None = None,
    stage: str | None = None,
) -> OfferArgs:
    return OfferArgs(
        transfer=transfer,
        manifest=base64.b64encode(manifest).decode(),
        sig=base64.b64encode(sig).decode(),
        urls=urls,
        shadow=shadow,
        stage=stage,
    )


def offer_payload(args: OfferArgs) -> bytes:
    """The ``cmd/ota`` payload (also what a device persists to resume a transfer)."""
    doc: dict[str, Any] = {"transfer": args.transfer, "manifest": args.manifest, "sig": args.sig}
    if args.urls is not None:
        doc["urls"] = args.urls
    if args.shadow is not None:
        doc["shadow"] = args.shadow.doc()
    if args.stage is not None:
        doc["stage"] = args.stage
    return json.dumps(doc).encode()


CANCEL_VERB = "cancel"  # the command that stops the running transfer (``…/cmd/cancel``)


class CancelArgs(BaseModel):
    """The ``cmd/cancel`` arguments: stop the transfer that runs (over MQTT or HTTP(S)), drop its files and
    publish ``cancelled``; `transfer`, when given, must name it (its id, or one it ran under before a join),
    so a stale cancel never stops a newer push."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    transfer: str | None = Field(None, pattern=TRANSFER_ID)


def cancel_payload(transfer: str | None = None) -> bytes:
    """The ``cmd/cancel`` payload."""
    return json.dumps({} if transfer is None else {"transfer": transfer}).encode()


class GroupOffer(BaseModel):
    """A group's retained offer (``<prefix>/_groups/<group>/ota``): the offer's arguments and the group.
    The manifest is signed as in every offer, so a device checks it exactly as a ``cmd/ota`` offer (older
    than what it runs, rolled back before, unsigned: refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: str = Field(alias="schema", pattern=f"^{GROUP_OFFER_SCHEMA}$")
    group: str = Field(pattern=GROUP_NAME)
    transfer: str = Field(pattern=TRANSFER_ID)
    manifest: str
    sig: str
    urls: FileUrls | None = None  # the rollout's --mirror: the files on a web server, as in a cmd/ota offer
    shadow: ShadowAsk | None = None  # the rollout's --shadow, as in a cmd/ota offer

    def args(self) -> OfferArgs:
        return OfferArgs(
            transfer=self.transfer, manifest=self.manifest, sig=self.sig, urls=self.urls, shadow=self.shadow
        )


def group_offer_payload(group: str, args: OfferArgs) -> bytes:
    """The retained ``<prefix>/_groups/<group>/ota`` payload (an ``edged.group_offer/1`` document)."""
    doc = {"schema": GROUP_OFFER_SCHEMA, "group": group, "transfer": args.transfer}
    urls = {"urls": args.urls} if args.urls is not None else {}
    shadow = {"shadow": args.shadow.doc()} if args.shadow is not None else {}
    return json.dumps({**doc, "manifest": args.manifest, "sig": args.sig, **urls, **shadow}).encode()


class ChunkRequest(BaseModel):
    """An ``ota/req`` message: the device asks for `length` bytes of `file` at `offset`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    transfer: str
    file: str
    offset: int = Field(ge=0)
    length: int = Field(gt=0)

    def payload(self) -> bytes:
        doc = {"transfer": self.transfer, "file": self.file, "offset": self.offset, "length": self.length}
        return json.dumps(doc).encode()


def pack_chunk(header: dict[str, Any], data: bytes) -> bytes:
    """An ``ota/data`` message: [2-byte big-endian header length][header JSON][data]."""
    h = json.dumps(header, separators=(",", ":")).encode()
    if len(h) > MAX_HEADER_BYTES:
        raise ValueError(f"a chunk header of {len(h)} bytes is over {MAX_HEADER_BYTES}")
    return struct.pack(">H", len(h)) + h + data


def chunk(transfer: str, file: str, offset: int, data: bytes) -> bytes:
    """The chunk answering a `ChunkRequest`."""
    return pack_chunk({"transfer": transfer, "file": file, "offset": offset}, data)


def unpack_chunk(payload: bytes) -> tuple[dict[str, Any], bytes]:
    header, start = chunk_header(payload)
    return header, payload[start:]


def _not_a_number(name: str) -> Any:
    raise ProtocolError(f"{name} in a chunk header")


def chunk_header(payload: bytes | bytearray) -> tuple[dict[str, Any], int]:
    """A chunk's header and where its data starts; the data itself is not copied. ProtocolError when malformed."""
    if len(payload) < 2:
        raise ProtocolError("short chunk")
    (n,) = struct.unpack(">H", payload[:2])
    try:
        header = json.loads(payload[2 : 2 + n], parse_constant=_not_a_number)
    except RecursionError as exc:  # a 64 KiB header can nest deeper than the parser's stack
        raise ProtocolError("chunk header nested too deep") from exc
    except ValueError as exc:  # not UTF-8, not JSON
        raise ProtocolError(f"chunk header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError("chunk header is not an object")
    return header, 2 + n


def chunk_key(payload: bytes | bytearray) -> tuple[tuple[str, str, int], int]:
    """(transfer, file, offset) of a chunk and where its data starts; ProtocolError for anything else (a
    hostile peer's header: not JSON, not an object, fields missing, an offset that is no whole number)."""
    header, start = chunk_header(payload)
    try:
        transfer, name, offset = header["transfer"], header["file"], header["offset"]
    except KeyError as exc:
        raise ProtocolError(f"chunk header without {exc}") from exc
    if not isinstance(transfer, str) or not isinstance(name, str):
        raise ProtocolError("chunk header: transfer and file must be strings")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ProtocolError(f"chunk header: offset {offset!r} is not a byte offset")
    return (transfer, name, offset), start


def status_doc(
    transfer: str,
    state: OtaState,
    model: ModelRef | None = None,
    done: int | None = None,
    total: int | None = None,
    error: EdgedError | None = None,
    detail: dict[str, Any] | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """An ``edged.ota/1`` document for ``…/ota/status`` (QoS 1, retained)."""
    doc: dict[str, Any] = {"schema": OTA_SCHEMA, "transfer": transfer, "state": state, "ts": time.time()}
    if model is not None:
        doc["model"] = model.doc()
    if done is not None:
        doc["bytes"], doc["total"] = done, total
    if error is not None:
        doc["error"] = {"code": error.code, "message": str(error)[:MAX_MESSAGE_CHARS]}
    if detail:
        doc["detail"] = detail
    if by is not None:
        doc["by"] = by  # joined: the transfer id it carries on under
    return doc
