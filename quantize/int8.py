"""ONNX -> INT8 (QDQ) with ONNX Runtime's static quantizer, and ONNX -> FP16.

Calibration frames go through the daemon's own preprocessing, so the quantizer sees exactly the
tensors the device will feed. Weights are quantized per channel. The scheme depends on the target:

- ``cpu`` (ONNX Runtime): uint8 activations, int8 weights with a reduced range (7 bits). ONNX
  Runtime's u8s8 kernels use VPMADDUBSW on x86 CPUs without VNNI, whose 16-bit intermediate sums
  saturate with full-range weights: on this project's AVX2 machine that took PicoDet's recall
  against its float self from 0.92 to 0.10. 7-bit weights cannot saturate (ONNX Runtime's
  quantization guide recommends exactly this) and keep the fast kernels: PicoDet ran 1.42x float
  on one thread where u8u8 (the other cure) managed 1.15x.
- ``tensorrt``: int8 activations and weights, symmetric (zero points 0), which is what TensorRT's
  explicit quantization consumes. Evaluated on a CPU as simulated quantization (Q/DQ as float
  arithmetic), since ONNX Runtime's int8 kernels are not what the device will run.

Detection heads stay in float: the last compute layer on each path to an output (often a conv whose
one output tensor carries box offsets in pixels and class logits side by side, which one int8 scale
cannot hold both of) and the cheap tail after it (reshape, split, sigmoid, concat, anchor arithmetic).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from edged.daemon.capture.preprocess import Preprocessor
from edged.errors import QuantizeError
from edged.models.package import InputSpec
from edged.progress import Eta

from .frames import Frame

logger = logging.getLogger(__name__)

Target = Literal["cpu", "tensorrt"]
Method = Literal["minmax", "entropy", "percentile"]
PERCENTILE = 99.99  # of |activation| over the calibration frames; 99.999 (ORT's default) keeps outliers
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
MIN_OPSET = 13  # per-channel QuantizeLinear / DequantizeLinear need an axis


@dataclass(frozen=True)
class Quantized:
    path: Path
    float_nodes: list[str]  # kept in float on purpose (heads and tails, and any named by the user)
    opset: int
    target: Target
    search: str  # what the float-block search did


def head_nodes(model: onnx.ModelProto, include_heads: bool = True) -> list[str]:
    """Names of the nodes between each graph output and the last compute layer before it (that layer
    too, when `include_heads`)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    initializers = {i.name for i in model.graph.initializer}
    found: list[str] = []
    seen: set[str] = set()
    stack = [o.name for o in model.graph.output]
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in COMPUTE_OPS:
            if include_heads:
                found.append(node.name)
            continue
        found.append(node.name)
        stack.extend(i for i in node.input if i and i not in initializers)
    return found


