"""``edged model init MODEL.onnx``: a complete package from a detector's ONNX export, as shipped.

Steps, each reported with its reason (`InitResult.decisions`) and with what the user should check
(`InitResult.checks`):

1. read the graph's one image input and the exporter's metadata (Ultralytics writes ``names``,
   ``imgsz``, ``stride``, ``task``, ``batch`` into ``metadata_props``; RapidAI's PicoDet exports
   their labels as ``character``);
2. fix the input: dynamic batch/height/width from ``--batch``/``--input-size``, else the metadata,
   else batch 1 (onnxruntime's ``make_input_shape_fixed``); a batch baked into the graph
   (BlazeFace) is changed by ``rebatch``; ``--batch 1,4`` also fixes the export at each smaller batch
   (``model.b1.onnx``, listed in the manifest's ``extra_batches``), checked to give the same outputs;
3. run the fixed model once in ONNX Runtime: every output shape is then concrete (an export that
   computes its anchor count through ``Shape``/``Gather``, as Ultralytics' ``dynamic=True`` does, gets
   the shapes it really has declared on its outputs), and the model is known to load; then **prove it on
   values**: each batch written, run on the probe rows (``batchcheck.py``), must give in every row of
   every output what the source export gives for that image alone, else nothing is written;
4. pick the decoder from those shapes (detect.py) or take ``--decoder``; the preprocessing defaults
   to that family's own (colour, scale, mean/std, letterbox, pad), each overridable;
5. labels from ``--labels FILE``, else the metadata, checked against the output's class count;
6. write the package (model.onnx, labels.txt, manifest.json with every file's size and sha256)
   through package.py, so it verifies like any other: laid out in a folder beside ``--out``, handed to
   the caller's ``finish`` (the CLI adds the golden pair there and checks the model against the daemon's
   decoder: it needs the daemon's preprocessing), and only then renamed to ``--out``. A failure at any
   step leaves nothing under either name.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.errors import Code, PackageError

from ..package import Package, publish_package, read_labels, sha256_file
from .recognise import PREPROCESS, PREPROCESS_WHY, STAGE_DECODERS, Detected, detect


@dataclass(frozen=True)
class InitOptions:
    model: Path
    out: Path | None = None
    name: str | None = None
    version: int = 1
    decoder: str | None = None
    batch: int | None = None  # the largest fixed batch (input.shape[0], model.onnx)
    input_size: tuple[int, int] | None = None  # width, height
    labels: Path | None = None
    color: str | None = None  # RGB | BGR
    letterbox: str | None = None  # center | topleft
    extra_batches: tuple[int, ...] = ()  # smaller fixed batches, each its own model.b<N>.onnx (`--batch 1,4`)
    pad_value: int | None = None  # the letterbox's grey (0-255); default: the decoder family's
    finish: Callable[[Path], None] | None = None  # run on the laid-out package before it takes its name


@dataclass
class InitResult:
    package: Package
    detected: Detected
    decisions: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)


def parse_size(text: str) -> tuple[int, int]:
    """``640`` or ``640x480`` (width x height) -> (width, height)."""
    m = re.fullmatch(r"(\d+)(?:[xX,](\d+))?", text.strip())
    if not m or int(m.group(1)) <= 0 or (m.group(2) is not None and int(m.group(2)) <= 0):
        raise PackageError(
            f"--input-size {text!r}: want W or WxH in pixels (e.g. 640 or 640x384)", code=Code.INIT_FAILED
        )
    w = int(m.group(1))
    return w, int(m.group(2)) if m.group(2) else w


def parse_batches(text: str) -> tuple[int, ...]:
    """``4`` or ``1,2,4`` -> the distinct batches, smallest first; each >= 1."""
    try:
        batches = sorted({int(part) for part in text.split(",")})
    except ValueError:
        batches = []
    if not batches or batches[0] < 1:
        raise PackageError(f"--batch {text!r}: want B or a list such as 1,2,4 (each >= 1)", code=Code.INIT_FAILED)
    return tuple(batches)


def read_metadata(props: dict[str, str]) -> dict[str, Any]:
    """Ultralytics' metadata_props (Python literals as strings) -> names, imgsz, stride, task, batch."""
    out: dict[str, Any] = {}
    for key in ("names", "imgsz", "stride", "task", "batch", "nms"):
        if key in props:
            try:
                out[key] = ast.literal_eval(props[key])
            except (ValueError, SyntaxError):
                out[key] = props[key]
    if isinstance(out.get("names"), dict):
        names = out["names"]
        out["names"] = [str(names[k]) for k in sorted(names)]
    elif "character" in props:  # RapidAI / PaddleOCR exports: one label per line
        out["names"] = [n for n in props["character"].splitlines() if n.strip()]
    if "character" in props:  # every line, blank ones too: a CTC recogniser's class k is line k-1
        out["charset"] = props["character"].splitlines()
    return out


