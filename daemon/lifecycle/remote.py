"""Remote configuration, the device's side: signed documents received, checked, applied, judged, kept.

    <prefix>/<device>/config/desired, <prefix>/_groups/<group>/config (retained)
        ──> signature (model.keys_dir) ──> target, version ──> allow-list, validation (config/remote.py)
        ──> apply (Control.apply: the reload path) ──> ready within remote_config.ready_timeout_s?
              yes: kept in <state_dir>/remote-config.json, ``applied`` on …/config/state
              no:  the last good config back, ``reverted`` with the reason

One document per source (the device's own, each group's): the overlay in force is the groups' documents in
the order of `groups`, then the device's, over the file. A version at or below the source's last applied
(or cleared) one is refused (a replay), but for the very document applied, which the broker sends again at
each connect (``unchanged``, nothing published). A document refused or reverted is remembered by its digest
and not tried again when it comes again. `edged config clear` empties the documents, keeping each source's
version floor, so the retained document does not come back at the next connect.

The message arrives on paho's network thread, which only queues it; a thread of its own handles it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from paho.mqtt.client import MQTTMessage
from pydantic import ValidationError

from edged.errors import ConfigError, EdgedError
from edged.models.signing import TrustStore
from edged.models.store.files import write_atomic
from edged.protocol.config_doc import (
    CONFIG_STATE_SCHEMA,
    MAX_CONFIG_DOC_BYTES,
    SOURCE_DEVICE,
    ConfigDocument,
    ConfigEnvelope,
)
from edged.protocol.schemas import iso

from ..config import Config
from ..config.remote import load_with_overlay, merged_overlays, refusals

logger = logging.getLogger(__name__)

STATE_FILE = "remote-config.json"
STATE_SUFFIX = "config/state"  # topics.CONFIG_STATE
MAX_PENDING = 8
MAX_REMEMBERED = 32  # refused digests kept per source


class Applier(Protocol):
    def apply(self, new: Config, why: str) -> dict[str, Any]: ...


class Retainer(Protocol):
    def set_retained(self, suffix: str, doc: dict[str, Any]) -> None: ...


@dataclass
class Checked:
    source: str
    version: int
    digest: str
    overlay: dict[str, Any]
    envelope: ConfigEnvelope


class _Refused(Exception):
    """A document this device does not apply, with every reason (key paths); becomes a `refused` outcome
    on ``…/config/state`` and never leaves this module."""

    def __init__(self, reasons: list[str], source: str = "", version: int = 0, digest: str = "") -> None:
        super().__init__("; ".join(reasons))
        self.reasons, self.source, self.version, self.digest = reasons, source, version, digest


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:32]


class DocumentStore:
    """``<state_dir>/remote-config.json``: the applied documents (their envelopes, verified again at each
    read), each source's version floor, the digests refused."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.path = cfg.state_dir / STATE_FILE
        self._cache: tuple[tuple[int, int], dict[str, Checked]] | None = None

    def read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            doc = {}
        except (OSError, ValueError) as exc:
            logger.error("remote config: %s unreadable (%s); starting without its documents", self.path, exc)
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        for k in ("documents", "floor", "refused"):
            doc[k] = doc.get(k) if isinstance(doc.get(k), dict) else {}
        return doc

    def write(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode())

    def documents(self) -> dict[str, Checked]:
        """The applied documents, each checked again (signature, target); a bad one is left out and logged.
        Cached while the file is unchanged (telemetry and the status ask often; `edged config clear` writes it)."""
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp is not None and self._cache is not None and self._cache[0] == stamp:
            return dict(self._cache[1])
        out: dict[str, Checked] = {}
        for source, env in self.read()["documents"].items():
            try:
                checked = check(ConfigEnvelope.model_validate(env), self.cfg, source)
            except (_Refused, ValidationError) as exc:
                logger.error("remote config: the stored %s document is left out: %s", source, exc)
                continue
            out[source] = checked
        self._cache = (stamp, out) if stamp is not None else None
        return dict(out)

    def overlay(self) -> dict[str, Any]:
        """The overlay in force: the groups' documents in `groups` order, then the device's."""
        docs = self.documents()
        order = [f"group:{g}" for g in self.cfg.groups] + [SOURCE_DEVICE]
        return merged_overlays([docs[s].overlay for s in order if s in docs])

    def versions(self) -> dict[str, int]:
        return {s: c.version for s, c in self.documents().items()}


