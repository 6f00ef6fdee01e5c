"""What each version of a model output while it served, recorded beside its ``state.json``: the baseline
a version on probation is judged against after a restart (DESIGN §5, issue 29 item 4).

    <state_dir>/models/<name>/output.json      schema edged.store.output/1, one entry per version

A running swap compares the new version with the old one's figures in memory; a version installed
while the daemon was stopped (`edged model install`, a bundle) or whose probation spans a restart has
no old model in memory, so the daemon records each serving version's newest figures here (at most once
a minute, and at a clean stop; see `daemon/lifecycle/manager.py`) and a start reads the `previous`
version's. An entry is the newest `rows` decoded frames' detections and score sum (what probation's
output verdict compares), the median batch cost (the latency baseline), when, and its `source`:
``served`` (the version's own output while it served). A shadow report (a candidate run beside the
serving model) can be stored the same way, as an entry with ``source: shadow`` and its own figures.

Written like ``state.json`` (temp file, fsync, rename, fsync the folder), without a backup copy: a
file that is missing or damaged costs only the baseline (the next probation is judged on errors and
latency, as before), never the store.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from .files import write_atomic

logger = logging.getLogger(__name__)

OUTPUT = "output.json"
OUTPUT_SCHEMA = "edged.store.output/1"


@dataclass(frozen=True)
class RecordedOutput:
    """One version's output over its newest `rows` decoded frames, as recorded."""

    rows: int
    detections: int
    score_sum: float
    median_batch_ms: float | None  # its median batch cost (CPU time on a CPU backend), None before any batch
    recorded_at: float  # Unix time
    source: Literal["served", "shadow"] = "served"

    @classmethod
    def parse(cls, doc: object) -> RecordedOutput:
        if not isinstance(doc, dict):
            raise ValueError("an entry is not an object")
        rec = cls(**doc)
        if not all(isinstance(v, int) and v >= 0 for v in (rec.rows, rec.detections)):
            raise ValueError("rows and detections must be counts")
        if not isinstance(rec.score_sum, int | float) or not isinstance(rec.recorded_at, int | float):
            raise ValueError("score_sum and recorded_at must be numbers")
        if rec.median_batch_ms is not None and not isinstance(rec.median_batch_ms, int | float):
            raise ValueError("median_batch_ms must be a number or null")
        if rec.source not in ("served", "shadow"):
            raise ValueError(f"source {rec.source!r} is neither served nor shadow")
        return rec


def read_outputs(folder: Path) -> dict[int, RecordedOutput]:
    """Every version's recorded output in `folder` (a model's folder in the store); empty when there is no
    file, and, with a warning naming the file, when it is damaged."""
    path = folder / OUTPUT
    try:
        doc = json.loads(path.read_bytes())
        if not isinstance(doc, dict) or doc.get("schema") != OUTPUT_SCHEMA:
            raise ValueError(f"not an {OUTPUT_SCHEMA} document")
        versions = doc.get("versions")
        if not isinstance(versions, dict):
            raise ValueError("versions: not an object")
        return {int(v): RecordedOutput.parse(entry) for v, entry in versions.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("%s is unusable (%s): no recorded output to judge a version on probation by", path, exc)
        return {}


def write_outputs(folder: Path, outputs: dict[int, RecordedOutput]) -> int:
    """output.json (atomically), newest versions first; returns the bytes written."""
    doc = {"schema": OUTPUT_SCHEMA, "versions": {str(v): asdict(outputs[v]) for v in sorted(outputs, reverse=True)}}
    data = (json.dumps(doc, indent=1) + "\n").encode()
    write_atomic(folder / OUTPUT, data)
    return len(data)


def record_output(folder: Path, version: int, rec: RecordedOutput, keep: list[int]) -> int:
    """Record `version`'s output, keeping only the entries of the versions in `keep` (those still on disk)
    and this one; returns the bytes written."""
    outputs = {v: r for v, r in read_outputs(folder).items() if v in keep}
    outputs[version] = rec
    return write_outputs(folder, outputs)