def init_package(opts: InitOptions) -> InitResult:
    import numpy as np
    import onnx

    decisions: list[str] = []
    checks: list[str] = []
    try:
        model = onnx.load(str(opts.model))
    except Exception as exc:  # protobuf's DecodeError, OSError: translated at the boundary
        raise PackageError(f"{opts.model}: not an ONNX model ONNX can read: {exc}", code=Code.INIT_FAILED) from exc
    props = {p.key: p.value for p in model.metadata_props}
    meta = read_metadata(props)
    ultralytics = "names" in meta and ("imgsz" in meta or "stride" in meta or "task" in meta)
    if meta:
        decisions.append(f"metadata: {', '.join(sorted(meta))}" + (" (Ultralytics)" if ultralytics else ""))
    if ultralytics and meta.get("task", "detect") != "detect":
        checks.append(f"the metadata says task {meta['task']!r}; edged decodes detections only")
    inits = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    if len(inputs) != 1:
        raise PackageError(
            f"{opts.model}: {len(inputs)} inputs ({[v.name for v in inputs]}); edged feeds one image tensor",
            code=Code.INIT_FAILED,
        )
    inp = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
    if len(dims) != 4:
        raise PackageError(f"{opts.model}: input {inp.name!r} has {len(dims)} dimensions, not 4", code=Code.INIT_FAILED)
    layout = "NHWC" if dims[3] == 3 and dims[1] != 3 else "NCHW"
    hi, wi = (1, 2) if layout == "NHWC" else (2, 3)
    decisions.append(f"input {inp.name!r} {_show(inp)}: {layout} (channels at axis {3 if layout == 'NHWC' else 1})")
    batch, (width, height) = _fixed_size(opts, dims, hi, wi, meta, decisions)
    original = onnx.ModelProto()
    original.CopyFrom(model)  # _fix_input fixes a dynamic graph in place; each batch starts from the export
    model = _fix_input(model, inp.name, dims, layout, batch, width, height, decisions)
    dtype = helper_dtype(inp.type.tensor_type.elem_type)
    if dtype not in ("float32", "float16", "uint8"):
        raise PackageError(f"{opts.model}: input {inp.name!r} is {dtype}; edged feeds float32, float16 or uint8")
    shapes = _run_once(model, inp.name, np.zeros(_shape(layout, batch, height, width), dtype))
    _declare_outputs(model, shapes, decisions)
    extra = _extra_batches(opts, original, inp.name, dims, layout, batch, (width, height), dtype, shapes, decisions)
    _prove(
        original, inp.name, dims[0] or 1, {batch: model, **extra}, _shape(layout, 1, height, width), dtype, decisions
    )
    decisions.append("output shapes with the fixed input: " + ", ".join(f"{n} {list(s)}" for n, s in shapes.items()))
    found = detect(shapes, height, width, ultralytics, opts.decoder, meta.get("charset"))
    decisions.append(f"decoder {found.decoder}: {found.why}")
    checks += found.checks
    labels = _labels(opts, meta, found, decisions, checks)
    pre = dict(PREPROCESS[found.decoder])
    decisions.append(f"preprocessing: {PREPROCESS_WHY[found.decoder]}")
    if opts.color:
        pre["color"] = opts.color
        decisions.append(f"colour {opts.color} (--color)")
    else:
        checks.append(f"colour order {pre['color']} is the {found.decoder} family's default; --color if trained other")
    if opts.letterbox:
        pre["resize"] = "letterbox"
        pre["letterbox"] = opts.letterbox
        decisions.append(f"letterbox {opts.letterbox} (--letterbox)")
    if opts.pad_value is not None:
        if not 0 <= opts.pad_value <= 255:
            raise PackageError(f"--pad-value {opts.pad_value}: want 0-255", code=Code.INIT_FAILED)
        pre["pad_value"] = opts.pad_value
        decisions.append(f"letterbox pad value {opts.pad_value} (--pad-value)")
    elif pre.get("resize") == "letterbox":
        checks.append(f"letterbox pad value {pre['pad_value']} is the {found.decoder} family's; --pad-value if not")
    if pre.get("letterbox") == "center":
        del pre["letterbox"]  # the default: absent from the manifest
    name = opts.name or _name(opts.model.stem)
    out = opts.out or Path(name)
    if out.exists() and any(out.iterdir()):
        raise PackageError(f"{out}: exists and is not empty; give --out or remove it", code=Code.INIT_FAILED)
    staging = out.with_name(out.name + ".init")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        onnx.save(model, str(staging / "model.onnx"))
        files = {"model.onnx": staging / "model.onnx"}
        for b, small in extra.items():
            onnx.save(small, str(staging / f"model.b{b}.onnx"))
            files[f"model.b{b}.onnx"] = staging / f"model.b{b}.onnx"
        if labels:
            (staging / "labels.txt").write_text("\n".join(labels) + "\n")
            files["labels.txt"] = staging / "labels.txt"
        manifest = {
            "schema": "edged.model/1",
            "name": name,
            "version": opts.version,
            "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "kind": "onnx",
            "model_file": "model.onnx",
            "extra_batches": [{"batch": b, "file": f"model.b{b}.onnx"} for b in extra],
            "labels_file": "labels.txt" if labels else None,
            "input": {
                "name": inp.name,
                "shape": _shape(layout, batch, height, width),
                "dtype": dtype,
                "layout": layout,
                **pre,
            },
            "decoder": {"type": found.decoder, "params": found.params},
            **({"role": "stage"} if found.decoder in STAGE_DECODERS else {}),
            "labels": [] if found.decoder == "ctc" else labels,  # a charset: labels.txt alone (6k lines)
            "precision": "fp32",
            "source": {
                "file": opts.model.name,
                "sha256": sha256_file(opts.model),
                "made_by": "edged model init",
                **({"metadata": {k: v for k, v in props.items() if len(v) < 4096}} if props else {}),
            },
        }
        pkg = publish_package(out, manifest, files, opts.finish)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    decisions.append(f"package {pkg.ref} -> {out}")
    return InitResult(pkg, found, decisions, checks)


