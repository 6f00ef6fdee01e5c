"""The running parts the surfaces read, handed over as one object.

The daemon (app.py) builds its parts in order, then hands `Parts` to the surfaces that read them:
telemetry and the status line (telemetry.py), the command verbs (control.py) and the health endpoint
(health.py). Each surface takes `Parts` and what is its own (the telemetry it reports, the config file a
reload reads, the watchdog's question).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .capture.camera import Camera, Throttle
from .config import Config
from .delivery.publisher import Publisher
from .host.governor import Governor
from .inference import InferenceLoop
from .lifecycle.manager import ModelManager
from .lifecycle.ota import OtaReceiver
from .scene.scenes import Scenes


class Configured(Protocol):
    """Who holds the config in force (the daemon): a reload replaces `cfg`, so readers take it afresh."""

    cfg: Config


@dataclass(frozen=True, kw_only=True)
class Parts:
    """What the daemon runs, as the surfaces see it. The parts are built once per start and never replaced
    (a swap changes what `models` and `loop` serve, not the objects); the config in force is read from
    `host.cfg` at each use, since a reload replaces it. Keyword-only: `boot_id` and `backend_name`
    are both strings, which a positional mix-up would swap unseen."""

    host: Configured  # the daemon: the config in force
    boot_id: str
    started: float  # the daemon's start, time.monotonic()
    backend_name: str  # the backend it started on
    cameras: list[Camera]
    throttle: Throttle  # pause and the governor's frame-rate factor
    scenes: Scenes  # per-camera tracks, zones and object event counts
    loop: InferenceLoop
    models: ModelManager
    publisher: Publisher
    governor: Governor | None  # None: governor.enabled is false
    ota: OtaReceiver | None  # None: this daemon takes no pushed models
