"""``edged fleet``: every device under a topic prefix in one table, read from the broker's retained messages.

What is read (nothing but the broker is involved, and nothing is published but the fence):

    <prefix>/+/status        edged.status/1: online / offline (the last will) / stopped, edged's version, groups
    <prefix>/+/model/state   edged.model-state/1: the model's name, active version, probation (and shadow, when
                             a device reports one)
    <prefix>/+/telemetry     edged.telemetry/1: temperatures, the governor's level, the spool's backlog, errors
    <prefix>/+/shadow        edged.shadow/1: a candidate evaluated beside the serving model (`edged push --shadow`),
                             shown in the shadow column while it runs

The wait is bounded by the fence `edged push` uses for discovery (deploy/rollout/pusher.py): once
subscribed, the reader publishes on ``<prefix>/_push/<id>/sync`` and has every retained message of its
subscriptions when its own message comes back, since a broker delivers one subscriber's messages in order.
Without the fence (an ACL that refuses it) it reads for `wait_s` and says so.

When a device went offline: a retained message carries no time, but one published with an MQTT v5
Message Expiry Interval reaches a subscriber with the interval *left*; a status published with
`topics.STATUS_EXPIRY_S` (the daemon's last will does) was therefore published ``STATUS_EXPIRY_S - left``
seconds ago (to the second: the broker counts whole seconds). A status without it shows the device's own
``since`` (its connect time) for an online device and nothing for an offline one.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edged.errors import PublishError
from edged.protocol import topics
from edged.protocol.client import MqttSettings, make_client

FENCE = b"fence"
COLUMNS = (
    "device",
    "state",
    "since",
    "edged",
    "model",
    "probation",
    "shadow",
    "temp_c",
    "throttle",
    "spool_rows",
    "last_error",
)
SUBSCRIPTIONS = ("status", topics.MODEL_STATE, topics.TELEMETRY, topics.SHADOW)


@dataclass
class Row:
    """One device's line. `since`: ISO-8601 UTC, when the state began as far as the broker tells (see the
    module docstring); `model`: ``name@version``; `probation`: ``v<version> <elapsed>/<needs> s`` while on
    probation; `shadow`: what the device reports of a shadow model (None: nothing reports it);
    `throttle`: the governor's level, with the frame-rate factor when below 1."""

    device: str
    state: str = "unknown"
    since: str | None = None
    edged: str | None = None
    model: str | None = None
    probation: str | None = None
    shadow: str | None = None
    temp_c: float | None = None
    throttle: str | None = None
    spool_rows: int | None = None
    last_error: str | None = None
    groups: list[str] = field(default_factory=list)
    telemetry_ts: str | None = None


@dataclass
class Seen:
    """What the reader gathered: per device, the newest document of each kind, and when a status with an
    expiry interval was published (epoch seconds)."""

    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    published_at: dict[str, float] = field(default_factory=dict)
    model_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    telemetry: dict[str, dict[str, Any]] = field(default_factory=dict)
    shadows: dict[str, dict[str, Any]] = field(default_factory=dict)  # the newest shadow report
    unreadable: int = 0  # payloads that were not a JSON object


