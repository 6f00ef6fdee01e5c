"""The store's record of one model (DESIGN §5): ``state.json`` (schema ``edged.store/1``: the highest
version accepted, the one on probation and its crash count, the versions marked bad) and its copy
``state.json.bak``, written just before it, so that a ``state.json`` damaged later (by the disk, by
hand) is restored from the copy at the next start instead of being rebuilt from what is on disk."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .files import write_atomic

STATE = "state.json"
STATE_BACKUP = "state.json.bak"  # the same bytes, written just before state.json (see write_state)


@dataclass
class ModelState:
    highest_accepted: int = 0
    pending: int | None = None  # the version on probation, if any
    probation_crashes: int = 0
    probation_since: float | None = None
    bad: list[int] = field(default_factory=list)
    probation_boot: str | None = None  # boot id of the daemon run judging the probation; set = not stopped cleanly
    baseline_infer_ms: float | None = (
        None  # the replaced version's median batch cost (CPU time on a CPU backend): to beat
    )

    def to_json(self) -> bytes:
        return (json.dumps({"schema": "edged.store/1", **asdict(self)}, indent=2) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> ModelState:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.pop("schema", None) != "edged.store/1":
            raise ValueError("not an edged.store/1 document")
        state = cls(**doc)
        if not isinstance(state.highest_accepted, int) or not all(isinstance(v, int) for v in state.bad):
            raise ValueError("wrong types")
        return state


def read_state(folder: Path) -> ModelState:
    """The model's state in `folder` (a fresh one when it has none); ValueError or TypeError when corrupt."""
    path = folder / STATE
    if not path.exists():
        return ModelState()
    return ModelState.parse(path.read_bytes())


def write_state(folder: Path, state: ModelState) -> None:
    """state.json, after its backup copy (both written atomically)."""
    data = state.to_json()
    write_atomic(folder / STATE_BACKUP, data)
    write_atomic(folder / STATE, data)


def rebuilt_state(folder: Path, versions: list[int]) -> tuple[ModelState, str]:
    """The state to go on with when state.json is corrupt: its backup copy (which keeps the versions
    marked bad, the probation and its crash count), else what the disk shows (every version good), and
    which of the two, in words."""
    backup = folder / STATE_BACKUP
    try:
        state = ModelState.parse(backup.read_bytes())
    except (ValueError, TypeError, OSError) as exc:
        why = "missing" if isinstance(exc, FileNotFoundError) else f"unusable too ({exc})"
        state = ModelState(highest_accepted=max(versions, default=0))
        return state, f"rebuilt from disk (its backup {STATE_BACKUP} is {why}; the versions marked bad are lost)"
    state.highest_accepted = max(state.highest_accepted, *versions, 0)
    return state, f"restored from its backup {STATE_BACKUP} (bad versions {sorted(state.bad)})"
