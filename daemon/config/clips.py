"""`clips:`: the clip store (daemon/record/store.py) that the clip planner (daemon/record/planner.py) fills from
each camera's encoded ring (a camera's own `record:` section turns recording on). Bounded by bytes and age; the
oldest clips go first. Validated once at load like the rest (daemon/config/__init__.py re-exports it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from .cameras import StrictModel


class ClipsConfig(StrictModel):
    dir: Path | None = Field(None, description="where clips are kept; null: <state_dir>/clips")
    max_mb: float = Field(
        1024.0, gt=0, description="the store's bound in MB (clips and sidecars); past it the oldest clips are removed"
    )
    max_age_h: float = Field(
        168.0, gt=0, description="clips older than this (hours) are removed, unless still waiting for their upload"
    )
    max_clip_mb: float = Field(
        64.0, gt=0, description="a clip held in memory past this many MB is cut there and a new one started"
    )
    upload: bool = Field(False, description="hand each clip to the uploader (the `upload:` section) once written")
