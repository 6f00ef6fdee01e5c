"""``stages:``: second-stage models on crops of what the model before found (daemon/cascade/).

Each stage names its own package (as ``model:`` names the primary's), the labels of the stage before
whose boxes it reads, the cameras it runs on, how a box becomes a crop and how often a track is
inferred again. Validated once at load like the rest of the config (daemon/config/__init__.py).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from .cameras import StrictModel as _Strict
from .mqtt import TOPIC_NAME
from .runtime import ModelConfig


class StageConfig(_Strict):
    name: str = Field(
        description="the stage's name: the key of its output in each detection's `stages`, a topic level "
        "(letters, digits, '_', '.', '-')"
    )
    model: ModelConfig = Field(description="the stage's package, as `model:` names the primary's")
    on_labels: list[str] = Field(
        min_length=1, description="crops of detections with these labels (of the primary) go to the stage"
    )
    cameras: list[str] | None = Field(None, description="the cameras it runs on; null: every camera")
    min_box_px: float = Field(16.0, ge=1, description="boxes narrower or lower than this (source pixels) are skipped")
    pad: float = Field(
        0.1,
        ge=0,
        le=2,
        description="the crop grows by this share of the box side on each side, clipped to the frame",
    )
    max_crops_per_frame: int = Field(8, ge=1, le=256, description="crops per frame at most, largest boxes first")
    reinfer_frames: int = Field(
        10,
        ge=1,
        le=100_000,
        description="with tracking on, a track is inferred again at most every this many of its frames ...",
    )
    iou_change: float = Field(
        0.5, ge=0, le=1, description="... or sooner when its box's IoU with the box last inferred falls below this"
    )
    max_wait_ms: float = Field(
        20.0, ge=0, le=10_000, description="crops wait at most this long for more to fill the stage's batch"
    )
    max_pending: int = Field(
        64,
        ge=1,
        le=10_000,
        description="results waiting for this stage at most; a result past it goes out without the stage (counted)",
    )
    top_k: int = Field(3, ge=1, le=100, description="labels per crop kept from a classifier stage")
    score_threshold: float = Field(0.5, ge=0, le=1, description="a detector stage's boxes below this are dropped")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not TOPIC_NAME.match(v):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', '-' (it becomes a topic level)")
        return v


def check_stages(stages: list[StageConfig], cameras: list[str]) -> list[StageConfig]:
    """Unique names; every named camera exists. Raises ValueError naming what is wrong."""
    names = [s.name for s in stages]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"stage names must be unique; repeated: {', '.join(dup)}")
    for i, s in enumerate(stages):
        unknown = [c for c in (s.cameras or []) if c not in cameras]
        if unknown:
            raise ValueError(f"stages[{i}].cameras: no such camera: {', '.join(unknown)}")
    return stages
