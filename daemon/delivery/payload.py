"""A result as it goes out on ``…/results/<camera>`` (edged.result/2, edged.protocol.schemas)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edged.protocol.schemas import result_doc

if TYPE_CHECKING:  # the inference types need NumPy: only for type checking here
    from ..inference import Result

__all__ = ["result_payload"]


def result_payload(r: Result, device: str, boot_id: str, seq: int) -> dict[str, Any]:
    t = r.meta.transform
    return result_doc(
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
        detections=[d.to_json() for d in r.detections],
    )
