"""The ``diagnose`` verb: what an operator would otherwise SSH in for, as one document, and the log ring it reads.

    {"schema": "edged.diagnose/1", "device", "ts", "version", "boot_id", "uptime_s",
     "doctor": edged doctor's JSON (edged.doctor/1, run in the daemon with the config in force),
     "logs": {"lines": ["<time> <LEVEL> <logger>: <message>", …], "capacity", "seen"},
     "config": the config in force, secrets removed,
     "spool": the spool's counters and file, "store": the model state (edged.model-state/1) and the package}

The document goes out in parts (`edged.protocol.commands`: `split_parts`, `join_parts`): the first ask
builds it and answers part 0; the asker asks for the others by the document's id. One document is held, for
`HOLD_S`.

What counts as a secret, and how it is kept out (the reply is for the site's backend, and it still never
carries one):

- a config value whose key names a password, passphrase, secret, token, credential or private key
  (``password``, ``token``, ``api_key``, …) but not a file or folder (``password_file`` is a path: shown) is ***;
- every URI (a camera's, an OTA mirror's) loses its user and password (``redact``), and the values of query
  parameters named like one (``?user=…&password=…&token=…&sig=…``);
- files are shown by their path, never their contents: the MQTT password file, camera password files, TLS
  keys and certificates;
- last, the whole text is searched for each secret the config leads to (the contents of the password files,
  the passwords in camera URIs) and any found is replaced with ***: a log line that quoted one, a doctor check
  that named one.

Log lines are kept by `LogRing`, a handler on the root logger installed at the start (app.py): the newest
`capacity` records, formatted, each scrubbed as it arrives (``scrub``: URIs' users and passwords, GStreamer
credential properties) and cut to `MAX_LINE_CHARS`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from edged import __version__
from edged.errors import Code, CommandError
from edged.protocol.commands import DIAGNOSE_MAX_LINES, PART_CHARS, split_parts
from edged.protocol.schemas import DIAGNOSE_SCHEMA, iso

from .capture.redact import redact, scrub
from .config import Config
from .parts import Parts

logger = logging.getLogger(__name__)

RING_CAPACITY = 2000
MAX_LINE_CHARS = 2000
HOLD_S = 300.0
DOCTOR_BROKER_TIMEOUT_S = 3.0
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|credential|api_?key|private", re.IGNORECASE)
PATH_KEY = re.compile(r"_(file|dir|path)$")
SECRET_QUERY = re.compile(r"^(user(name)?|pass(word|wd)?|pwd|token|secret|key|auth|sig(nature)?|x-amz-.*)$", re.I)
MIN_SECRET_CHARS = 4  # a shorter "secret" would blank common text; such a password is its own problem


class LogRing(logging.Handler):
    """The newest `capacity` log records, formatted and scrubbed; `install()` puts one on the root logger."""

    def __init__(self, capacity: int = RING_CAPACITY) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self.seen = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = scrub(self.format(record))[:MAX_LINE_CHARS]
        except Exception:  # a record that cannot be formatted: logging's own policy, never raise into the caller
            self.handleError(record)
            return
        self.lines.append(line)
        self.seen += 1

    def newest(self, n: int) -> list[str]:
        with self.lock or threading.Lock():
            held = list(self.lines)
        return held[-n:] if n > 0 else []

    @classmethod
    def install(cls, capacity: int = RING_CAPACITY) -> LogRing:
        ring = cls(capacity)
        logging.getLogger().addHandler(ring)
        return ring

    def uninstall(self) -> None:
        logging.getLogger().removeHandler(self)

    @staticmethod
    def on_root() -> LogRing | None:
        """The ring installed on the root logger (the newest, if several), None without one."""
        rings = [h for h in logging.getLogger().handlers if isinstance(h, LogRing)]
        return rings[-1] if rings else None


class DiagnoseArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    lines: int = Field(200, ge=0, le=DIAGNOSE_MAX_LINES, description="log lines to include (the first ask)")
    id: str | None = Field(None, max_length=64, description="the document whose part to send (the later asks)")
    part: int = Field(0, ge=0)
    part_chars: int = Field(
        PART_CHARS,
        ge=1024,
        le=PART_CHARS,
        description="the parts' size (the first ask): smaller for a broker "
        "whose message_size_limit is under the device's 256 KiB",
    )


class Diagnose:
    """The verb on the running parts; the log ring is the root logger's (`LogRing.on_root`)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._held: tuple[str, str, list[str], float] | None = None  # id, sha256, parts, monotonic time built

    def run(self, args: DiagnoseArgs) -> dict[str, Any]:
        if args.id is None:
            text = self.document_text(args.lines)
            ident = uuid.uuid4().hex[:16]
            self._held = (
                ident,
                hashlib.sha256(text.encode()).hexdigest(),
                split_parts(text, args.part_chars),
                time.monotonic(),
            )
        held = self._held
        stale = held is None or time.monotonic() - held[3] > HOLD_S
        if held is None or stale or (args.id is not None and held[0] != args.id):
            raise CommandError(Code.UNKNOWN_DOCUMENT, f"no diagnostics {args.id!r} held: ask again without an id")
        ident, digest, slices, _ = held
        if args.part >= len(slices):
            raise CommandError(
                Code.INVALID_ARGUMENTS, f"part {args.part}: the document has parts 0 to {len(slices) - 1}"
            )
        return {"id": ident, "part": args.part, "parts": len(slices), "sha256": digest, "data": slices[args.part]}

    def document_text(self, lines: int) -> str:
        """The document's JSON text (ASCII), every known secret replaced."""
        cfg = self.parts.host.cfg
        text = json.dumps(self.document(cfg, lines), separators=(",", ":"), default=str)
        for secret in known_secrets(cfg):
            for form in {secret, json.dumps(secret)[1:-1]}:
                text = text.replace(form, "***")
        return text

    def document(self, cfg: Config, lines: int) -> dict[str, Any]:
        from .doctor import run_checks, to_json  # the checks import capture and model code: only when asked

        p = self.parts
        ring = LogRing.on_root()
        t0 = time.monotonic()
        doctor = to_json(run_checks(cfg, broker_timeout_s=DOCTOR_BROKER_TIMEOUT_S))
        doctor["took_s"] = round(time.monotonic() - t0, 2)
        stats = p.publisher.stats()
        spool_file = cfg.state_dir / "spool.db"
        return {
            "schema": DIAGNOSE_SCHEMA,
            "device": cfg.device_id,
            "ts": iso(time.time()),
            "version": __version__,
            "boot_id": p.boot_id,
            "uptime_s": round(time.monotonic() - p.started, 1),
            "doctor": doctor,
            "logs": {
                "lines": ring.newest(lines) if ring is not None else [],
                "capacity": ring.lines.maxlen if ring is not None else 0,
                "seen": ring.seen if ring is not None else 0,
            },
            "config": public_config(cfg),
            "spool": {
                "file": str(spool_file),
                "file_bytes": _size(spool_file),
                **{k: v for k, v in stats.items() if k.startswith("spool")},
                "connected": stats.get("connected"),
                "last_error": stats.get("last_error"),
            },
            "store": {"package": p.models.package.ref, "state": p.models.state_doc()},
        }


