"""A result as it goes out on ``…/results/<camera>`` (edged.result/2, edged.protocol.schemas; edged.result/3 for
a result that went through the second-stage models, daemon/cascade/: each detection's ``stages`` and the result's
``stage_versions`` added, every /2 field as it was).

`result_payload` is the document; `result_bytes` is its bytes as the wire carries them, the same as
``edged.protocol.schemas.dumps(result_payload(...))``'s (tests/test_delivery.py compares them on real and
on made-up results) for less of the publisher thread's time per result (bench/pipeline_cpu_encode.py):
``dumps`` makes a new JSON encoder on every call, here one is made once; the document's first members
(schema, device, camera, boot id) are encoded once per camera; the time stamp's whole second is formatted
once per second."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from edged.protocol.schemas import RESULT_SCHEMA, RESULT_SCHEMA_V3, iso, result_doc

if TYPE_CHECKING:  # the inference types need NumPy: only for type checking here
    from ..inference import Result

__all__ = ["result_bytes", "result_payload"]

_CACHE_MAX = 256  # distinct heads (device, camera, boot id) and seconds kept; then the cache starts again


def _staged(r: Result) -> tuple[tuple[dict[str, Any], ...], dict[str, str]] | None:
    """A cascade's result (daemon/cascade/runner.py `StagedResult`, read by its fields: delivery does not import
    the cascade): each detection's stage outputs and the stages' versions; None for a plain result."""
    versions = getattr(r, "stage_versions", None)
    if versions is None:
        return None
    return tuple(getattr(r, "stages", ())), dict(versions)


def _detections(r: Result, staged: tuple[tuple[dict[str, Any], ...], dict[str, str]] | None) -> list[dict[str, Any]]:
    docs = [d.to_json() for d in r.detections]
    if staged is not None:
        for doc, stages in zip(docs, staged[0], strict=False):
            if stages:
                doc["stages"] = stages
    return docs


def result_payload(r: Result, device: str, boot_id: str, seq: int) -> dict[str, Any]:
    t = r.meta.transform
    staged = _staged(r)
    doc = result_doc(
        device=device,
        camera=r.camera,
        boot_id=boot_id,
        seq=seq,
        frame=r.meta.frame,
        captured_at=r.meta.captured_at,
        capture_to_result_ms=r.capture_to_result_ms,
        infer_ms=r.infer_ms,
        model=(r.model_name, r.model_version),
        image=(t.src_width, t.src_height),
        detections=_detections(r, staged),
    )
    if staged is not None:
        doc["schema"] = RESULT_SCHEMA_V3
        doc["stage_versions"] = staged[1]
    return doc


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # what dumps() makes anew on every call: made once
_heads: dict[tuple[str, str, str, str], str] = {}
_seconds: dict[int, str] = {}


def _head(device: str, camera: str, boot_id: str, schema: str = RESULT_SCHEMA) -> str:
    """The document's first four members, encoded, with the comma after them (kept per camera)."""
    key = (device, camera, boot_id, schema)
    head = _heads.get(key)
    if head is None:
        if len(_heads) >= _CACHE_MAX:
            _heads.clear()
        first = {"schema": schema, "device": device, "camera": camera, "boot_id": boot_id}
        head = _heads[key] = _ENCODER.encode(first)[:-1] + ","
    return head


def _iso(ts: float) -> str:
    """iso(ts), byte for byte, with the whole second's text kept: datetime.fromtimestamp splits a time into its
    whole seconds and microseconds rounded half to even (a rounding up to 1,000,000 carries into the second),
    and isoformat(timespec="milliseconds") drops the last three digits."""
    if not 0 <= ts < 253_402_300_800:  # before the epoch or past year 9999: the long way
        return iso(ts)
    frac, whole = math.modf(ts)
    sec, us = int(whole), round(frac * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    text = _seconds.get(sec)
    if text is None:
        if len(_seconds) >= _CACHE_MAX:
            _seconds.clear()
        t = time.gmtime(sec)
        text = _seconds[sec] = (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
        )
    return f"{text}{us // 1000:03d}Z"


def result_bytes(r: Result, device: str, boot_id: str, seq: int) -> bytes:
    """``dumps(result_payload(r, device, boot_id, seq))``, byte for byte: the same encoder, made once; the
    members that are the same for every result of a camera encoded once; the time stamp's second kept."""
    m, t = r.meta, r.meta.transform
    staged = _staged(r)
    rest: dict[str, Any] = {
        "seq": seq,
        "frame": m.frame,
        "captured_at": _iso(m.captured_at),
        "latency_ms": {"capture_to_result": round(r.capture_to_result_ms, 2), "infer": round(r.infer_ms, 2)},
        "model": {"name": r.model_name, "version": r.model_version},
        "image": {"width": t.src_width, "height": t.src_height},
        "detections": _detections(r, staged),
    }
    if staged is None:
        return (_head(device, r.camera, boot_id) + _ENCODER.encode(rest)[1:]).encode()
    rest["stage_versions"] = staged[1]
    return (_head(device, r.camera, boot_id, RESULT_SCHEMA_V3) + _ENCODER.encode(rest)[1:]).encode()
