"""A package checked against its own model: the graph's I/O signature against the manifest.

`pack`, `verify` and `check-config` call `check_package` (and the daemon calls `check_input` with
its backend's I/O as it loads a model), so a manifest that contradicts its model is refused with the
exact mismatch before any device runs it, not when the daemon starts:

- the input: the manifest's tensor name exists, the model takes one input, every dimension is fixed
  and equal to the manifest's shape (batch, layout and size), the element type is the manifest's dtype;
- the outputs: handed to the decoder's own check (the caller passes it: decoders live in the daemon),
  which compares their count and shapes with what the decoder reads, and the class count with the
  labels (the manifest's list, else its labels file: package.py reads it);
- each of the package's smaller batches (``extra_batches``): the same input at its batch, the same
  outputs with as many rows;
- a folded input (``input.folded``, models/fold.py): some node of each model file computes the model's own
  input from the pixels.

ONNX is imported here lazily: the device's runtime never loads it (an engine package is checked
against its TensorRT bindings by the daemon instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edged.errors import Code, PackageError

from .package import InputSpec, Package

Dim = int | str  # a fixed size, or the name of a dynamic dimension ("batch", "height", "?")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[Dim, ...]
    dtype: str  # numpy's name: float32, float16, uint8, int64 ...

    @property
    def fixed(self) -> bool:
        return all(isinstance(d, int) and d > 0 for d in self.shape)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        """Output name -> shape, every dimension fixed (a dynamic one is refused, naming it)."""
        out: dict[str, tuple[int, ...]] = {}
        for t in self.outputs:
            if not t.fixed:
                raise PackageError(
                    f"output {t.name!r} has shape {_show(t.shape)} with dynamic dimensions once the input is fixed",
                    code=Code.SIGNATURE_MISMATCH,
                )
            out[t.name] = tuple(int(d) for d in t.shape)
        return out


def onnx_signature(path: Path) -> Signature:
    """The graph's inputs (initializers excluded) and outputs, with shapes as ONNX declares them."""
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, OSError, ValueError: translated at the boundary
        raise PackageError(f"{path}: not an ONNX model ONNX can read: {exc}", code=Code.SIGNATURE_MISMATCH) from exc
    inits = {i.name for i in model.graph.initializer}

    def tensor(v: onnx.ValueInfoProto) -> Tensor:
        tt = v.type.tensor_type
        dims: list[Dim] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        except (KeyError, TypeError, ValueError):
            dtype = f"onnx type {tt.elem_type}"
        return Tensor(v.name, tuple(dims), dtype)

    return Signature(
        tuple(tensor(v) for v in model.graph.input if v.name not in inits),
        tuple(tensor(v) for v in model.graph.output),
    )


def check_input(spec: InputSpec, inputs: Sequence[Tensor], where: str) -> None:
    """The manifest's input spec against the model's inputs; PackageError(signature_mismatch) naming both."""
    by_name = {t.name: t for t in inputs}
    if spec.name not in by_name:
        raise PackageError(
            f"{where}: the manifest's input {spec.name!r} is not a model input (the model has {sorted(by_name)})",
            code=Code.SIGNATURE_MISMATCH,
        )
    if len(inputs) != 1:
        raise PackageError(
            f"{where}: the model has {len(inputs)} inputs ({sorted(by_name)}); edged feeds one image tensor",
            code=Code.SIGNATURE_MISMATCH,
        )
    t = by_name[spec.name]
    if not t.fixed:
        raise PackageError(
            f"{where}: input {t.name!r} has dynamic dimensions {_show(t.shape)}; the manifest says {spec.shape}. "
            "Fix them with `edged model init MODEL.onnx --batch B --input-size WxH`",
            code=Code.SIGNATURE_MISMATCH,
        )
    if list(t.shape) != list(spec.shape):
        hint = ""
        fixed = [int(d) for d in t.shape]
        if sorted(fixed) == sorted(spec.shape) and len(fixed) == 4 and fixed[1:] != spec.shape[1:]:
            other = "NCHW" if spec.layout == "NHWC" else "NHWC"
            hint = f" (the model looks {other}, the manifest says {spec.layout})"
        elif t.shape[1:] == tuple(spec.shape[1:]):
            hint = f" (batch {t.shape[0]} in the model, {spec.batch} in the manifest: the fixed batch must match)"
        raise PackageError(
            f"{where}: input {t.name!r} is {_show(t.shape)} in the model, the manifest says {spec.shape}{hint}",
            code=Code.SIGNATURE_MISMATCH,
        )
    if t.dtype != spec.dtype and t.dtype != "unknown":
        raise PackageError(
            f"{where}: input {t.name!r} is {t.dtype} in the model, the manifest says {spec.dtype}",
            code=Code.SIGNATURE_MISMATCH,
        )


OutputsCheck = Callable[[Package, dict[str, tuple[int, ...]]], None]


def check_package(pkg: Package, outputs_check: OutputsCheck | None = None) -> Signature | None:
    """An ONNX package's model against its manifest: the input here, the outputs through `outputs_check`
    (the decoder's check: it raises on a count, shape or class-count mismatch). None for an engine
    package, which only a device with TensorRT can open (the daemon checks it as it loads)."""
    m = pkg.manifest
    if m.kind != "onnx":
        return None
    sig = onnx_signature(pkg.model_path)
    check_input(m.input, sig.inputs, str(pkg.model_path))
    if m.input.folded is not None:
        for path in pkg.batch_paths.values():
            check_folded_graph(path, m.input.folded.name)
    if outputs_check is not None:
        outputs_check(pkg, sig.output_shapes())
    for b, path in pkg.batch_paths.items():
        if b != m.input.batch:
            check_smaller_batch(m.input, b, sig, onnx_signature(path), str(path))
    return sig


def check_folded_graph(path: Path, inner: str) -> None:
    """A folded package's model computes its own input (`input.folded.name`) from the pixels: some node of the
    graph outputs it (its values are the golden pair's to check: models/fold.py)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if not any(inner in node.output for node in model.graph.node):
        raise PackageError(
            f"{path}: the manifest says the preprocessing is folded into the graph, but no node computes the "
            f"model's own input {inner!r} (input.folded.name)",
            code=Code.SIGNATURE_MISMATCH,
        )


def batch_spec(spec: InputSpec, batch: int) -> InputSpec:
    """The input spec of one of the package's fixed batches (the manifest's is the largest)."""
    return spec.model_copy(update={"shape": [batch, *spec.shape[1:]]})


def check_smaller_batch(spec: InputSpec, batch: int, largest: Signature, sig: Signature, where: str) -> None:
    """One of a package's smaller batches (extra_batches): its input is the manifest's at `batch`, its outputs
    the largest model's with `batch` rows, name for name."""
    check_input(batch_spec(spec, batch), sig.inputs, where)
    want = {name: (batch, *shape[1:]) for name, shape in largest.output_shapes().items()}
    got = sig.output_shapes()
    if got != want:
        raise PackageError(
            f"{where}: outputs {got} at batch {batch}, the largest batch's model gives {want} at that batch",
            code=Code.SIGNATURE_MISMATCH,
        )


def _show(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