def prefix_nodes(model: onnx.ModelProto, input_name: str) -> list[str]:
    """The nodes between a folded graph's pixel input and its first compute layers: every node all of whose
    non-constant inputs come from the pixels through such nodes (casts, transposes, gathers, reshapes, the
    scale and mean/std arithmetic), stopping at compute layers."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    reached = {input_name}
    found: list[str] = []
    for node in model.graph.node:  # topologically sorted (ONNX requires it)
        live = [i for i in node.input if i and i not in consts]
        if node.op_type in COMPUTE_OPS or not live or not all(i in reached for i in live):
            continue
        found.append(node.name)
        reached.update(node.output)
    return found


def _name_nodes(model: onnx.ModelProto) -> None:
    names = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{i}"
            while candidate in names:
                candidate += "_"
            node.name = candidate
            names.add(candidate)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def prepare(src: Path, dst: Path) -> onnx.ModelProto:
    """Opset >= 13, shapes inferred, constants folded (ONNX Runtime's pre-processing), every node named."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        model = onnx.load(str(src))
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise QuantizeError(f"{src}: not a loadable ONNX model: {exc}") from exc
    if _opset(model) < MIN_OPSET:
        logger.info("%s: opset %d -> %d for per-channel quantization", src.name, _opset(model), MIN_OPSET)
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:
            raise QuantizeError(f"{src}: cannot upgrade opset {_opset(model)} -> {MIN_OPSET}: {exc}") from exc
    tmp = dst.with_suffix(".opset.onnx")
    onnx.save(model, str(tmp))
    try:
        quant_pre_process(str(tmp), str(dst), skip_symbolic_shape=True)
    except Exception as exc:
        raise QuantizeError(f"{src}: ONNX Runtime's quantization pre-processing failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    model = onnx.load(str(dst))
    _name_nodes(model)
    onnx.save(model, str(dst))
    return model


def calibration_batches(spec: InputSpec, frames: Sequence[Frame]) -> list[np.ndarray]:
    """Frames preprocessed as the daemon does, in fixed batches (the last one filled by repeating)."""
    pre = Preprocessor(spec)
    rows = []
    for f in frames:
        row = pre.new_row()
        pre.run(f.image, row)
        rows.append(row)
    n = -(-len(rows) // spec.batch)
    return [np.stack([rows[(b * spec.batch + i) % len(rows)] for i in range(spec.batch)]) for b in range(n)]


Judge = Callable[[Path], bool]  # a quantized model -> does it keep enough accuracy?
SEARCH_FRACTIONS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)


def quantize_int8(
    src: Path,
    dst: Path,
    spec: InputSpec,
    calib: Sequence[Frame],
    target: Target = "cpu",
    exclude: Sequence[str] = (),
    keep_heads_float: bool = True,
    method: Method = "percentile",
    judge: Judge | None = None,
    progress: Callable[[str], None] | None = None,
) -> Quantized:
    """Quantize `src` into `dst`. With a `judge`, and when the first attempt fails it, search for a
    block of layers to keep in float as Polygraphy's ``debug precision`` bisects: the last, then the
    first, 1/32, 1/16, ... 1/2 of the graph's nodes, taking the first block that passes. Errors
    compound towards the boxes in some models (BlazeFace) and start in the stem in others (PicoDet)."""
    say = progress or (lambda m: logger.info("%s", m))
    batches = calibration_batches(spec, calib)
    with tempfile.TemporaryDirectory(prefix="edged-quant-") as tmpdir:
        prepared = Path(tmpdir) / "prepared.onnx"
        say(f"preparing {src.name} (opset, shapes, constant folding)")
        model = prepare(src, prepared)
        names = [n.name for n in model.graph.node]
        unknown = [n for n in exclude if n not in set(names)]
        if unknown:
            raise QuantizeError(f"--exclude names nodes this model does not have: {', '.join(unknown)}")
        base = list(dict.fromkeys([*(head_nodes(model) if keep_heads_float else []), *exclude]))
        if spec.folded is not None:  # the folded preprocessing stays float: Q/DQ lands where the unfolded input had it
            folded = prefix_nodes(model, spec.name)
            say(f"keeping the folded preprocessing ({len(folded)} node(s)) in float")
            base = list(dict.fromkeys([*base, *folded]))
        say(f"keeping {len(base)} head/tail node(s) in float; calibrating on {len(calib)} frames")
        _quantize(prepared, dst, spec, batches, base, target, method, say, eta=True)
        keep, searched = base, "not needed"
        if judge is not None and not judge(dst):
            keep, searched = _search(prepared, dst, spec, batches, base, names, target, method, judge, say)
    return Quantized(dst, keep, max(MIN_OPSET, _opset(model)), target, searched)


def _search(
    prepared: Path,
    dst: Path,
    spec: InputSpec,
    batches: list[np.ndarray],
    base: list[str],
    names: list[str],
    target: Target,
    method: Method,
    judge: Judge,
    say: Callable[[str], None],
) -> tuple[list[str], str]:
    order = [n for n in names if n not in set(base)]
    trial = dst.with_name(dst.stem + ".trial.onnx")
    # each candidate is a calibration and a judgement; the search stops at the first that passes
    eta = Eta(say, "search", 2 * len(SEARCH_FRACTIONS), "candidates", upper_bound=True)
    for fraction in SEARCH_FRACTIONS:
        k = max(1, round(len(order) * fraction))
        for where, block in (("last", order[-k:]), ("first", order[:k])):
            say(f"search: the {where} {fraction:.0%} of nodes ({k}) in float")
            _quantize(prepared, trial, spec, batches, base + block, target, method, say)
            passed = judge(trial)
            eta.advance()
            if passed:
                os.replace(trial, dst)
                return base + block, f"the {where} {fraction:.1%} of nodes ({k}) kept in float"
    trial.unlink(missing_ok=True)
    say("search: no block up to half the graph passes; keeping the plain quantization")
    _quantize(prepared, dst, spec, batches, base, target, method, say)
    return base, "failed: no block up to half of the graph in float passes"


def _quantize(
    prepared: Path,
    dst: Path,
    spec: InputSpec,
    batches: list[np.ndarray],
    keep: list[str],
    target: Target,
    method: Method,
    say: Callable[[str], None],
    eta: bool = False,
) -> None:
    """One quantization of `prepared` into `dst`; `eta`: say the calibration's progress (a search's candidates
    calibrate quietly: the search says its own)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    stdout = sys.stdout

    def say_out(line: str) -> None:  # progress reaches the caller's stdout (a print) past the redirect below
        with contextlib.redirect_stdout(stdout):
            say(line)

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        """One batch per collection round (CalibStridedMinMax=1): the calibrators otherwise keep every
        intermediate tensor of every batch (14 GB for 16 PicoDet frames) before reducing them."""

        def __init__(self) -> None:
            self._it: Iterator[int] = iter(())
            self._eta = Eta(say_out, "calibrating", len(batches), "batches") if eta and batches else None
            self._pending = False  # a batch was handed out: the next call means the model has run it

        def __len__(self) -> int:
            return len(batches)

        def set_range(self, start_index: int, end_index: int) -> None:
            self._it = iter(range(start_index, end_index))

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self._pending and self._eta is not None:
                self._eta.advance()
            i = next(self._it, None)
            self._pending = i is not None
            return None if i is None else {spec.name: batches[i]}

    symmetric = target == "tensorrt"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the percentile calibrator print()s its settings
            quantize_static(
                str(prepared),
                str(dst),
                Reader(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                reduce_range=not symmetric,  # 7-bit weights on CPUs: no u8s8 saturation
                nodes_to_exclude=keep,
                calibrate_method={
                    "minmax": CalibrationMethod.MinMax,
                    "entropy": CalibrationMethod.Entropy,
                    "percentile": CalibrationMethod.Percentile,
                }[method],
                extra_options={
                    "ActivationSymmetric": symmetric,
                    "WeightSymmetric": True,
                    "CalibPercentile": PERCENTILE,
                    "CalibStridedMinMax": 1,
                },
            )
    except Exception as exc:  # the quantizer raises bare Exceptions and ORT errors alike
        raise QuantizeError(f"{prepared.name}: ONNX Runtime's quantizer failed: {exc}") from exc


def convert_fp16(src: Path, dst: Path) -> Path:
    """Weights and activations in float16; inputs and outputs stay float32 (casts at the edges), so the
    daemon's preprocessing and decoders are unchanged. For GPU targets: CPUs run float16 slowly or not."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        model = onnx.load(str(src))
        half = convert_float_to_float16(model, keep_io_types=True)
        onnx.save(half, str(dst))
    except Exception as exc:
        raise QuantizeError(f"{src}: float16 conversion failed: {exc}") from exc
    return dst