def public_config(cfg: Config) -> dict[str, Any]:
    """The config in force as JSON, secrets removed (the module docstring says which)."""
    out: dict[str, Any] = _clean(cfg.model_dump(mode="json"), "")
    return out


def _clean(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, key) for v in value]
    if value is not None and SECRET_KEY.search(key) and not PATH_KEY.search(key):
        return "***"
    if isinstance(value, str) and "://" in value:
        return _clean_uri(value)
    return value


def _clean_uri(uri: str) -> str:
    shown = redact(uri)
    try:
        query = urlsplit(shown).query
    except ValueError:
        return shown
    for name, val in parse_qsl(query, keep_blank_values=True):
        if val and SECRET_QUERY.match(name):
            shown = shown.replace(f"{name}={val}", f"{name}=***")
    return shown


def known_secrets(cfg: Config) -> list[str]:
    """Every secret the config leads to, longest first: password files' contents, URIs' passwords and
    secret query values. Read only to be searched for and replaced."""
    found: set[str] = set()
    files: list[Path | None] = [cfg.mqtt.password_file] + [c.password_file for c in cfg.cameras]
    for f in files:
        if f is not None:
            try:
                found.add(f.read_text().rstrip("\n"))
            except OSError:  # unreadable here: the doctor's and the daemon's own checks say so
                continue
    for uri in _strings(cfg.model_dump(mode="json")):
        if "://" not in uri:
            continue
        try:
            parts = urlsplit(uri)
            if parts.password:
                found.add(parts.password)
            found.update(v for n, v in parse_qsl(parts.query) if SECRET_QUERY.match(n))
        except ValueError:
            continue
    return sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
