"""The MQTT client both ends use: paho-mqtt 2.x, MQTT v5, TLS and credentials from files, the last will.

`make_client` takes any settings object shaped like `MqttSettings` (the daemon's ``mqtt:`` config
section is one), so an operator tool needs no device runtime to build it. The connection's
bounds are the contract's too:

- `MAX_PAYLOAD_BYTES`: the largest message a device publishes (it refuses bigger ones locally);
- `connect_properties`: a persistent session (Session Expiry Interval) and a Maximum Packet Size of the
  largest payload the device takes plus `PACKET_HEADROOM`, so a conforming broker drops anything
  bigger before it is sent;
- `reconnect_backoff`: reconnect waits with full jitter, from 1 s doubling to a bound (60 s on a device
  by default, 5 s for ``edged push``), so a fleet that lost its broker together does not knock in step.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.errors import ConfigError

from .backoff import Backoff
from .topics import STATUS_EXPIRY_S

MAX_PAYLOAD_BYTES = 256 * 1024
PACKET_HEADROOM = 64 * 1024  # an incoming packet's fixed header, topic and properties around its payload
RECONNECT_BASE_S = 1.0


class TlsSettings(Protocol):
    @property
    def ca_file(self) -> Path: ...
    @property
    def cert_file(self) -> Path | None: ...
    @property
    def key_file(self) -> Path | None: ...
    @property
    def insecure_skip_hostname(self) -> bool: ...


class MqttSettings(Protocol):
    """What the client needs to know: the broker, the topic prefix, credentials, TLS, the in-flight window."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def topic_prefix(self) -> str: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password_file(self) -> Path | None: ...
    @property
    def tls(self) -> TlsSettings | None: ...
    @property
    def max_inflight(self) -> int: ...


def make_client(
    cfg: MqttSettings,
    client_id: str,
    will: tuple[str, bytes] | None = None,
    client_class: type[mqtt.Client] = mqtt.Client,
) -> mqtt.Client:
    """A paho client set up from `cfg`: MQTT v5, TLS and credentials from files; `will` is (topic, payload) of
    a retained QoS 1 last will (a device's ``offline`` status); `client_class`: paho's Client or a subclass
    (the daemon's, daemon/delivery/client.py). ConfigError names what cannot be loaded."""
    client = client_class(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if cfg.tls is not None:
        for f in (cfg.tls.ca_file, cfg.tls.cert_file, cfg.tls.key_file):
            if f is not None and not f.is_file():
                raise ConfigError(f"mqtt.tls: {f} not found")
        try:
            client.tls_set(
                ca_certs=str(cfg.tls.ca_file),
                certfile=str(cfg.tls.cert_file) if cfg.tls.cert_file else None,
                keyfile=str(cfg.tls.key_file) if cfg.tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"mqtt.tls: cannot load the certificates: {exc}") from exc
        client.tls_insecure_set(cfg.tls.insecure_skip_hostname)
    if cfg.username is not None:
        password = None
        if cfg.password_file is not None:
            try:
                password = cfg.password_file.read_text().rstrip("\n")
            except OSError as exc:
                raise ConfigError(f"mqtt.password_file: cannot read {cfg.password_file}: {exc.strerror}") from exc
        client.username_pw_set(cfg.username, password)
    client.max_inflight_messages_set(cfg.max_inflight)
    # paho counts QoS 1 messages in flight and queued against one limit: the publisher keeps 1.5 windows of
    # spooled rows there (daemon/delivery/publisher.py), so 1.5 windows stay for status, replies, model and OTA state
    client.max_queued_messages_set(cfg.max_inflight * 3)
    if will is not None:
        # `edged fleet`: the interval left when a subscriber gets the will says when the broker published it
        props = Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
        props.MessageExpiryInterval = STATUS_EXPIRY_S
        client.will_set(will[0], will[1], qos=1, retain=True, properties=props)
    return client


def connect_properties(session_expiry_s: int, max_incoming_bytes: int | None) -> Properties:
    """The CONNECT properties of a device: its persistent session, and the Maximum Packet Size it takes."""
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = session_expiry_s
    if max_incoming_bytes is not None:
        props.MaximumPacketSize = max_incoming_bytes + PACKET_HEADROOM
    return props


def reconnect_backoff(max_s: float) -> Backoff:
    """Reconnect waits: full jitter, the bound doubling from 1 s to `max_s`; `reset()` once connected."""
    return Backoff(RECONNECT_BASE_S, max_s)
