"""Remote configuration on the wire: the signed config document and the device's outcome.

A config document (``edged.config/1``) is the JSON text an operator signs: the target (one device or one
group), a version, the overlay (only the keys it changes) and when it was issued. It travels inside an
envelope (``edged.config_document/1``) that carries the document's exact bytes and their ``edged.sig/1``
signature (models/signing.py), so what was signed is what is verified, byte for byte:

    <prefix>/<device>/config/desired      retained, QoS 1   one device's document   (`desired`)
    <prefix>/_groups/<group>/config       retained, QoS 1   a group's document      (`group_config`)
    <prefix>/<device>/config/state        retained, QoS 1   the device's outcome (``edged.config_state/1``)

An empty retained message on either desired topic clears nothing on the device: the overlay stays until a
newer document replaces it or ``edged config clear`` on the device removes it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .ota import GROUP_NAME
from .schemas import CONFIG_DOCUMENT_SCHEMA as CONFIG_ENVELOPE_SCHEMA
from .schemas import CONFIG_SCHEMA as CONFIG_DOC_SCHEMA
from .schemas import CONFIG_STATE_SCHEMA as CONFIG_STATE_SCHEMA

MAX_CONFIG_DOC_BYTES = 256 * 1024  # a document with every zone of a busy site fits many times over
OUTCOMES = ("applied", "refused", "reverted", "cleared", "unchanged")
SOURCE_DEVICE = "device"
__all__ = ["CONFIG_DOC_SCHEMA", "CONFIG_ENVELOPE_SCHEMA", "CONFIG_STATE_SCHEMA", "ConfigDocument", "ConfigEnvelope"]


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    device: str | None = Field(None, pattern=GROUP_NAME)
    group: str | None = Field(None, pattern=GROUP_NAME)

    @model_validator(mode="after")
    def _one(self) -> Target:
        if (self.device is None) == (self.group is None):
            raise ValueError("a document names exactly one of target.device or target.group")
        return self

    @property
    def source(self) -> str:
        """How the device names where an overlay came from: ``device`` or ``group:<name>``."""
        return SOURCE_DEVICE if self.device is not None else f"group:{self.group}"


class ConfigDocument(BaseModel):
    """The signed document (``edged.config/1``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: Literal["edged.config/1"] = Field(alias="schema")
    target: Target
    version: int = Field(ge=1, le=2**53)
    overlay: dict[str, Any]
    issued_at: str = ""
    comment: str = Field("", max_length=500)


class ConfigEnvelope(BaseModel):
    """The retained message: the document's exact bytes (text) and its ``edged.sig/1`` signature (text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: Literal["edged.config_document/1"] = Field(alias="schema")
    document: str = Field(max_length=MAX_CONFIG_DOC_BYTES)
    sig: str = Field(max_length=4096)

    def payload(self) -> bytes:
        return json.dumps({"schema": CONFIG_ENVELOPE_SCHEMA, "document": self.document, "sig": self.sig}).encode()


def envelope(document: bytes, sig: bytes) -> ConfigEnvelope:
    return ConfigEnvelope.model_validate(
        {"schema": CONFIG_ENVELOPE_SCHEMA, "document": document.decode(), "sig": sig.decode()}
    )
