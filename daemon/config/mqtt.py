"""The config of how results leave the device: the broker (``mqtt``, with ``tls``) and the durable spool
in front of it (``spool``). Also what the operator tools read of a config file, which is only its
``mqtt`` section: ``load_mqtt_config`` (``edged push``) and ``watch_settings`` (``edged watch``).
Validated once at load like the rest of the config (daemon/config/__init__.py, which loads the file and
re-exports these)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from edged.errors import ConfigError

from .cameras import StrictModel as _Strict
from .file import PathFixer, apply_env, describe_error, describe_errors, path_fixer, read_yaml

TOPIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A name that becomes one topic level: the device id, a fleet group."""
_TOPIC_SAFE = re.compile(r"^[^#+/\x00]+$")


class TlsConfig(_Strict):
    ca_file: Path = Field(description="the CA that signed the broker's certificate")
    cert_file: Path | None = Field(None, description="the client certificate (with key_file)")
    key_file: Path | None = Field(None, description="the client certificate's key (with cert_file)")
    insecure_skip_hostname: bool = Field(False, description="skip the broker hostname check")

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class MqttConfig(_Strict):
    host: str = Field("127.0.0.1", description="the broker's host")
    port: int = Field(1883, ge=1, le=65535, description="the broker's port")
    topic_prefix: str = Field("edged", description="topics are <topic_prefix>/<device_id>/...")
    client_id: str | None = Field(None, description="MQTT client id; none means edged-<device_id>")
    qos: Literal[0, 1] = Field(1, description="QoS of results; status is always QoS 1")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive")
    username: str | None = Field(None, description="MQTT user name")
    password_file: Path | None = Field(
        None, description="the MQTT password, read from this file (e.g. under $CREDENTIALS_DIRECTORY), never the YAML"
    )
    tls: TlsConfig | None = Field(None, description="TLS to the broker; none means plain TCP")
    session_expiry_s: int = Field(
        3600,
        ge=0,
        le=2**32 - 1,
        description="MQTT v5 Session Expiry Interval: the session (command subscription, unacknowledged "
        "messages) outlives a disconnect this long (clean_start is false)",
    )
    max_inflight: int = Field(100, ge=1, le=65_000, description="QoS 1 messages sent and not yet acknowledged, at most")
    reconnect_max_s: float = Field(
        60.0,
        ge=1.0,
        le=3600.0,
        description="reconnect waits after a lost or refused connection: random (full jitter) up to a bound that "
        "doubles from 1 s to this, so a fleet never reconnects in step",
    )

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v or any(not _TOPIC_SAFE.match(p) for p in v.split("/")):
            raise ValueError("must be non-empty topic levels without '+', '#' or empty levels")
        return v


class SpoolConfig(_Strict):
    max_mb: float = Field(
        256.0,
        gt=0,
        le=1_000_000,
        description="the durable spool (<state_dir>/spool.db): over this size (or a quarter of its filesystem, "
        "if smaller) the oldest messages are dropped",
    )
    max_age_s: float = Field(
        7 * 86400.0,
        gt=0,
        description="messages spooled longer than this (the daemon's running time, not wall-clock time) are dropped",
    )
    commit_interval_ms: float = Field(
        200.0, ge=1, le=10_000, description="group commit of the spool; the loss window on power loss or a crash"
    )


def load_mqtt_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> MqttConfig:
    """Only the `mqtt` section of a config file (what `edged push` needs; a device config will do, and so
    does a file holding nothing but an `mqtt:` section), with its ``EDGED_MQTT__*`` overrides, so it names
    the broker the daemon would use. Paths resolve as in load_config."""
    return _read_mqtt(Path(path), os.environ if environ is None else environ)[0]


