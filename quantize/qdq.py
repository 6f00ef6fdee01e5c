"""``edged build-engine --calib``: a float model and calibration frames -> a checked INT8 Q/DQ model for
TensorRT's explicit quantization, at every batch to build.

TensorRT 10.1 deprecated implicit INT8 calibration (``IBuilderConfig.int8_calibrator`` and the calibrator
classes, "superseded by explicit quantization", with no other setter), 10.12 deprecated the weak typing
it needs and 11 removed both. Explicit quantization (Q/DQ nodes in the ONNX model) builds int8 on every
version edged supports (8.6 to 11.x), so ``--calib`` goes this one way everywhere: edged's own quantizer
(``int8.quantize_int8``, the ``tensorrt`` target: symmetric int8, heads in float) on the frames, through
the daemon's preprocessing, and the same float-block search as ``edged quantize`` when the first attempt
loses too much. Every batch's engine is built from the same Q/DQ model (the smaller batches are it
rebatched), so they share its scales without a calibration cache.

The Q/DQ model is then checked against the float model on the calibration frames, run the way the daemon
runs them (simulated quantization on ONNX Runtime): every output's values (largest difference, relative
error), and the detections through the daemon's decoder against the accuracy gate (``report.Gate``'s
defaults). A model that fails it is refused with the numbers; ``edged quantize --target tensorrt`` with
separate evaluation frames is the full tool (a report, a gate on unseen frames, its flags).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.daemon.decoders import DecodeOptions
from edged.errors import QuantizeError
from edged.models.package import Manifest, sha256_file

from .frames import Frame
from .int8 import PERCENTILE, quantize_int8
from .report import AccuracyReport, Gate, ModelRun, compare, output_drift, run_model
from .tool import Source, calibration_gate, smaller_batches

logger = logging.getLogger(__name__)

SCORE_THRESHOLD = 0.5  # the decoder threshold for the check, as `edged quantize` defaults


@dataclass(frozen=True)
class QdqModels:
    files: dict[int, Path]  # batch -> the Q/DQ model at that batch
    report: AccuracyReport  # the Q/DQ model against the float one on the calibration frames
    drift: dict[str, dict[str, float]]  # per output: max_abs_diff, relative_error
    record: dict[str, Any]  # the manifest's source.int8


def qdq_for_tensorrt(
    src: Source,
    onnx_files: dict[int, Path],
    frames: Sequence[Frame],
    out_dir: Path,
    threads: int = 0,
    progress: Callable[[str], None] | None = None,
) -> QdqModels:
    """Quantize the largest of `onnx_files` (batch -> float model) on `frames`, check it, and rebatch it to
    the others; the Q/DQ models land in `out_dir` as model.onnx and model.b<N>.onnx."""
    say = progress or (lambda m: logger.info("%s", m))
    largest = max(onnx_files)
    m: Manifest = src.manifest
    spec = m.input.model_copy(update={"shape": [largest, *m.input.shape[1:]]})
    at_largest = m.model_copy(update={"input": spec})
    float_model = onnx_files[largest]
    opts = DecodeOptions(score_threshold=SCORE_THRESHOLD)
    gate, strict = Gate(), calibration_gate(Gate())
    runs: dict[str, ModelRun] = {}

    def judge(candidate: Path) -> bool:
        """As `edged quantize` judges a candidate (half the gate's allowed loss); keeps the runs for the check."""
        if "float" not in runs:
            say(f"the float model on the {len(frames)} calibration frames")
            runs["float"] = run_model(float_model, at_largest, frames, opts, threads, say, keep_outputs=True)
            if not any(runs["float"].detections):
                raise QuantizeError(
                    f"--calib: the float model detects nothing on the {len(frames)} calibration frames (score >= "
                    f"{SCORE_THRESHOLD}), so no int8 model can be checked against it: give frames of the scenes "
                    "the cameras see"
                )
        runs["int8"] = run_model(candidate, at_largest, frames, opts, threads, simulate=True, keep_outputs=True)
        report = compare(frames, runs["float"], runs["int8"], strict)
        say(
            f"on the calibration frames: recall/precision vs float {report.recall_vs_float:.3f}/"
            f"{report.precision_vs_float:.3f}" + (" - passes" if report else " - fails")
        )
        return bool(report)

    say(f"int8 by explicit quantization (Q/DQ) on {len(frames)} calibration frames, then TensorRT builds it")
    qpath = out_dir / "model.onnx"
    q = quantize_int8(float_model, qpath, spec, frames, "tensorrt", (), True, "percentile", judge, say)
    if q.search.startswith("failed"):  # the plain quantization again, which no judged run is of
        runs["int8"] = run_model(qpath, at_largest, frames, opts, threads, simulate=True, keep_outputs=True)
    drift = output_drift(runs["float"], runs["int8"])
    report = compare(frames, runs["float"], runs["int8"], gate)
    values = "; ".join(
        f"{name}: largest difference {d['max_abs_diff']:.4g}, relative error {d['relative_error']:.2%}"
        for name, d in drift.items()
    )
    say(f"the Q/DQ model against the float model, outputs: {values}")
    say(
        f"detections against float: recall {report.recall_vs_float:.3f}, precision {report.precision_vs_float:.3f}, "
        f"mean IoU {report.mean_iou:.3f} ({report.float_detections} float / {report.quant_detections} int8)"
    )
    if not report:
        raise QuantizeError(
            f"{src.model}: the int8 (Q/DQ) model loses too much against the float model on the {len(frames)} "
            f"calibration frames: {'; '.join(report.failures)} (outputs: {values}). Nothing was built. Give more "
            "or more representative --calib frames, or use `edged quantize --target tensorrt --calib … --eval …` "
            "(a report on unseen frames, the gate's flags, --exclude) and build-engine from its package"
        )
    files = {largest: qpath}
    files |= smaller_batches(qpath, at_largest, tuple(sorted(b for b in onnx_files if b != largest)), True, say)
    record = {
        "method": "qdq",
        "by": "edged build-engine --calib: edged's quantizer, target tensorrt (symmetric int8, heads in float)",
        "frames": len(frames),
        "calibration": f"percentile {PERCENTILE}",
        "float_nodes": len(q.float_nodes),
        "search": q.search,
        "float_model_sha256": sha256_file(float_model),
        "check": {
            "frames": len(frames),
            "recall_vs_float": round(report.recall_vs_float, 4),
            "precision_vs_float": round(report.precision_vs_float, 4),
            "mean_iou": round(report.mean_iou, 4),
            "outputs": {k: {n: round(v, 6) for n, v in d.items()} for k, d in drift.items()},
        },
    }
    return QdqModels(dict(sorted(files.items())), report, drift, record)