class FleetReader:
    """Subscribe, fence, collect: `read()` returns what the broker holds for every device under the prefix."""

    def __init__(self, cfg: MqttSettings, out: TextIO = sys.stderr) -> None:
        self.cfg = cfg
        self.prefix = cfg.topic_prefix
        self.out = out
        self.sync = topics.push_sync(self.prefix, f"fleet-{uuid.uuid4().hex[:12]}")
        self.seen = Seen()
        self._lock = threading.Lock()
        self._fenced = threading.Event()
        self._connected = threading.Event()
        self._acked = threading.Event()
        self._refused: list[str] = []
        self.client = make_client(cfg, f"edged-fleet-{uuid.uuid4().hex[:10]}")
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    def read(self, wait_s: float = 10.0) -> tuple[Seen, bool]:
        """Everything retained under the prefix; (what was seen, whether the fence came back)."""
        try:
            self.client.connect(self.cfg.host, self.cfg.port, keepalive=30)
        except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise PublishError(f"cannot reach the broker at {self.cfg.host}:{self.cfg.port}: {exc}") from exc
        self.client.loop_start()
        try:
            if not self._connected.wait(wait_s):
                raise PublishError(f"the broker at {self.cfg.host}:{self.cfg.port} did not accept us in {wait_s:g} s")
            if not self._acked.wait(wait_s):
                raise PublishError(f"the broker did not confirm our subscriptions in {wait_s:g} s")
            if self._refused:
                raise PublishError(
                    f"the broker refused our subscription ({', '.join(self._refused)}): check its ACL for this user"
                )
            self.client.publish(self.sync, FENCE, qos=1)
            fenced = self._fenced.wait(wait_s)
            if not fenced:
                print(
                    f"fleet: the fence did not come back in {wait_s:g} s; the table holds what arrived", file=self.out
                )
        finally:
            self.client.disconnect()
            self.client.loop_stop()
        with self._lock:
            return self.seen, fenced

    def _on_connect(self, c: mqtt.Client, u: Any, f: Any, rc: ReasonCode, p: Properties | None) -> None:
        if rc.is_failure:
            return
        filters = [(f"{self.prefix}/+/{suffix}", 1) for suffix in SUBSCRIPTIONS] + [(self.sync, 1)]
        c.subscribe(filters)
        self._connected.set()

    def _on_subscribe(self, c: mqtt.Client, u: Any, mid: int, codes: list[ReasonCode], p: Any) -> None:
        self._refused.extend(str(code) for code in codes if code.is_failure)
        self._acked.set()

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == self.sync:
            self._fenced.set()
            return
        device, suffix = topics.split(self.prefix, msg.topic)
        if not msg.payload:  # a cleared retained message
            return
        try:
            doc = json.loads(msg.payload)
        except ValueError:
            doc = None
        with self._lock:
            if not isinstance(doc, dict):
                self.seen.unreadable += 1
                return
            if suffix == topics.STATUS:
                self.seen.statuses[device] = doc
                left = getattr(msg.properties, "MessageExpiryInterval", None)
                if isinstance(left, int) and 0 <= left <= topics.STATUS_EXPIRY_S:
                    self.seen.published_at[device] = time.time() - (topics.STATUS_EXPIRY_S - left)
                else:
                    self.seen.published_at.pop(device, None)
            elif suffix == topics.MODEL_STATE:
                self.seen.model_states[device] = doc
            elif suffix == topics.TELEMETRY:
                self.seen.telemetry[device] = doc
            elif suffix == topics.SHADOW:
                self.seen.shadows[device] = doc


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def rows(seen: Seen) -> list[Row]:
    """One `Row` per device seen (any of the three documents), sorted by device id."""
    devices = sorted(set(seen.statuses) | set(seen.model_states) | set(seen.telemetry))
    return [_row(d, seen) for d in devices]


def _row(device: str, seen: Seen) -> Row:
    st = seen.statuses.get(device, {})
    ms = seen.model_states.get(device, {})
    tel = seen.telemetry.get(device, {})
    r = Row(device, state=str(st.get("state", "unknown")), edged=_str(st.get("version")))
    r.groups = [str(g) for g in st.get("groups") or [] if isinstance(g, str)]
    if device in seen.published_at:
        r.since = iso(seen.published_at[device])
    elif r.state == "online":
        r.since = _str(st.get("since"))
    model = st.get("model") if isinstance(st.get("model"), dict) else None
    if ms.get("name") is not None and ms.get("active") is not None:
        r.model = f"{ms['name']}@{ms['active']}"
    elif model is not None:
        r.model = f"{model.get('name')}@{model.get('version')}"
    else:
        r.model = _str((tel.get("inference") or {}).get("model"))
    prob = ms.get("probation")
    if isinstance(prob, dict):
        r.probation = f"v{prob.get('version')} {_num(prob.get('elapsed_s'))}/{_num(prob.get('needs_s'))} s"
    shadow = ms.get("shadow", st.get("shadow"))
    if shadow is not None:
        r.shadow = shadow if isinstance(shadow, str) else json.dumps(shadow, separators=(",", ":"))
    elif (seen.shadows.get(device) or {}).get("state") == "running":  # an evaluation under way (a finished
        r.shadow = _shadow_cell(seen.shadows[device])  # one's verdict is the push's and the model state's)
    r.telemetry_ts = _str(tel.get("ts"))
    temps = ((tel.get("sensors") or {}).get("temps_c") or {}).values()
    numbers = [float(t) for t in temps if isinstance(t, (int, float))]
    r.temp_c = max(numbers) if numbers else None
    gov = tel.get("governor") or {}
    if gov:
        scale = gov.get("fps_scale")
        r.throttle = str(gov.get("level")) + (f" x{scale:g}" if isinstance(scale, (int, float)) and scale < 1 else "")
        if gov.get("paused"):
            r.throttle += " paused"
    spool = (tel.get("mqtt") or {}).get("spool_rows")
    r.spool_rows = spool if isinstance(spool, int) else None
    r.last_error = _last_error(st, ms, tel)
    return r


