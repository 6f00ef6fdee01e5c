"""uint8 pixels into TensorRT: a folded model's input (models/fold.py) as the builder takes it.

TensorRT takes a uint8 network input since 8.5 (``DataType.UINT8``: "use the IdentityLayer/CastLayer to convert
uint8 network-level inputs to float32 or float16 prior to use with other TensorRT layers"), and no other layer
reads uint8, not even data movement: a Transpose or a Gather straight after the input fails the build
(NVIDIA/TensorRT#3985, "all UINT8 inputs must directly feed into a cast layer"). A folded graph transposes and
reorders the colour planes on the bytes before its Cast (a quarter of the traffic on ONNX Runtime), so
`cast_first` moves the Cast in front of them: casting commutes with moving elements, the outputs are the same
bit for bit. The package keeps the folded ONNX as it is; build.py builds from this copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edged.errors import BackendError

if TYPE_CHECKING:  # onnx is a build tool: imported where a build runs, never by the daemon's import
    import onnx

# ops that only move or select elements: a cast commutes with them
MOVES = frozenset({"Transpose", "Gather", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Slice"})
UINT8, FLOAT, FLOAT16 = 2, 1, 10  # onnx.TensorProto's element types
TO_FLOAT = (FLOAT, FLOAT16)


def uint8_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph's uint8 inputs (initializers excluded)."""
    inits = {i.name for i in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in inits and v.type.tensor_type.elem_type == UINT8]


def cast_first(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` with each uint8 input feeding straight into a Cast to float, as TensorRT needs; None when every
    uint8 input already does (or there is none). BackendError when a uint8 input reaches anything but element
    moves and then a Cast to float32/float16 (TensorRT would refuse it)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    changed = False
    for name in uint8_inputs(m):
        changed |= _cast_first(m.graph, name)
    if not changed:
        return None
    del m.graph.value_info[:]  # the moved tensors' types changed; shape inference redoes them
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        onnx.checker.check_model(m)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise BackendError(f"the uint8 input rewritten for TensorRT is not a valid graph: {exc}") from exc
    return m


def _cast_first(g: onnx.GraphProto, name: str) -> bool:
    import onnx
    from onnx import helper

    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    chain: list[onnx.NodeProto] = []
    x = name
    while True:
        users = consumers.get(x, [])
        if len(users) != 1 or any(o.name == x for o in g.output):
            raise BackendError(
                f"uint8 input {name!r}: {x!r} is read by {len(users)} nodes; TensorRT takes uint8 only straight into "
                "a Cast to float (fold the preprocessing with `edged model fold`)"
            )
        node = users[0]
        if node.op_type == "Cast" and _to(node) in TO_FLOAT:
            break
        if node.op_type not in MOVES or node.input[0] != x:
            raise BackendError(
                f"uint8 input {name!r} reaches a {node.op_type} before any Cast to float; TensorRT takes uint8 only "
                "straight into a Cast (fold the preprocessing with `edged model fold`)"
            )
        chain.append(node)
        x = node.output[0]
    cast = node
    if not chain:
        return False
    # pixels -> Cast -> moves... -> (the old Cast's output): the same tensors, each move now on float
    moved = f"{name}/as_float"
    first = chain[0]
    first.input[0] = moved
    chain[-1].output[0] = cast.output[0]
    new = helper.make_node("Cast", [name], [moved], name=f"{name}/cast_first", to=_to(cast))
    nodes: list[onnx.NodeProto] = []
    for n in g.node:  # by output: each tensor has one producer
        if n.output[0] == cast.output[0] and n.op_type == "Cast" and n.input[0] == x:
            continue
        kept = onnx.NodeProto()
        kept.CopyFrom(n)  # the old list is cleared below
        nodes.extend([new, kept] if n.output[0] == first.output[0] else [kept])
    del g.node[:]
    g.node.extend(nodes)
    return True


def _to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def trt_ready(onnx_file: Path, work: Path) -> Path:
    """`onnx_file` itself when TensorRT can take it as it is, else its `cast_first` copy written into `work`."""
    import onnx

    model = onnx.load(str(onnx_file))
    ready = cast_first(model)
    if ready is None:
        return onnx_file
    out = work / f"{onnx_file.stem}.uint8-cast-first.onnx"
    onnx.save(ready, str(out))
    return out
