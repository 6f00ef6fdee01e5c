"""The accuracy report: a quantized model against its float original, through the daemon's own
preprocessing and decoder, on evaluation frames (and against their ground truth where they have it).

Detections match when they have the same label and IoU >= 0.5 (greedy, best score first). The report
is true when every gate holds; ``failures`` says which did not, in words.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edged.daemon.backends import OnnxRuntimeBackend
from edged.daemon.capture.preprocess import Preprocessor, Transform
from edged.daemon.decoders import DecodeOptions, Detection, build_decoder
from edged.models.package import Manifest
from edged.progress import Eta

from .frames import Box, Frame

MATCH_IOU = 0.5


@dataclass(frozen=True)
class Gate:
    """What a quantized model must keep. Agreement is recall and precision against the float model."""

    min_agreement: float = 0.90
    min_mean_iou: float = 0.80
    max_recall_drop: float = 0.03  # against ground truth, where the frames have it
    max_precision_drop: float = 0.05


@dataclass(frozen=True)
class ModelRun:
    detections: list[list[Detection]]  # per frame
    batch_s: list[float]  # backend.infer time of every batch
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)  # every batch's raw outputs, when kept

    @property
    def median_batch_ms(self) -> float:
        return 1000 * statistics.median(self.batch_s)


def run_model(
    model: Path,
    manifest: Manifest,
    frames: Sequence[Frame],
    opts: DecodeOptions,
    threads: int = 0,
    progress: Callable[[str], None] | None = None,
    simulate: bool = False,
    keep_outputs: bool = False,
) -> ModelRun:
    """Run `model` over `frames` the way the daemon does: preprocess rows, fixed batches (the last one
    padded), decode the real rows. `keep_outputs`: also keep every batch's raw outputs (to compare values)."""
    spec = manifest.input
    pre = Preprocessor(spec)
    batch = np.zeros(spec.shape, pre.dtype)
    dets: list[list[Detection]] = []
    times: list[float] = []
    raw: list[dict[str, np.ndarray]] = []
    with OnnxRuntimeBackend(model, threads=threads, optimize=not simulate) as backend:
        decoder = build_decoder(manifest.decoder, spec, manifest.labels, {o.name: o.shape for o in backend.outputs})
        backend.infer({spec.name: batch})  # warm-up, not timed
        n_batches = -(-len(frames) // spec.batch)
        eta = Eta(progress, f"{model.name} on {len(frames)} frames", n_batches, "batches") if progress else None
        for b in range(n_batches):
            chunk = frames[b * spec.batch : (b + 1) * spec.batch]
            transforms: list[Transform] = [pre.run(f.image, batch[i]) for i, f in enumerate(chunk)]
            start = time.perf_counter()
            out = backend.infer({spec.name: batch})
            times.append(time.perf_counter() - start)
            dets.extend(decoder.decode(out, transforms, opts))
            if keep_outputs:
                raw.append({name: np.array(v, copy=True) for name, v in out.items()})
            if eta is not None:
                eta.advance()
    return ModelRun(dets, times, raw)


def iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(a: Sequence[tuple[str, Box]], b: Sequence[tuple[str, Box]]) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matches (index in a, index in b, IoU), `a` taken in the order given."""
    used: set[int] = set()
    out = []
    for i, (la, ba) in enumerate(a):
        best, best_iou = -1, MATCH_IOU
        for j, (lb, bb) in enumerate(b):
            if j in used or lb != la:
                continue
            v = iou(ba, bb)
            if v >= best_iou:
                best, best_iou = j, v
        if best >= 0:
            used.add(best)
            out.append((i, best, best_iou))
    return out


@dataclass
class TruthScores:
    frames: int
    objects: int
    float_recall: float
    float_precision: float
    quant_recall: float
    quant_precision: float


@dataclass
class AccuracyReport:
    frames: int
    float_detections: int
    quant_detections: int
    matched: int
    recall_vs_float: float
    precision_vs_float: float
    mean_iou: float
    score_drift_mean: float
    score_drift_max: float
    float_batch_ms: float
    quant_batch_ms: float
    truth: TruthScores | None
    gate: Gate
    failures: list[str] = field(default_factory=list)

    @property
    def speed_ratio(self) -> float:
        return self.float_batch_ms / self.quant_batch_ms if self.quant_batch_ms > 0 else 0.0

    def __bool__(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "speed_ratio": round(self.speed_ratio, 3), "passed": bool(self)}

    def format(self) -> str:
        lines = [
            f"frames evaluated          {self.frames}",
            f"detections float / quant  {self.float_detections} / {self.quant_detections} ({self.matched} matched)",
            f"recall vs float           {self.recall_vs_float:.3f}   (gate >= {self.gate.min_agreement:.2f})",
            f"precision vs float        {self.precision_vs_float:.3f}   (gate >= {self.gate.min_agreement:.2f})",
            f"mean IoU of matches       {self.mean_iou:.3f}   (gate >= {self.gate.min_mean_iou:.2f})",
            f"score drift mean / max    {self.score_drift_mean:.3f} / {self.score_drift_max:.3f}",
        ]
        if self.truth:
            t = self.truth
            lines += [
                f"ground truth              {t.objects} objects on {t.frames} frames",
                f"  recall float -> quant   {t.float_recall:.3f} -> {t.quant_recall:.3f}"
                f"   (gate: drop <= {self.gate.max_recall_drop:.2f})",
                f"  precision float -> quant {t.float_precision:.3f} -> {t.quant_precision:.3f}"
                f"   (gate: drop <= {self.gate.max_precision_drop:.2f})",
            ]
        else:
            lines.append("ground truth              none on these frames")
        lines.append(
            f"batch time float / quant  {self.float_batch_ms:.1f} / {self.quant_batch_ms:.1f} ms "
            f"(median, same batch): {self.speed_ratio:.2f}x"
        )
        lines.append("PASSED" if self else "FAILED: " + "; ".join(self.failures))
        return "\n".join(lines)


def _pairs(dets: Sequence[Detection]) -> list[tuple[str, Box]]:
    return [(d.label, d.box) for d in sorted(dets, key=lambda d: -d.score)]


def compare(frames: Sequence[Frame], ref: ModelRun, quant: ModelRun, gate: Gate) -> AccuracyReport:
    ious: list[float] = []
    drifts: list[float] = []
    n_ref = n_q = 0
    for fd, qd in zip(ref.detections, quant.detections, strict=True):
        f_sorted = sorted(fd, key=lambda d: -d.score)
        q_sorted = sorted(qd, key=lambda d: -d.score)
        for i, j, v in match(_pairs(f_sorted), _pairs(q_sorted)):
            ious.append(v)
            drifts.append(abs(f_sorted[i].score - q_sorted[j].score))
        n_ref += len(fd)
        n_q += len(qd)
    matched = len(ious)
    report = AccuracyReport(
        frames=len(frames),
        float_detections=n_ref,
        quant_detections=n_q,
        matched=matched,
        recall_vs_float=matched / n_ref if n_ref else 0.0,
        precision_vs_float=matched / n_q if n_q else (1.0 if n_ref == 0 else 0.0),
        mean_iou=statistics.fmean(ious) if ious else 0.0,
        score_drift_mean=statistics.fmean(drifts) if drifts else 0.0,
        score_drift_max=max(drifts, default=0.0),
        float_batch_ms=ref.median_batch_ms,
        quant_batch_ms=quant.median_batch_ms,
        truth=_truth_scores(frames, ref, quant),
        gate=gate,
    )
    report.failures = _judge(report)
    return report


def _truth_scores(frames: Sequence[Frame], ref: ModelRun, quant: ModelRun) -> TruthScores | None:
    idx = [i for i, f in enumerate(frames) if f.truth is not None]
    if not idx:
        return None
    objects = sum(len(frames[i].truth or []) for i in idx)

    def scores(run: ModelRun) -> tuple[float, float]:
        hits = dets = 0
        for i in idx:
            pred = _pairs(run.detections[i])
            hits += len(match(pred, frames[i].truth or []))
            dets += len(pred)
        return (hits / objects if objects else 1.0, hits / dets if dets else 1.0)

    fr, fp = scores(ref)
    qr, qp = scores(quant)
    return TruthScores(len(idx), objects, fr, fp, qr, qp)


def _judge(r: AccuracyReport) -> list[str]:
    g = r.gate
    out = []
    if r.float_detections == 0:
        out.append("the float model found nothing on the evaluation frames, so agreement cannot be judged")
        return out
    if r.recall_vs_float < g.min_agreement:
        out.append(f"recall vs float {r.recall_vs_float:.3f} < {g.min_agreement:.2f}")
    if r.precision_vs_float < g.min_agreement:
        out.append(f"precision vs float {r.precision_vs_float:.3f} < {g.min_agreement:.2f}")
    if r.matched and r.mean_iou < g.min_mean_iou:
        out.append(f"mean IoU {r.mean_iou:.3f} < {g.min_mean_iou:.2f}")
    if r.truth:
        drop = r.truth.float_recall - r.truth.quant_recall
        if drop > g.max_recall_drop:
            out.append(f"ground-truth recall drops {drop:.3f} > {g.max_recall_drop:.2f}")
        pdrop = r.truth.float_precision - r.truth.quant_precision
        if pdrop > g.max_precision_drop:
            out.append(f"ground-truth precision drops {pdrop:.3f} > {g.max_precision_drop:.2f}")
    return out


def output_drift(ref: ModelRun, got: ModelRun) -> dict[str, dict[str, float]]:
    """Every output's values, one model's against the other's over the same batches (both run with
    `keep_outputs`): the largest absolute difference and the relative error ||got - ref|| / ||ref||."""
    if len(ref.outputs) != len(got.outputs) or not ref.outputs:
        raise ValueError("both runs need the raw outputs of the same batches (run_model(keep_outputs=True))")
    out: dict[str, dict[str, float]] = {}
    for name in ref.outputs[0]:
        want = np.concatenate([b[name].ravel() for b in ref.outputs]).astype(np.float64)
        have = np.concatenate([b[name].ravel() for b in got.outputs]).astype(np.float64)
        diff = have - want
        norm = float(np.linalg.norm(want))
        out[name] = {
            "max_abs_diff": float(np.max(np.abs(diff))) if diff.size else 0.0,
            "relative_error": float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff)),
        }
    return out
