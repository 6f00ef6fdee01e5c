"""The asker behind ``edged diagnose DEVICE``: the ``diagnose`` command, its parts, the document printed.

The first ask (``{"lines": N}``) makes the device build its document and answer part 0; each further part is
asked by the document's id (``{"id": …, "part": k}``) and the parts are joined and checked against their
SHA-256 (`edged.protocol.commands.join_parts`). Replies come to a response topic under the device's own
``…/reply/`` (what the shipped ACL lets a device write), with correlation data; each command carries a
Message Expiry Interval, so none is run late. Nothing of the device runtime is loaded.
"""

from __future__ import annotations

import json
import queue
import sys
import time
import uuid
from typing import Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.errors import CommandError, PublishError
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client
from edged.protocol.commands import DIAGNOSE_VERB, join_parts


def ask(
    cfg: MqttSettings, device: str, lines: int, timeout_s: float = 60.0, part_chars: int | None = None
) -> dict[str, Any]:
    """The device's diagnostics document (edged.diagnose/1), every part asked for and joined."""
    root = topics.device_root(cfg.topic_prefix, device)
    reply_topic = f"{root}/reply/diagnose-{uuid.uuid4().hex[:12]}"
    inbox: queue.Queue[tuple[bytes, bytes]] = queue.Queue()
    subscribed: queue.Queue[list[ReasonCode]] = queue.Queue()
    client = make_client(cfg, f"edged-diagnose-{uuid.uuid4().hex[:10]}")

    def on_connect(c: mqtt.Client, u: Any, f: Any, rc: ReasonCode, p: Properties | None) -> None:
        if not rc.is_failure:
            c.subscribe(reply_topic, qos=1)

    client.on_connect = on_connect
    client.on_subscribe = lambda c, u, mid, codes, p: subscribed.put(codes)
    client.on_message = lambda c, u, msg: inbox.put(
        (bytes(getattr(msg.properties, "CorrelationData", b"") or b""), bytes(msg.payload))
    )
    try:
        client.connect(cfg.host, cfg.port, keepalive=30)
    except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
        raise PublishError(f"cannot reach the broker at {cfg.host}:{cfg.port}: {exc}") from exc
    client.loop_start()
    try:
        try:
            codes = subscribed.get(timeout=timeout_s)
        except queue.Empty:
            raise PublishError(f"the broker at {cfg.host}:{cfg.port} did not take our subscription") from None
        if any(c.is_failure for c in codes):
            raise PublishError(f"the broker refused our subscription to {reply_topic}: check its ACL for this user")
        asked: dict[str, Any] = {"lines": lines} | ({"part_chars": part_chars} if part_chars else {})
        first = _command(client, root, reply_topic, inbox, asked, timeout_s, device)
        results = [first]
        for k in range(1, int(first["parts"])):
            results.append(
                _command(client, root, reply_topic, inbox, {"id": first["id"], "part": k}, timeout_s, device)
            )
        return join_parts(results)
    finally:
        client.disconnect()
        client.loop_stop()


def _command(
    client: mqtt.Client,
    root: str,
    reply_topic: str,
    inbox: queue.Queue[tuple[bytes, bytes]],
    args: dict[str, Any],
    timeout_s: float,
    device: str,
) -> dict[str, Any]:
    """Send one diagnose command and wait for its reply (matched by correlation data); its result."""
    corr = uuid.uuid4().hex.encode()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = reply_topic
    props.CorrelationData = corr
    props.MessageExpiryInterval = max(1, int(timeout_s))
    client.publish(topics.command(root, DIAGNOSE_VERB), json.dumps(args).encode(), qos=1, properties=props)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            got, payload = inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        if got != corr:  # a redelivered reply to an earlier part
            continue
        doc = json.loads(payload)
        if not doc.get("ok"):
            err = doc.get("error") or {}
            raise CommandError(str(err.get("code", "failed")), f"{device}: diagnose: {err.get('message')}")
        result: dict[str, Any] = doc["result"]
        return result
    raise PublishError(
        f"{device}: no reply to diagnose {args} in {timeout_s:g} s (is it online? `edged fleet` says; is this "
        "the backend's identity? the shipped ACL lets only the backend send commands)"
    )


def show(doc: dict[str, Any], as_json: bool = False, out: TextIO = sys.stdout) -> None:
    """The document as JSON, or as a report: the doctor's lines, model, spool, config, logs."""
    if as_json:
        print(json.dumps(doc, indent=2), file=out)
        return
    print(
        f"diagnose {doc.get('device')}: edged {doc.get('version')}, up {doc.get('uptime_s')} s, boot "
        f"{str(doc.get('boot_id'))[:8]}, at {doc.get('ts')}",
        file=out,
    )
    doctor = doc.get("doctor") or {}
    print(f"\ndoctor ({'ok' if doctor.get('ok') else 'a check failed'}, {doctor.get('took_s')} s):", file=out)
    for c in doctor.get("checks") or []:
        status = {"fail": "FAIL"}.get(c.get("status"), c.get("status"))
        fix = f"  (fix: {c['fix']})" if c.get("fix") and c.get("status") != "ok" else ""
        print(f"  {status:<4} {c.get('name'):<10} {c.get('detail')}{fix}", file=out)
    store = doc.get("store") or {}
    st = store.get("state") or {}
    prob = st.get("probation")
    print(f"\nmodel: {store.get('package')}" + (f", on probation ({prob})" if prob else ""), file=out)
    spool = doc.get("spool") or {}
    print(
        f"spool: {spool.get('spool_rows')} rows, {spool.get('spool_state')}, file {spool.get('file_bytes')} bytes; "
        f"broker {'connected' if spool.get('connected') else 'not connected'}"
        + (f", last error: {spool['last_error']}" if spool.get("last_error") else ""),
        file=out,
    )
    print("\nconfig (in force, secrets removed):", file=out)
    print("  " + json.dumps(doc.get("config"), indent=2).replace("\n", "\n  "), file=out)
    logs = doc.get("logs") or {}
    lines = logs.get("lines") or []
    print(f"\nlog (the newest {len(lines)} of {logs.get('seen')} lines since the start):", file=out)
    for line in lines:
        print(f"  {line}", file=out)
