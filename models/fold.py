"""Preprocessing folded into the model: the graph takes uint8 pixels, the camera side only letterboxes.

A package's input spec says how a letterboxed BGR frame becomes the model's input: colour order, uint8 to
float, ``(x * scale - mean) / std`` per channel, NHWC to NCHW. Done on the camera side that is four passes
over the frame in numpy/OpenCV on a CPU core, and a float32 row (4 bytes a pixel channel) handed to the engine.
Folded, the same arithmetic is ordinary ONNX nodes in front of the graph, which the engine (ONNX Runtime,
TensorRT) runs where it runs the model:

    pixels uint8 [B, H, W, 3] BGR
      -> Transpose([0, 3, 1, 2])            when the model is NCHW (on bytes: a quarter of the traffic)
      -> Gather(axis 1, [2, 1, 0])          when the model wants RGB (an NHWC model: between two Transposes,
                                            which copy planes, not bytes)
      -> Cast(float32) -> Mul(scale / std) -> Add(-mean / std)   as the daemon computes it (NHWC: on rows
                                            of W*3 values, the constants tiled W times)
      -> Cast(float16)                      when the model takes float16
      -> the model's own input, by its own name

The manifest records it: ``input`` becomes uint8 BGR NHWC pixels named ``pixels`` and ``input.folded``
holds the model's own input spec (package.py `Folded`).

Never assumed: `fold_package` runs both models (ONNX Runtime) on the same pixels, the unfolded one fed
through the reference arithmetic above, and refuses (golden_mismatch) unless every output of every batch
the package carries agrees within the golden pair's tolerance, on the golden input (turned back into its
pixels), on the frames the caller gives and on random pixels. The folded package's golden pair is then
uint8 pixels with the *unfolded* model's outputs, so a device's golden check at install holds the folded
model it loads to what the unfolded one computes.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edged.errors import Code, PackageError

from .batchcheck import ATOL, RTOL, compare_rows, run_in_batches
from .golden import INPUT_FILE, OUTPUT_FILE, load_input, load_output, save_input
from .package import Folded, InputSpec, Package, publish_package, verify_folder

FOLDED_INPUT = "pixels"  # the folded graph's input (another name when the graph already uses this one)
RANDOM_ROWS = 2  # random pixel rows the check runs besides the golden input and the caller's frames

Run = Callable[[np.ndarray], dict[str, np.ndarray]]


def folded_spec(spec: InputSpec, name: str = FOLDED_INPUT) -> InputSpec:
    """The input spec of `spec`'s model once folded: uint8 BGR pixels, NHWC, at the model's size; the
    geometry (resize, letterbox, pad) unchanged, the rest recorded in `folded`."""
    if spec.folded is not None:
        raise PackageError(f"input {spec.name!r} is folded already", code=Code.MANIFEST_INVALID)
    own = Folded(
        name=spec.name, dtype=spec.dtype, layout=spec.layout, color=spec.color, scale=spec.scale,
        mean=list(spec.mean), std=list(spec.std),
    )  # fmt: skip
    return InputSpec.model_validate(
        spec.model_dump(exclude_none=True)
        | {
            "name": name, "shape": [spec.batch, spec.height, spec.width, 3], "dtype": "uint8", "layout": "NHWC",
            "color": "BGR", "scale": 1.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "folded": own.model_dump(),
        }
    )  # fmt: skip


def normalise(pixels: np.ndarray, spec: InputSpec) -> np.ndarray:
    """The reference arithmetic: uint8 BGR NHWC pixels [B, H, W, 3] -> what the unfolded model of `spec`
    (an unfolded spec) is fed, in float32 as the daemon's preprocess.py computes it."""
    if pixels.dtype != np.uint8 or pixels.ndim != 4 or pixels.shape[3] != 3:
        raise ValueError(f"pixels must be uint8 [B, H, W, 3], not {pixels.dtype}{list(pixels.shape)}")
    x = pixels[..., ::-1] if spec.color == "RGB" else pixels
    if spec.dtype != "uint8":
        std = np.asarray(spec.std, np.float64)
        mul = (spec.scale / std).astype(np.float32)
        add = (-np.asarray(spec.mean, np.float64) / std).astype(np.float32)
        x = (x.astype(np.float32) * mul + add).astype(spec.dtype)
    if spec.layout == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x)


