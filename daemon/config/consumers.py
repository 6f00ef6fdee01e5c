"""The config of what local consumers read besides the device's own topics: Home Assistant MQTT discovery
(daemon/delivery/homeassistant.py) and the local health/metrics endpoint (daemon/health.py). Validated once at load
like the rest of the config (daemon/config/__init__.py, which loads the file and re-exports these)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from .cameras import StrictModel

_TOPIC_LEVELS = re.compile(r"^[^#+\x00/]+(/[^#+\x00/]+)*$")


class HomeAssistantConfig(StrictModel):
    enabled: bool = Field(
        False, description="publish Home Assistant MQTT discovery configs and per-camera states (docs/subscriber.md)"
    )
    discovery_prefix: str = Field(
        "homeassistant", description="Home Assistant's discovery prefix (its MQTT integration's setting)"
    )
    name: str | None = Field(None, description="the device's name in Home Assistant; null: device_id")
    labels: list[str] | None = Field(
        None,
        description="a count sensor per camera for each of these labels; null: the camera's labels, else "
        "detection.labels, else every label of the model",
    )

    @field_validator("discovery_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not _TOPIC_LEVELS.match(v):
            raise ValueError("must be topic levels without wildcards or empty levels ('homeassistant')")
        return v


class HealthConfig(StrictModel):
    enabled: bool = Field(
        False, description="serve /healthz, /readyz and /metrics over HTTP (docs/operator.md, 'Health endpoint')"
    )
    host: str = Field("127.0.0.1", description="the address it listens on; 0.0.0.0 opens it to the network")
    port: int = Field(9477, ge=0, le=65535, description="its TCP port; 0: any free port (logged)")
