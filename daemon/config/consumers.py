"""The config of what local consumers read besides the device's own topics: Home Assistant MQTT discovery
(daemon/delivery/homeassistant.py) and the local health/metrics endpoint (daemon/health.py). Validated once at load
like the rest of the config (daemon/config/__init__.py, which loads the file and re-exports these)."""

from __future__ import annotations

import re
from pathlib import Path

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
    live_view: bool = Field(
        False,
        description="serve the live view at /live: each camera's newest inferred frame with its boxes, labels, "
        "track ids, zones and masks drawn (docs/operator.md, 'Live view'); only to loopback clients unless "
        "token_file is set, and then only with the token",
    )
    token_file: Path | None = Field(
        None,
        description="a file holding the live view's token (e.g. under $CREDENTIALS_DIRECTORY): then /live answers "
        "any address that gives it (?token= on the page, then a cookie; or an Authorization: Bearer header)",
    )
    live_max_fps: float = Field(5.0, gt=0.0, le=30.0, description="frames per second a live view sends, at most")
    live_max_width: int = Field(
        960, ge=160, le=3840, description="a live view's frames are scaled down to this width (px), never up"
    )
    live_jpeg_quality: int = Field(70, ge=30, le=95, description="the JPEG quality of live view frames")
    live_max_viewers: int = Field(
        4, ge=1, le=64, description="live view requests served at once; more are refused (503) to bound the CPU"
    )