def pixels_of(x: np.ndarray, spec: InputSpec) -> np.ndarray:
    """The uint8 BGR NHWC pixels that `normalise` turns into `x` (a golden input of the unfolded `spec`);
    PackageError(golden_invalid) when `x` was not made from pixels by this spec's arithmetic."""
    f = x.astype(np.float64)
    if spec.layout == "NCHW":
        f = f.transpose(0, 2, 3, 1)
    if spec.dtype != "uint8":
        f = (f * np.asarray(spec.std) + np.asarray(spec.mean)) / spec.scale
    r = np.rint(f)
    if not np.isfinite(r).all() or r.min() < 0 or r.max() > 255:
        raise PackageError("the golden input holds values no pixel gives under the manifest's preprocessing",
                           code=Code.GOLDEN_INVALID)  # fmt: skip
    px = np.ascontiguousarray(r.astype(np.uint8)[..., ::-1] if spec.color == "RGB" else r.astype(np.uint8))
    back = normalise(px, spec).astype(np.float64)
    if not np.allclose(back, x.astype(np.float64), rtol=1e-5, atol=1e-5):
        raise PackageError(
            "the golden input is not the manifest's preprocessing of any pixels (made by hand, or with other "
            "mean/std?): make a golden pair with `edged model golden` before folding",
            code=Code.GOLDEN_INVALID,
        )
    return px


def fold_graph(model: onnx.ModelProto, spec: InputSpec) -> onnx.ModelProto:
    """`model` (its input as the unfolded `spec` says, at any fixed batch) with the preprocessing in front:
    it takes uint8 BGR pixels [B, H, W, 3] as its one input, named `FOLDED_INPUT` (or a free variant)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name for i in g.initializer}
    inputs = [v for v in g.input if v.name not in inits]
    if len(inputs) != 1 or inputs[0].name != spec.name:
        raise PackageError(
            f"the graph's inputs are {[v.name for v in inputs]}; folding needs the one input {spec.name!r}",
            code=Code.SIGNATURE_MISMATCH,
        )
    own = inputs[0]
    dims = [d.dim_value for d in own.type.tensor_type.shape.dim]
    if len(dims) != 4 or not all(dims):
        raise PackageError(
            f"input {spec.name!r} is {dims}: folding needs a fixed 4-d input", code=Code.SIGNATURE_MISMATCH
        )
    b, h, w = dims[0], (dims[2] if spec.layout == "NCHW" else dims[1]), (dims[3] if spec.layout == "NCHW" else dims[2])
    used = inits | {v.name for v in g.input} | {o for n in g.node for o in n.output} | {n.name for n in g.node}
    name = FOLDED_INPUT
    while name in used:
        name = "_" + name
    fresh = _names(used, name)
    nodes: list[onnx.NodeProto] = []
    consts: list[onnx.TensorProto] = []
    x = name

    def step(op: str, *extra: str, out: str | None = None, **attrs: Any) -> None:
        nonlocal x
        y = out or next(fresh)
        nodes.append(helper.make_node(op, [x, *extra], [y], name=f"{name}/{op}{len(nodes)}", **attrs))
        x = y

    def const(values: np.ndarray) -> str:
        c = next(fresh)
        consts.append(numpy_helper.from_array(values, c))
        return c

    if spec.layout == "NCHW":
        step("Transpose", perm=[0, 3, 1, 2])
        if spec.color == "RGB":  # whole planes copied
            step("Gather", const(np.array([2, 1, 0], np.int64)), axis=1)
    elif spec.color == "RGB":  # on the last axis a Gather copies byte by byte (ONNX Runtime: ~10x slower)
        step("Transpose", perm=[0, 3, 1, 2])
        step("Gather", const(np.array([2, 1, 0], np.int64)), axis=1)
        step("Transpose", perm=[0, 2, 3, 1])
    if spec.dtype != "uint8":
        std = np.asarray(spec.std, np.float64)
        mul = (spec.scale / std).astype(np.float32)
        add = (-np.asarray(spec.mean, np.float64) / std).astype(np.float32)
        step("Cast", to=TensorProto.FLOAT)
        if spec.layout == "NHWC":  # rows of W*3 values: a 3-long broadcast runs ~10x slower in ONNX Runtime
            step("Reshape", const(np.array([0, h, w * 3], np.int64)))  # 0: the batch as it comes (rebatch.py)
            mul, add = np.tile(mul, w), np.tile(add, w)
        else:
            mul, add = mul.reshape(1, 3, 1, 1), add.reshape(1, 3, 1, 1)
        if not (mul == 1).all():
            step("Mul", const(mul))
        if not (add == 0).all():
            step("Add", const(add))
        if spec.layout == "NHWC":
            step("Reshape", const(np.array([0, h, w, 3], np.int64)))
        if spec.dtype == "float16":
            step("Cast", to=TensorProto.FLOAT16)
    if nodes:
        nodes[-1].output[0] = spec.name
    else:
        step("Identity", out=spec.name)
    pixels = helper.make_tensor_value_info(name, TensorProto.UINT8, [b, h, w, 3])
    g.input.remove(own)
    g.input.insert(0, pixels)  # first: fold_package reads the name there
    g.initializer.extend(consts)
    for i, node in enumerate(nodes):
        g.node.insert(i, node)
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError as exc:
        raise PackageError(f"the folded graph is invalid: {exc}", code=Code.SIGNATURE_MISMATCH) from exc
    return m


def _names(used: set[str], base: str) -> Iterator[str]:
    n = 0
    while True:
        n += 1
        if f"{base}/{n}" not in used:
            yield f"{base}/{n}"


def runner(path: Path, input_name: str) -> Run:
    """One model file in ONNX Runtime (CPU, one thread, as the checks run everywhere)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own Fail/InvalidGraph/... types
        raise PackageError(f"{path}: ONNX Runtime cannot load it: {exc}", code=Code.SIGNATURE_MISMATCH) from exc
    names = [o.name for o in sess.get_outputs()]
    return lambda x: dict(zip(names, sess.run(names, {input_name: x}), strict=True))


