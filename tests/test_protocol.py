"""The wire contract (edged.protocol) against what a real daemon puts on a real broker, and the OTA framing.

(a) One real daemon run on mosquitto: every message a subscriber sees (status, results, telemetry, events,
    the model state, a command's replies) validates against the JSON Schema shipped for it, and every topic
    is one the topic builders produce.
(b) OTA framing: offer, chunk request and chunk build and parse back; bad frames are refused with their code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import jsonschema
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from edged.errors import Code, CommandError, ProtocolError
from edged.models.demo import DemoAssets
from edged.protocol import (
    EVENT_SCHEMA,
    MODEL_STATE_SCHEMA,
    OTA_SCHEMA,
    REPLY_SCHEMA,
    RESULT_SCHEMA,
    STATUS_SCHEMA,
    TELEMETRY_SCHEMA,
    OtaState,
    schema,
    topics,
)
from edged.protocol.commands import parse_payload, reply_doc
from edged.protocol.ota import (
    ChunkRequest,
    ModelRef,
    OfferArgs,
    chunk,
    chunk_key,
    offer_args,
    offer_payload,
    pack_chunk,
    status_doc,
    unpack_chunk,
)
from edged.protocol.schemas import FILES, OTA_CHUNK_HEADER_SCHEMA, OTA_OFFER_SCHEMA, OTA_REQUEST_SCHEMA

from .conftest import base_config, free_port, wait_until, write_config


def _validate(doc: object, schema_id: str) -> None:
    jsonschema.Draft202012Validator(schema(schema_id)).validate(doc)


def test_every_shipped_schema_is_valid_and_names_its_id() -> None:
    for schema_id, name in FILES.items():
        doc = schema(schema_id)
        jsonschema.Draft202012Validator.check_schema(doc)
        assert doc["$id"] == schema_id, name


def _on(sub, topic: str) -> list[dict[str, Any]]:
    with sub.lock:
        return [m.json() for m in sub.messages if m.topic == topic]


def test_a_real_daemon_run_speaks_the_contract(
    broker, subscribe, start_daemon, demo: DemoAssets, tmp_path: Path
) -> None:
    """Results, status, telemetry, an event, the model state and command replies, as a subscriber sees them."""
    sub = subscribe(broker, "edged/#")
    cams = [{"name": "lobby", "uri": "synthetic://?fps=15"}]
    # a memory soft limit far below the daemon's RSS: the governor sheds load and says so on …/events
    doc = base_config(
        broker, demo, tmp_path, cams, memory={"budget_mb": 1000, "soft_limit_pct": 5, "hard_limit_pct": 99}
    )
    d = start_daemon(write_config(tmp_path / "c.yaml", doc))
    root = topics.device_root("edged", "test-01")
    wait_until(
        lambda: (
            len(sub.results()) >= 5 and bool(_on(sub, topics.telemetry(root))) and bool(_on(sub, topics.events(root)))
        ),
        90,
        "results, telemetry and an event",
    )

    replies: list[mqtt.MQTTMessage] = []
    cmd = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"cmd-{free_port()}", protocol=mqtt.MQTTv5)
    cmd.on_message = lambda c, u, msg: replies.append(msg)
    cmd.connect(broker.host, broker.port)
    cmd.loop_start()
    try:
        cmd.subscribe(topics.command_reply(root, "status"), qos=1)
        cmd.subscribe(topics.command_reply(root, "nope"), qos=1)
        wait_until(lambda: _on(sub, topics.status(root)) != [], 10, "the status")
        cmd.publish(topics.command(root, "status"), b"{}", qos=1).wait_for_publish(10)
        cmd.publish(topics.command(root, "nope"), b"{}", qos=1).wait_for_publish(10)
        wait_until(lambda: len(replies) >= 2, 30, "two replies")
    finally:
        cmd.disconnect()
        cmd.loop_stop()
    assert d.stop() == 0, d.output()[-3000:]
    wait_until(lambda: any(s["state"] == "stopped" for s in _on(sub, topics.status(root))), 10, "stopped status")

    by_topic = {
        topics.status(root): STATUS_SCHEMA,
        topics.results(root, "lobby"): RESULT_SCHEMA,
        topics.telemetry(root): TELEMETRY_SCHEMA,
        topics.events(root): EVENT_SCHEMA,
        topics.model_state(root): MODEL_STATE_SCHEMA,
        topics.command(root, "status"): None,  # the commands we sent: the verb's own arguments
        topics.command(root, "nope"): None,
        topics.command_reply(root, "status"): REPLY_SCHEMA,
        topics.command_reply(root, "nope"): REPLY_SCHEMA,
    }
    seen: dict[str, int] = {}
    for m in sub.messages:
        assert m.topic in by_topic, f"{m.topic}: not a topic the builders produce"
        schema_id = by_topic[m.topic]
        if schema_id is not None:
            _validate(m.json(), schema_id)
            seen[schema_id] = seen.get(schema_id, 0) + 1
    assert set(seen) == {STATUS_SCHEMA, RESULT_SCHEMA, TELEMETRY_SCHEMA, EVENT_SCHEMA, MODEL_STATE_SCHEMA, REPLY_SCHEMA}
    assert {s["state"] for s in _on(sub, topics.status(root))} >= {"online", "stopped"}
    assert any(e["type"] == "memory" for e in _on(sub, topics.events(root)))

    docs = {msg.topic: json.loads(msg.payload) for msg in replies}
    for doc in docs.values():
        _validate(doc, REPLY_SCHEMA)
    assert docs[topics.command_reply(root, "status")]["ok"] is True
    refused = docs[topics.command_reply(root, "nope")]
    assert refused["ok"] is False and refused["error"]["code"] == Code.UNKNOWN_VERB
    assert Code(refused["error"]["code"]) is Code.UNKNOWN_VERB  # every code on the wire is a member


def test_reply_documents_validate_and_carry_bare_codes() -> None:
    ok = reply_doc("pause", {"paused": True})
    bad = reply_doc("snapshot", error=CommandError(Code.RATE_LIMITED, "too soon"))
    for doc in (ok, bad):
        _validate(json.loads(json.dumps(doc)), REPLY_SCHEMA)
    assert json.dumps(bad["error"]) == '{"code": "rate_limited", "message": "too soon"}'
    with pytest.raises(CommandError) as exc:
        parse_payload(b'{"a": 1, "a": 2}')
    assert exc.value.code is Code.DUPLICATE_KEY


def test_the_ota_offer_round_trips() -> None:
    args = offer_args("t-1", b'{"schema": "edged.manifest/1"}', b'{"alg": "ed25519"}')
    payload = offer_payload(args)
    doc = json.loads(payload)
    _validate(doc, OTA_OFFER_SCHEMA)
    back = OfferArgs.model_validate(doc)
    assert back == args and back.decode() == (b'{"schema": "edged.manifest/1"}', b'{"alg": "ed25519"}')


def test_the_cancel_arguments_match_their_schema() -> None:
    from edged.protocol.ota import CancelArgs, cancel_payload
    from edged.protocol.schemas import OTA_CANCEL_SCHEMA

    for transfer in (None, "t-1"):
        doc = json.loads(cancel_payload(transfer))
        _validate(doc, OTA_CANCEL_SCHEMA)
        assert CancelArgs.model_validate(doc).transfer == transfer
    for bad in ({"transfer": "no spaces"}, {"transfer": ""}, {"id": "t-1"}):
        with pytest.raises(ValidationError):
            CancelArgs.model_validate(bad)
        with pytest.raises(jsonschema.ValidationError):
            _validate(bad, OTA_CANCEL_SCHEMA)


def test_an_offer_that_is_not_base64_is_refused_with_its_code() -> None:
    with pytest.raises(CommandError) as exc:
        OfferArgs(transfer="t-1", manifest="not base64!", sig="").decode()
    assert exc.value.code is Code.INVALID_ARGUMENTS


def test_a_chunk_request_and_its_chunk_round_trip() -> None:
    req = ChunkRequest(transfer="t-1", file="model.onnx", offset=4096, length=3)
    doc = json.loads(req.payload())
    _validate(doc, OTA_REQUEST_SCHEMA)
    assert ChunkRequest.model_validate(doc) == req
    payload = chunk(req.transfer, req.file, req.offset, b"abc")
    key, start = chunk_key(payload)
    assert key == ("t-1", "model.onnx", 4096) and payload[start:] == b"abc"
    header, data = unpack_chunk(payload)
    _validate(header, OTA_CHUNK_HEADER_SCHEMA)
    assert data == b"abc" and pack_chunk(header, data) == payload


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00",
        struct.pack(">H", 5) + b"notjs",
        struct.pack(">H", 2) + b"[]",
        struct.pack(">H", 30) + b'{"transfer": "t", "file": "f"}',
        struct.pack(">H", 44) + b'{"transfer": "t", "file": "f", "offset": -1}',
        struct.pack(">H", 46) + b'{"transfer": "t", "file": "f", "offset": true}',
        struct.pack(">H", 45) + b'{"transfer": "t", "file": "f", "offset": NaN}',
    ],
    ids=["empty", "short", "not-json", "not-an-object", "no-offset", "negative", "bool", "nan"],
)
def test_a_bad_chunk_frame_is_refused_as_malformed(payload: bytes) -> None:
    with pytest.raises(ProtocolError) as exc:
        chunk_key(payload)
    assert exc.value.code is Code.MALFORMED


def test_ota_status_documents_validate_in_every_state() -> None:
    for state in OtaState:
        doc = status_doc("t-1", state, model=ModelRef("faces", 7), done=10, total=20, by="t-2")
        _validate(json.loads(json.dumps(doc)), OTA_SCHEMA)
        assert json.loads(json.dumps(doc))["state"] == state.value
    failed = status_doc("t-1", OtaState.FAILED, error=CommandError(Code.STALLED, "no data"))
    _validate(json.loads(json.dumps(failed)), OTA_SCHEMA)


def test_topic_builders_match_the_documented_layout() -> None:
    root = topics.device_root("edged", "orin-07")
    assert root == "edged/orin-07"
    assert topics.results(root, "dock") == "edged/orin-07/results/dock"
    assert topics.command_reply(root, "") == "edged/orin-07/cmd/unknown/reply"
    assert topics.verb_of(root, topics.command(root, "pause")) == "pause"
    assert topics.split("edged", topics.ota_request(root)) == ("orin-07", "ota/req")
    assert topics.push_reply(root, "abc") == "edged/orin-07/reply/_push/abc"
    assert topics.push_replies("edged", "abc") == "edged/+/reply/_push/abc"
    assert topics.response_topic_allowed(topics.push_reply(root, "abc"), root)
    assert not topics.response_topic_allowed(topics.push_reply("edged/orin-08", "abc"), root)
    assert not topics.response_topic_allowed(topics.status("edged/orin-08"), root)


def test_every_code_the_product_writes_as_a_string_is_a_member() -> None:
    """A code written as a plain string (`code="..."`) is converted by `Code(...)` when the error is made:
    one that is not a member would raise ValueError at that moment, in place of the error it meant."""
    import re

    from edged.errors import Code
    from tests.conftest import REPO

    members = {c.value for c in Code}
    unknown = []
    for folder in ("daemon", "models", "quantize", "deploy", "cli", "protocol", "edged"):
        for py in sorted((REPO / folder).rglob("*.py")):
            for m in re.finditer(r'code\s*=\s*"([a-z_]+)"|else "([a-z_]+)"', py.read_text()):
                value = m.group(1) or m.group(2)
                if value not in members and m.group(1):
                    unknown.append(f"{py.relative_to(REPO)}: {value}")
    assert not unknown, unknown