def _read_mqtt(path: Path, environ: Mapping[str, str]) -> tuple[MqttConfig, dict[str, Any]]:
    """The `mqtt` section and the file's top level, both with the ``EDGED_MQTT__*`` and ``EDGED_DEVICE_ID``
    overrides (another section's variables are not this reader's business)."""
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {type(raw).__name__}")
    overrides = apply_env(raw, environ, path, sections={"mqtt", "device_id"})
    section = raw.get("mqtt", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: mqtt: must be a mapping")
    try:
        mqtt = MqttConfig.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc.errors(), path, overrides, section=("mqtt",))) from exc
    return resolve_mqtt(mqtt, path_fixer(path, environ)), raw


@dataclass(frozen=True)
class BrokerFlags:
    """An operator tool's broker flags (`edged watch`, `edged push`: ``cli/broker.py`` adds them); None
    where not given. Paths are taken as given (relative to the working directory)."""

    host: str | None = None
    port: int | None = None
    prefix: str | None = None
    cafile: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    username: str | None = None
    password_file: Path | None = None


def watch_settings(
    path: Path | None,
    flags: BrokerFlags = BrokerFlags(),
    *,
    device: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[MqttConfig, str]:
    """What a subscriber (`edged watch`) needs and nothing more: the broker settings of `path` (any file
    with an `mqtt:` section, or none) with its ``EDGED_MQTT__*`` overrides, as the daemon reads them, and the
    given flags over those; the device id (`device`, else the file's `device_id` or ``EDGED_DEVICE_ID``)."""
    mqtt = MqttConfig()
    if path is not None:
        mqtt, raw = _read_mqtt(path, os.environ if environ is None else environ)
        found = raw.get("device_id")
        device = device if device is not None else (found if isinstance(found, str) else None)
    where = f"{path}: " if path is not None else ""
    if device is None:
        raise ConfigError(f"{where}no device to watch: give --device ID (or a config with a device_id)")
    if not TOPIC_NAME.match(device):
        raise ConfigError(f"device {device!r}: must be 1-64 of letters, digits, '_', '.', '-' (it is a topic level)")
    return with_flags(mqtt, path, flags), device


def with_flags(mqtt: MqttConfig, path: Path | None, flags: BrokerFlags) -> MqttConfig:
    """An operator tool's broker settings (`edged watch`, `edged push`): its flags over `mqtt` (read from
    `path`, or the defaults). --cert/--key need --cafile; without a file or --port, --cafile means port 8883."""
    f = flags
    where = f"{path}: " if path is not None else ""
    doc: dict[str, Any] = mqtt.model_dump()
    doc.update({k: v for k, v in (("host", f.host), ("port", f.port), ("topic_prefix", f.prefix)) if v is not None})
    if f.username is not None:
        doc["username"] = f.username
    if f.password_file is not None:
        doc["password_file"] = f.password_file
    if f.cafile is not None or f.cert is not None or f.key is not None:
        tls = dict(doc["tls"] or {})
        given = (("ca_file", f.cafile), ("cert_file", f.cert), ("key_file", f.key))
        tls.update({k: v for k, v in given if v is not None})
        if "ca_file" not in tls:
            raise ConfigError(f"{where}--cert/--key need --cafile (the CA that signed the broker's certificate)")
        doc["tls"] = tls
        if f.port is None and path is None:
            doc["port"] = 8883  # MQTT over TLS
    try:
        return MqttConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(
            where + "; ".join(describe_error({**e, "loc": ("mqtt", *e["loc"])}) for e in exc.errors())
        ) from exc


def resolve_mqtt(mqtt: MqttConfig, fix: PathFixer) -> MqttConfig:
    """The section with its paths (password file, TLS files) resolved by `fix`."""
    tls = mqtt.tls
    if tls is not None:
        tls = tls.model_copy(
            update={"ca_file": fix(tls.ca_file), "cert_file": fix(tls.cert_file), "key_file": fix(tls.key_file)}
        )
    return mqtt.model_copy(update={"tls": tls, "password_file": fix(mqtt.password_file)})