def _shadow_cell(doc: dict[str, Any]) -> str:
    """``faces@4 120 frames agreement 0.97``: the candidate of a running shadow report and how far it got."""
    cand = doc.get("candidate") or {}
    totals = doc.get("totals") or {}
    cell = f"{cand.get('name')}@{cand.get('version')} {_num(totals.get('frames'))} frames"
    agreement = totals.get("agreement")
    return cell + (f" agreement {agreement:.2f}" if isinstance(agreement, (int, float)) else "")


def _last_error(st: dict[str, Any], ms: dict[str, Any], tel: dict[str, Any]) -> str | None:
    """The most telling error a device reports: a refused subscription, a failing spool, the model's last
    rollback or failure, the broker session's last error, a camera's."""
    refused = st.get("refused_subscriptions") or []
    if refused and isinstance(refused[0], dict):
        return f"subscription refused: {refused[0].get('topic')} ({refused[0].get('reason')})"
    if st.get("spool") == "failing" or (tel.get("mqtt") or {}).get("spool_state") == "failing":
        return "spool failing"
    last = ms.get("last")
    if isinstance(last, dict) and any(w in str(last.get("type")) for w in ("rollback", "rolled_back", "fail")):
        why = last.get("reason") or last.get("message") or last.get("code") or ""
        return f"model {last.get('type')}" + (f": {why}" if why else "")
    mqtt_error = (tel.get("mqtt") or {}).get("last_error")
    if mqtt_error:
        return f"mqtt: {mqtt_error}"
    for name, cam in sorted((tel.get("cameras") or {}).items()):
        if isinstance(cam, dict) and cam.get("last_error"):
            return f"camera {name}: {cam['last_error']}"
    return None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _num(v: Any) -> str:
    return f"{v:.0f}" if isinstance(v, (int, float)) else "?"


def select(
    table: Iterable[Row],
    offline: bool = False,
    version: str | None = None,
    group: str | None = None,
    error: bool = False,
) -> list[Row]:
    """The rows the filters keep. `offline`: not online; `version`: the model's ``name@v`` or ``v``, or
    edged's own version; `group`: its status lists the group; `error`: it reports an error."""
    out = []
    for r in table:
        if offline and r.state == "online":
            continue
        if version is not None and version not in (r.model, r.edged, (r.model or "").rpartition("@")[2]):
            continue
        if group is not None and group not in r.groups:
            continue
        if error and not r.last_error:
            continue
        out.append(r)
    return out


def shown_columns(table: list[Row]) -> list[str]:
    """The columns to print: `shadow` only when a device reports one."""
    return [c for c in COLUMNS if c != "shadow" or any(r.shadow is not None for r in table)]


def render(table: list[Row], fmt: str) -> str:
    """The table as ``table`` (aligned text), ``json`` (a list of objects, every field) or ``csv``."""
    if fmt == "json":
        return json.dumps([asdict(r) for r in table], indent=1)
    cols = shown_columns(table)
    cells = [[_cell(getattr(r, c)) for c in cols] for r in table]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(cells)
        return buf.getvalue().rstrip("\n")
    if fmt != "table":
        raise ValueError(f"format {fmt!r}: table, json or csv")
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    widths[-1] = 0  # the last column (the error) is not padded
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