def check_fold(
    unfolded: Run, folded: Run, batch: int, spec: InputSpec, pixels: np.ndarray, atol: float, rtol: float, where: str
) -> None:
    """The folded model on `pixels` against the unfolded one on `normalise(pixels)`, row for row, `batch` rows
    a run; PackageError(golden_mismatch) naming the output and the largest difference."""
    want = run_in_batches(unfolded, normalise(pixels, spec), batch)
    try:
        compare_rows(run_in_batches(folded, pixels, batch), want, where, atol, rtol)
    except PackageError as exc:
        raise PackageError(f"{exc} (the folded model against the unfolded one)", code=Code.FOLD_MISMATCH) from exc


def fold_package(
    src: Path, dst: Path, frames: Sequence[np.ndarray] = (), version: int | None = None, seed: int = 0
) -> Path:
    """A new package in `dst` (absent or empty) with `src`'s preprocessing folded into each of its ONNX model
    files and the manifest saying so; value-checked (see the module's docstring) before it takes its name.
    `frames`: uint8 BGR rows [H, W, 3] (or batches [N, H, W, 3]) at the model's size, letterboxed as the
    daemon does (its preprocess.py with the folded spec), to check on besides the golden input and random
    pixels; the first one becomes the golden input when `src` has no golden pair. `version`: the new
    package's version (default `src`'s)."""
    pkg = verify_folder(Path(src))
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise PackageError(f"{dst}: exists and is not an empty folder", code=Code.INIT_FAILED)
    m = pkg.manifest
    if m.kind != "onnx":
        raise PackageError(
            f"{pkg.ref}: an engine package cannot be folded; fold the ONNX package, then build its engine",
            code=Code.MANIFEST_INVALID,
        )
    spec = m.input
    new_spec = folded_spec(spec)
    row = (spec.height, spec.width, 3)
    given = [np.asarray(f).reshape(-1, *row) for f in frames]
    if any(f.dtype != np.uint8 for f in given):
        raise ValueError(f"frames must be uint8 BGR pixels {list(row)}")
    g = m.golden
    atol, rtol = (g.atol, g.rtol) if g is not None else (ATOL, RTOL)
    golden_px = pixels_of(load_input(pkg.root / g.input), spec) if g is not None else None
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (RANDOM_ROWS, *row), dtype=np.uint8)
    probe = np.concatenate([*(p for p in (golden_px,) if p is not None), *given, noise])
    with tempfile.TemporaryDirectory(prefix="fold-") as tmp:
        work = Path(tmp)
        files = {name: pkg.root / name for name in m.files}
        for b, path in pkg.batch_paths.items():
            model = fold_graph(onnx.load(str(path)), spec)
            new_spec = folded_spec(spec, model.graph.input[0].name)  # "pixels", unless the graph had that name
            onnx.save(model, str(work / path.name))
            files[path.name] = work / path.name
            check_fold(
                runner(path, spec.name), runner(work / path.name, new_spec.name), b, spec, probe, atol, rtol,
                f"{pkg.ref} folded, at batch {b}",
            )  # fmt: skip
        golden = _golden(pkg, spec, golden_px, given, noise, work)
        if g is not None and golden_px is not None:  # the folded model against the source's own golden output
            got = runner(work / m.model_file, new_spec.name)(golden_px)
            try:
                compare_rows(got, load_output(pkg.root / g.output), f"{pkg.ref} folded, golden pair", atol, rtol)
            except PackageError as exc:
                raise PackageError(str(exc), code=Code.FOLD_MISMATCH) from exc
        files.update(golden[1])
        for stale in (g.input,) if g is not None and g.input != INPUT_FILE else ():
            files.pop(stale, None)
        fields = m.model_dump(by_alias=True, exclude={"files"}, exclude_none=True)
        if m.labels_file is None:
            fields["labels_file"] = None
        fields["input"] = new_spec.model_dump(exclude_none=True)
        fields["golden"] = golden[0]
        fields["source"] = {
            **m.source,
            "folded_from": {"ref": pkg.ref, "manifest_sha256": hashlib.sha256(pkg.manifest_bytes).hexdigest()},
        }
        if version is not None:
            fields["version"] = version
        publish_package(dst, fields, files)
    return dst