def _extra_batches(
    opts: InitOptions,
    original: Any,
    name: str,
    dims: list[int | None],
    layout: str,
    batch: int,
    size: tuple[int, int],
    dtype: str,
    shapes: dict[str, tuple[int, ...]],
    decisions: list[str],
) -> dict[int, Any]:
    """The model at each smaller batch of `--batch 1,..,B`, fixed from the export as the largest was; each must
    give the largest's outputs with its own batch (ONNX Runtime runs it once to show it)."""
    import numpy as np

    out: dict[int, Any] = {}
    for b in sorted(set(opts.extra_batches)):
        if b >= batch or b < 1:
            raise PackageError(f"--batch: {b} must be between 1 and the largest batch {batch}", code=Code.INIT_FAILED)
        quiet: list[str] = []
        copy = type(original)()
        copy.CopyFrom(original)
        small = _fix_input(copy, name, dims, layout, b, size[0], size[1], quiet)
        got = _run_once(small, name, np.zeros(_shape(layout, b, size[1], size[0]), dtype))
        _declare_outputs(small, got, quiet)
        want = {n: (b, *s[1:]) for n, s in shapes.items()}
        if got != want:
            raise PackageError(
                f"at batch {b} the outputs are {got}, at batch {batch} {shapes}: the batch is not the outputs' "
                "first dimension, so edged cannot carry this model at several batches",
                code=Code.INIT_FAILED,
            )
        out[b] = small
    if out:
        decisions.append(
            f"also batch {', '.join(map(str, out))} (model.b<N>.onnx): the daemon runs the smallest batch that "
            "covers the frames ready, so fewer cameras than the largest batch do not pay for padding rows"
        )
    return out