def check(env: ConfigEnvelope, cfg: Config, source: str | None = None) -> Checked:
    """The envelope's signature (model.keys_dir) and the document's target; `source`: the topic's."""
    raw = env.document.encode()
    try:
        TrustStore.load(cfg.model.keys_dir).verify(raw, env.sig.encode(), "config document", signed="the document")
        doc = ConfigDocument.model_validate_json(raw)
    except EdgedError as exc:
        raise _Refused([f"signature: {exc}"]) from exc
    except ValidationError as exc:
        raise _Refused([f"document: {_first(exc)}"]) from exc
    t = doc.target
    if t.device is not None and t.device != cfg.device_id:
        raise _Refused([f"target.device: {t.device!r} is not this device ({cfg.device_id})"])
    if t.group is not None and t.group not in cfg.groups:
        raise _Refused([f"target.group: {t.group!r} is not a group of this device ({', '.join(cfg.groups) or 'none'})"])
    if source is not None and t.source != source:
        raise _Refused([f"target: a {t.source} document on the {source} topic"])
    return Checked(t.source, doc.version, digest(raw), doc.overlay, env)


def _first(exc: ValidationError) -> str:
    e = exc.errors()[0]
    return f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"


class RemoteConfig:
    """The receiver. `cfg`: the config the daemon started with (identity, groups, keys, state dir);
    `config_path`: the file the overlay merges over; `current`: the config in force now; `ready`: after an
    apply, '' once every camera is up, a batch is served and the broker is connected, else why not
    (its argument: the batch count at the apply)."""

    def __init__(
        self,
        cfg: Config,
        config_path: Path,
        publisher: Retainer,
        stop: threading.Event,
        current: Callable[[], Config],
        batches: Callable[[], int],
        ready: Callable[[int], str],
    ) -> None:
        self.cfg, self.config_path, self.publisher, self._stop = cfg, config_path, publisher, stop
        self._current, self._batches, self._ready = current, batches, ready
        self.store = DocumentStore(cfg)
        self.applier: Applier | None = None
        self._queue: queue.Queue[tuple[str, bytes]] = queue.Queue(MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="remote-config", daemon=True)
        self._lock = threading.Lock()
        self.last: dict[str, Any] = {}  # the last outcome published
        self.on_change: Callable[[], None] | None = None  # after an outcome: the retained status again

    # --- what the rest of the daemon asks -----------------------------------------------------------
    def overlay(self) -> dict[str, Any]:
        return self.store.overlay()

    def summary(self) -> dict[str, Any]:
        """For the retained status and telemetry: the versions in force by source, the last outcome."""
        out: dict[str, Any] = {"versions": self.store.versions()}
        if self.last:
            out["last"] = {k: self.last[k] for k in ("state", "source", "version") if k in self.last}
        return out

    def start(self) -> None:
        self.publish_initial()
        self._thread.start()

    def publish_initial(self) -> None:
        """At the start, with documents in force: say so (a device without any publishes nothing here)."""
        if self.last or not self.store.versions():
            return
        try:
            load_with_overlay(self.config_path, self.overlay())
        except ConfigError as exc:  # the file changed under them: the start left them out (startup_config)
            reasons = [f"the stored documents no longer apply over {self.config_path}: {exc}"]
            self._publish({"state": "refused", "source": "", "version": 0, "reasons": reasons})
            return
        self._publish({"state": "applied", "source": "", "version": 0})

    def on_message(self, msg: MQTTMessage) -> None:
        """paho's network thread: queue it (an empty retained message clears nothing)."""
        if not msg.payload:
            return
        try:
            self._queue.put_nowait((msg.topic, bytes(msg.payload)))
        except queue.Full:
            logger.warning("remote config: a document on %s dropped (%d waiting)", msg.topic, MAX_PENDING)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                topic, payload = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.handle(topic, payload)
            except Exception:  # a thread boundary: log it, take the next one
                logger.exception("remote config: the document on %s failed", topic)

    # --- one document ---------------------------------------------------------------------------------
    def handle(self, topic: str, payload: bytes) -> dict[str, Any]:
        """Check, apply, judge one document; the outcome (also published on …/config/state)."""
        with self._lock:
            source = f"group:{topic.split('/')[-2]}" if "/_groups/" in topic else SOURCE_DEVICE
            try:
                checked = self._check(source, payload)
            except _Refused as exc:
                if exc.digest == "":
                    return {"state": "ignored"}
                return self._refuse(exc)
            if checked is None:
                return {"state": "unchanged"}
            return self._apply(checked)

    def _check(self, source: str, payload: bytes) -> Checked | None:
        d = digest(payload)
        state = self.store.read()
        refused = state["refused"].get(source, [])
        if len(payload) > MAX_CONFIG_DOC_BYTES + 8192:
            raise _Refused([f"the message is {len(payload)} bytes, over {MAX_CONFIG_DOC_BYTES}"], source, 0, d)
        try:
            env = ConfigEnvelope.model_validate_json(payload)
        except ValidationError as exc:
            raise _Refused([f"envelope: {_first(exc)}"], source, 0, d) from exc
        try:
            checked = check(env, self.cfg, source)
        except _Refused as exc:
            exc.source, exc.digest = source, d
            raise
        if checked.digest in refused:
            logger.info("remote config: %s v%d was refused before; ignored", source, checked.version)
            raise _Refused([], source, checked.version, "")
        floor = int(state["floor"].get(source, 0))
        applied = state["documents"].get(source)
        if checked.version == floor and applied is not None and applied.get("document") == env.document:
            return None  # the document in force, sent again at a connect
        if checked.version <= floor:
            raise _Refused(
                [f"version: {checked.version} is not newer than {floor}, the last applied or cleared from {source} "
                 "(a replayed or older document)"],
                source, checked.version, checked.digest,
            )  # fmt: skip
        if problems := refusals(checked.overlay, self.cfg):
            raise _Refused(problems, source, checked.version, checked.digest)
        return checked

    def _apply(self, checked: Checked) -> dict[str, Any]:
        src, v = checked.source, checked.version
        docs = self.store.documents()
        docs[src] = checked
        order = [f"group:{g}" for g in self.cfg.groups] + [SOURCE_DEVICE]
        overlay = merged_overlays([docs[s].overlay for s in order if s in docs])
        try:
            new = load_with_overlay(self.config_path, overlay)
        except ConfigError as exc:
            return self._refuse(_Refused(str(exc).split("; "), src, v, checked.digest))
        if self.applier is None:
            return self._refuse(_Refused(["the daemon is not serving yet"], src, v, checked.digest))
        previous = self._current()
        before = self._batches()
        result = self.applier.apply(new, f"config document {src} v{v} applied")
        why = self._wait_ready(before)
        if why:
            logger.error("remote config: %s v%d: not ready within the bound (%s): reverting", src, v, why)
            self.applier.apply(previous, f"config document {src} v{v} reverted")
            self._remember_refused(src, checked.digest)
            return self._publish({"state": "reverted", "source": src, "version": v, "reasons": [f"not ready: {why}"]})
        state = self.store.read()
        state["documents"][src] = json.loads(checked.envelope.payload())
        state["floor"][src] = v
        self.store.write(state)
        restart = result.get("restart_needed") or []
        return self._publish(
            {"state": "applied", "source": src, "version": v, "reasons": [], "reopened": result.get("reopened", []),
             "restart_needed": restart}
        )  # fmt: skip

    def _wait_ready(self, before: int) -> str:
        deadline = time.monotonic() + self.cfg.remote_config.ready_timeout_s
        why = self._ready(before)
        while why and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(0.25)
            why = self._ready(before)
        return why

    def _refuse(self, exc: _Refused) -> dict[str, Any]:
        logger.warning("remote config: %s v%d refused: %s", exc.source or "?", exc.version, exc)
        if exc.digest:
            self._remember_refused(exc.source, exc.digest)
        return self._publish({"state": "refused", "source": exc.source, "version": exc.version, "reasons": exc.reasons})

    def _remember_refused(self, source: str, d: str) -> None:
        state = self.store.read()
        kept = [x for x in state["refused"].get(source, []) if x != d]
        state["refused"][source] = [*kept, d][-MAX_REMEMBERED:]
        try:
            self.store.write(state)
        except EdgedError as exc:
            logger.error("remote config: %s", exc)

    def _publish(self, outcome: dict[str, Any]) -> dict[str, Any]:
        doc = {
            "schema": CONFIG_STATE_SCHEMA,
            "device": self.cfg.device_id,
            "ts": iso(time.time()),
            "reasons": [],
            **outcome,
            "versions": self.store.versions(),
        }
        self.last = doc
        self.publisher.set_retained(STATE_SUFFIX, doc)
        if self.on_change is not None:
            self.on_change()
        return doc


def startup_config(cfg: Config, config_path: Path | None) -> tuple[Config, str]:
    """The config a start serves: the file's with the stored documents' overlay, or the file's alone when
    there is none, remote_config is off, or the overlay no longer validates over the file (then why)."""
    if config_path is None or not cfg.remote_config.enabled:
        return cfg, ""
    overlay = DocumentStore(cfg).overlay()
    if not overlay:
        return cfg, ""
    try:
        new = load_with_overlay(config_path, overlay)
    except ConfigError as exc:
        logger.error(
            "remote config: the stored documents do not apply over %s: %s; running on the file", config_path, exc
        )
        return cfg, str(exc)
    logger.info("remote config: the stored documents apply over %s", config_path)
    return new, ""