def _golden(
    pkg: Package,
    spec: InputSpec,
    golden_px: np.ndarray | None,
    given: list[np.ndarray],
    noise: np.ndarray,
    work: Path,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The folded package's golden pair: its input as pixels, its output the unfolded model's (the source's
    own output file when it has a pair; else computed here from the first frame given, or random pixels)."""
    g = pkg.manifest.golden
    save = work / INPUT_FILE
    if g is not None and golden_px is not None:
        save_input(save, golden_px, None)
        out = pkg.root / g.output
        return {**g.model_dump(exclude_none=True), "input": INPUT_FILE, "encoding": "palette"}, {
            INPUT_FILE: save,
            g.output: out,
        }
    first = given[0][:1] if given else noise[:1]
    px = np.ascontiguousarray(np.broadcast_to(first, (spec.batch, *first.shape[1:])))
    outputs = runner(pkg.model_path, spec.name)(normalise(px, spec))
    save_input(save, px, None)
    with open(work / OUTPUT_FILE, "wb") as f:
        np.savez_compressed(f, **outputs)  # type: ignore[arg-type]
    spec_g = {"input": INPUT_FILE, "output": OUTPUT_FILE, "atol": ATOL, "rtol": RTOL, "encoding": "palette"}
    return spec_g, {INPUT_FILE: save, OUTPUT_FILE: work / OUTPUT_FILE}


def check_folded(pkg: Package) -> str | None:
    """A folded ONNX package's golden pair on values at every batch it carries: its pixels through each folded
    model file against the golden output (the unfolded model's, as `fold_package` wrote it), within the pair's
    tolerance; PackageError(golden_mismatch). None when the package is not folded or has no pair."""
    m = pkg.manifest
    if m.input.folded is None or m.golden is None or m.kind != "onnx":
        return None
    px = load_input(pkg.root / m.golden.input)
    want = load_output(pkg.root / m.golden.output)
    for b, path in pkg.batch_paths.items():
        got = runner(path, m.input.name)(np.ascontiguousarray(px[:b]))
        try:
            compare_rows(got, {k: v[:b] for k, v in want.items()}, f"{pkg.ref} at batch {b}", m.golden.atol,
                         m.golden.rtol)  # fmt: skip
        except PackageError as exc:
            raise PackageError(f"{exc} (the folded model against its golden pair)", code=Code.GOLDEN_MISMATCH) from exc
    return f"fold: {pkg.ref}'s folded model gives its golden output (the unfolded model's) at every batch"