def helper_dtype(elem_type: int) -> str:
    from onnx import helper

    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, TypeError, ValueError):
        return f"onnx type {elem_type}"


def _shape(layout: str, b: int, h: int, w: int) -> list[int]:
    return [b, h, w, 3] if layout == "NHWC" else [b, 3, h, w]


def _show(v: Any) -> str:
    return "[" + ", ".join(d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim) + "]"


def _name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "model"
    return name[:64]


def _fixed_size(
    opts: InitOptions, dims: list[int | None], hi: int, wi: int, meta: dict[str, Any], decisions: list[str]
) -> tuple[int, tuple[int, int]]:
    if opts.batch is not None:
        if opts.batch < 1:
            raise PackageError(f"--batch {opts.batch}: must be >= 1", code=Code.INIT_FAILED)
        batch, why = opts.batch, "--batch"
    elif dims[0]:
        batch, why = dims[0], "as exported"
    elif isinstance(meta.get("batch"), int) and meta["batch"] > 0:
        batch, why = meta["batch"], "the metadata's batch"
    else:
        batch, why = 1, "dynamic in the graph; 1 by default (--batch B for more cameras per inference)"
    decisions.append(f"batch {batch}: {why}")
    h, w = dims[hi], dims[wi]
    if opts.input_size is not None:
        size, why = opts.input_size, "--input-size"
        if h and w and (w, h) != size:
            raise PackageError(
                f"--input-size {size[0]}x{size[1]}: the graph's input is fixed at {w}x{h}", code=Code.INIT_FAILED
            )
    elif h and w:
        size, why = (w, h), "as exported"
    elif "charset" in meta and not (h or w) and "imgsz" not in meta:
        size, why = (320, 48), "PP-OCR's recogniser input 3x48x320 (a charset in the metadata, no imgsz)"
    elif "imgsz" in meta:
        imgsz = meta["imgsz"]
        hw = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
        size, why = (int(hw[1]), int(hw[0])), "the metadata's imgsz"
    else:
        raise PackageError(
            "the input's height/width are dynamic and the model carries no imgsz: give --input-size WxH",
            code=Code.INIT_FAILED,
        )
    decisions.append(f"input size {size[0]}x{size[1]} (width x height): {why}")
    return batch, size


