"""``edged quantize`` (INT8 / FP16 behind an accuracy gate) and ``edged build-engine`` (TensorRT)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = sub.add_parser(
        "quantize",
        help="INT8 (QDQ) or FP16 model package from a float ONNX model, behind an accuracy gate",
        description="Quantize a float ONNX model with calibration frames run through the daemon's own "
        "preprocessing, then compare it with the float model on evaluation frames through the daemon's "
        "decoder (and against ground truth where the frames have it). The package is written only when "
        "the report passes the gate. Exit 0 passed, 4 gate failed (nothing written), 1 error.",
        epilog="frames: a folder of images or a video; ground truth (edged.groundtruth/1) is read from "
        "VIDEO.json or FOLDER/groundtruth.json when present.\n"
        "example: edged quantize ~/.cache/edged/demo/packages/picodet-layout --calib pages.mp4 "
        "--eval documents.mp4 --out picodet-int8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("model", type=Path, help="a model package (folder or tar), or an .onnx file with --spec")
    q.add_argument("--spec", type=Path, help="manifest giving input spec, decoder and labels for a bare .onnx")
    q.add_argument("--calib", type=Path, help="calibration frames (INT8 only)")
    q.add_argument("--eval", type=Path, required=True, dest="evaluate", help="evaluation frames")
    q.add_argument("--out", type=Path, required=True, help="folder for the new package (must not exist)")
    q.add_argument("--precision", choices=("int8", "fp16"), default="int8")
    q.add_argument(
        "--target",
        choices=("cpu", "tensorrt"),
        default="cpu",
        help="cpu: u8 asymmetric for ONNX Runtime; tensorrt: symmetric s8 Q/DQ for explicit quantization "
        "(evaluated as simulated quantization). Default cpu",
    )
    q.add_argument(
        "--calibration",
        choices=("minmax", "percentile", "entropy"),
        default="percentile",
        help="activation ranges: percentile (99.99 %% of |x|, default), minmax or entropy",
    )
    q.add_argument(
        "--no-search",
        action="store_true",
        help="do not search for a block of layers to keep in float when the first attempt fails the gate",
    )
    q.add_argument("--calib-frames", type=int, default=64, metavar="N", help="frames spread over --calib (64)")
    q.add_argument("--eval-frames", type=int, metavar="N", help="frames spread over --eval (default all)")
    q.add_argument("--exclude", nargs="+", default=[], metavar="NODE", help="node names to keep in float")
    q.add_argument(
        "--quantize-heads",
        action="store_true",
        help="also quantize the detection heads and the tail after them (kept in float by default)",
    )
    q.add_argument("--score-threshold", type=float, default=0.5, help="decoder threshold for the report (0.5)")
    for flag, dest, text in (
        ("--min-agreement", "min_agreement", "recall and precision against the float model (0.90)"),
        ("--min-iou", "min_mean_iou", "mean IoU of matched detections (0.80)"),
        ("--max-recall-drop", "max_recall_drop", "recall drop against ground truth (0.03)"),
        ("--max-precision-drop", "max_precision_drop", "precision drop against ground truth (0.05)"),
    ):
        q.add_argument(flag, dest=dest, type=float, metavar="X", help=f"gate: {text}")
    q.add_argument("--version", type=int, help="version of the new package (default: the float one's + 1)")
    q.add_argument("--report", type=Path, help="also write the report as JSON here")
    q.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads for the evaluation (0: all)")
    q.add_argument("--force", action="store_true", help="write the package even when the gate fails")
    q.add_argument(
        "--batch",
        help="fixed batches the package carries, e.g. 1,4 (the largest is the model's own; default: the source's)",
    )
    q.add_argument(
        "--fold",
        action="store_true",
        help="fold the preprocessing into the graph first (as `edged model fold`, value-checked against the float "
        "model): the package takes uint8 pixels, calibration and the gate feed it uint8 rows",
    )
    q.set_defaults(func=_quantize)

    be = sub.add_parser(
        "build-engine",
        help="TensorRT engine package from an ONNX model (on a GPU machine of the target type)",
        description="Build a fixed-batch TensorRT engine (FP16, or INT8 from a QDQ model made with "
        "`edged quantize --target tensorrt` or from a float model and --calib frames) and package it with the "
        "facts it needs: TensorRT version, "
        "compute capability, L4T release, platform, batch, device memory. A model with several fixed batches "
        "(`edged model init --batch 1,4`) gets one engine per batch, each built with the same precision and "
        "options (the daemon runs the smallest that covers the frames ready). The ONNX model rides along so a "
        "device that cannot load the engine can rebuild it. Needs tensorrt and a CUDA binding "
        "(cuda-python: pip install 'edged[tensorrt]' on top of JetPack's TensorRT).",
    )
    be.add_argument("model", type=Path, help="a model package (folder or tar), or an .onnx file with --spec")
    be.add_argument("--spec", type=Path, help="manifest giving input spec, decoder and labels for a bare .onnx")
    be.add_argument("--out", type=Path, required=True, help="folder for the engine package (must not exist)")
    be.add_argument(
        "--precision",
        choices=("fp16", "int8", "fp32"),
        help="default: the model's own precision on TensorRT >= 10.12 (strongly typed), before: int8 for QDQ "
        "models, else fp16",
    )
    be.add_argument("--workspace-mb", type=int, default=1024, help="builder workspace pool limit (1024)")
    be.add_argument("--timing-cache", type=Path, help="read and update this timing cache (faster rebuilds)")
    be.add_argument(
        "--dla-core", type=int, help="build for this DLA core, with GPU fallback (fp16 or int8 only; AGX and NX Orin)"
    )
    be.add_argument(
        "--opt-level",
        type=int,
        choices=range(6),
        metavar="0-5",
        help="builder optimization level, as trtexec's --builderOptimizationLevel (TensorRT's default 3)",
    )
    be.add_argument(
        "--version-compatible",
        action="store_true",
        help="the engine also runs on newer TensorRT of the same major version (trtexec --versionCompatible)",
    )
    be.add_argument(
        "--hardware-compatibility",
        choices=("none", "ampere+", "same-cc"),
        default="none",
        help="the GPUs the engine runs on: this compute capability (none, default), any Ampere or newer "
        "(ampere+), or the same compute capability on another GPU (same-cc, TensorRT 10)",
    )
    be.add_argument(
        "--sparsity", action="store_true", help="use 2:4 structured-sparse weights where found (trtexec --sparsity)"
    )
    be.add_argument("--no-onnx", action="store_true", help="do not carry the ONNX model in the package")
    be.add_argument(
        "--batch",
        help="build these of the model's fixed batches only, e.g. 1,4 (default: every batch it carries)",
    )
    be.add_argument(
        "--calib",
        type=Path,
        help="int8 from a float model: calibration frames (a folder of images or a video). edged quantizes the "
        "model with Q/DQ on them (as `edged quantize --target tensorrt`, with its float-block search), checks "
        "it against the float model on the same frames, and builds the engine from it on every TensorRT "
        "version; not trtexec's --calib, which reads a calibration cache",
    )
    be.add_argument("--calib-frames", type=int, default=64, metavar="N", help="frames spread over --calib (64)")
    be.add_argument(
        "--fold",
        action="store_true",
        help="fold the preprocessing into the ONNX graph first (value-checked against the unfolded model): the "
        "engine's input binding is uint8 pixels (NHWC, BGR), so the host hands the GPU bytes, not float32",
    )
    be.set_defaults(func=_build_engine)


def _quantize(args: argparse.Namespace) -> int:
    import json

    from edged.models.init import parse_batches
    from edged.quantize.report import Gate
    from edged.quantize.tool import quantize

    if args.precision == "int8" and args.calib is None:
        print("edged quantize: error: --calib is required for int8", file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in ("min_agreement", "min_mean_iou", "max_recall_drop", "max_precision_drop")}
    gate = Gate(**{k: v for k, v in given.items() if v is not None})
    outcome = quantize(
        args.model,
        args.calib,
        args.evaluate,
        args.out,
        spec=args.spec,
        precision=args.precision,
        target=args.target,
        exclude=tuple(args.exclude),
        keep_heads_float=not args.quantize_heads,
        method=args.calibration,
        search=not args.no_search,
        calib_frames=args.calib_frames,
        eval_frames=args.eval_frames,
        score_threshold=args.score_threshold,
        gate=gate,
        version=args.version,
        force=args.force,
        threads=args.threads,
        batches=parse_batches(args.batch) if args.batch else None,
        progress=lambda m: print(f"quantize: {m}", file=sys.stderr, flush=True),
        fold=args.fold,
    )
    print(outcome.report.format())
    if args.report:
        args.report.write_text(json.dumps(outcome.report.to_json(), indent=2) + "\n")
    if outcome.package is None:
        print(f"quantize: gate failed; no package written to {args.out} (--force writes it anyway)", file=sys.stderr)
        return 4
    fold = outcome.package.manifest.source.get("quantize", {}).get("fold")
    if fold:
        worst = max(fold["max_abs_diff"].values())
        print(f"quantize: folded: takes uint8 pixels {outcome.package.manifest.input.shape}; the folded float model "
              f"gave the unfolded one's outputs (largest difference {worst:.3g} on {fold['rows']} rows)")  # fmt: skip
    print(f"quantize: wrote {outcome.package.ref} ({outcome.package.manifest.precision}) to {outcome.package.root}")
    return 0 if outcome.report else 4


def _build_engine(args: argparse.Namespace) -> int:
    from edged.daemon.backends import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason:
        print(
            f"edged build-engine: {reason}. Engines are built on a machine with TensorRT and an NVIDIA GPU, "
            "ideally a device of the target type (a Jetson of the same model and JetPack).",
            file=sys.stderr,
        )
        return 1
    from edged.daemon.backends.tensorrt.build import BuilderOptions
    from edged.models.init import parse_batches
    from edged.quantize.engine import build_engine_package

    options = BuilderOptions(
        optimization_level=args.opt_level,
        version_compatible=args.version_compatible,
        hardware_compatibility=args.hardware_compatibility,
        sparsity=args.sparsity,
    )
    pkg = build_engine_package(
        args.model,
        args.out,
        spec=args.spec,
        precision=args.precision,
        workspace_mb=args.workspace_mb,
        timing_cache=args.timing_cache,
        dla_core=args.dla_core,
        carry_onnx=not args.no_onnx,
        calib=args.calib,
        calib_frames=args.calib_frames,
        options=options,
        batches=parse_batches(args.batch) if args.batch else None,
        progress=lambda m: print(f"build-engine: {m}", file=sys.stderr, flush=True),
        fold=args.fold,
    )
    c = pkg.manifest.compatibility
    print(
        f"build-engine: wrote {pkg.ref} ({pkg.manifest.precision}, batch {','.join(map(str, pkg.batch_paths))}, "
        f"TensorRT {c['tensorrt']}, sm {c['compute_capability']}, device memory {c['device_memory_bytes'] >> 20} "
        f"MB) to {pkg.root}"
    )
    return 0