def _fix_input(
    model: Any, name: str, dims: list[int | None], layout: str, batch: int, w: int, h: int, decisions: list[str]
) -> Any:
    import onnx
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    from ..rebatch import rebatch

    shape = _shape(layout, batch, h, w)
    if all(dims) and dims[0] != batch:
        model = rebatch(model, batch)
        decisions.append(f"batch {dims[0]} -> {batch} baked into the graph: rebatched (Concat->Pad, Reshape batch->0)")
        return model
    if all(dims):
        return model
    make_input_shape_fixed(model.graph, name, shape)
    del model.graph.value_info[:]
    fix_output_shapes(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise PackageError(
            f"the graph with its input fixed at {shape} is invalid: {exc}", code=Code.INIT_FAILED
        ) from exc
    decisions.append(f"dynamic input dimensions fixed at {shape} (onnxruntime make_input_shape_fixed)")
    return model


def _session(model: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own Fail/InvalidGraph/... types
        raise PackageError(f"ONNX Runtime cannot load the model: {exc}", code=Code.INIT_FAILED) from exc


def _runner(model: Any, name: str) -> Callable[[Any], dict[str, Any]]:
    sess = _session(model)
    names = [o.name for o in sess.get_outputs()]

    def run(x: Any) -> dict[str, Any]:
        try:
            return dict(zip(names, sess.run(None, {name: x}), strict=True))
        except Exception as exc:  # ORT's own Fail/InvalidArgument/... types
            raise PackageError(
                f"ONNX Runtime cannot run the model at {list(x.shape)}: {exc}", code=Code.INIT_FAILED
            ) from exc

    return run


def _run_once(model: Any, name: str, x: Any) -> dict[str, tuple[int, ...]]:
    return {n: tuple(int(d) for d in v.shape) for n, v in _runner(model, name)(x).items()}


def _declare_outputs(model: Any, shapes: dict[str, tuple[int, ...]], decisions: list[str]) -> None:
    """Write the output shapes ONNX Runtime produced with the fixed input onto the graph's outputs where
    shape inference left them symbolic (an anchor count computed through Shape/Gather/Range, as a dynamic
    Ultralytics export has); a declared fixed dimension that contradicts the run is an error."""
    resolved = []
    for out in model.graph.output:
        seen = shapes.get(out.name)
        if seen is None:
            continue
        dims = out.type.tensor_type.shape.dim
        if dims and len(dims) != len(seen):
            raise PackageError(
                f"output {out.name!r} is declared with {len(dims)} dimensions, ONNX Runtime gives {list(seen)}",
                code=Code.INIT_FAILED,
            )
        if not dims:
            for _ in seen:
                dims.add()
        for d, size in zip(dims, seen, strict=True):
            if d.HasField("dim_value") and d.dim_value != size:
                raise PackageError(
                    f"output {out.name!r} is declared {[x.dim_value or x.dim_param for x in dims]}, ONNX Runtime "
                    f"gives {list(seen)} with the fixed input",
                    code=Code.INIT_FAILED,
                )
            if not d.HasField("dim_value"):
                resolved.append(f"{out.name}[{list(dims).index(d)}] = {size}")
                d.ClearField("dim_param")
                d.dim_value = size
    if resolved:
        decisions.append(
            "output dimensions computed in the graph (not resolved by shape inference) set as ONNX Runtime ran them: "
            + ", ".join(resolved)
        )


def _prove(
    source: Any, name: str, source_batch: int, made: dict[int, Any], row: list[int], dtype: str, decisions: list[str]
) -> None:
    """Each model written (batch -> model) against the source export on values: the probe rows of
    batchcheck.py, the source run `source_batch` images at a time; PackageError(batch_mismatch) naming the
    output and the largest difference when a row differs."""
    from ..batchcheck import check_batches

    ref = _runner(source, name)
    checked = check_batches(
        {b: _runner(m, name) for b, m in made.items()}, (source_batch, ref), row, dtype, where="the model written"
    )
    decisions.append(
        f"batch {', '.join(map(str, checked))} checked on values against the export: every row of every output "
        "equal to what the export gives for that image alone (random images, one per row)"
    )


def _labels(
    opts: InitOptions, meta: dict[str, Any], found: Detected, decisions: list[str], checks: list[str]
) -> list[str]:
    if opts.labels is not None:
        labels, why = read_labels(opts.labels), f"--labels {opts.labels}"
    elif found.decoder == "ctc" and meta.get("charset"):
        labels, why = list(meta["charset"]), "the metadata's charset (`character`, every line)"
    elif meta.get("names"):
        labels, why = list(meta["names"]), "the model's metadata"
    else:
        labels, why = [], ""
    if found.decoder == "ctc" and not labels:
        raise PackageError("a CTC recogniser needs its charset: none in the metadata, give --labels FILE",
                           code=Code.LABELS_MISMATCH)  # fmt: skip
    if labels and found.classes is not None and len(labels) != found.classes:
        raise PackageError(
            f"{len(labels)} labels ({why}), the output has {found.classes} classes", code=Code.LABELS_MISMATCH
        )
    if labels:
        decisions.append(f"{len(labels)} labels from {why}: {', '.join(labels[:5])}{' ...' if len(labels) > 5 else ''}")
    else:
        checks.append("no labels (none in the metadata, no --labels): detections carry their class number as the label")
    return labels
