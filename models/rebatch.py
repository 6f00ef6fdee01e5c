"""Give an ONNX model that was exported with batch 1 a fixed batch B.

Exporters often bake the batch into the graph, so changing the input's first dimension alone
does not work. Two patterns cover the demo models:

- tf2onnx writes channel padding as ``Concat(x, ConstantOfShape([1, C, H, W]))``; the constant
  carries batch 1, so it becomes ``Pad(x)`` along the same axis (zeros, as before).
- ``Reshape`` targets that start with 1 get 0 ("copy this dimension from the input").

The result is checked by ONNX's strict shape inference; per image it computes the same values
as the original (the demo models are bit-identical per row, which the tests check).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edged.errors import Code, PackageError


def rebatch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    _concat_constant_to_pad(g)
    _reshape_batch_to_zero(g)
    for t in [*g.input, *g.output]:
        dims = t.type.tensor_type.shape.dim
        if not dims:
            raise PackageError(f"tensor {t.name!r} has no shape; cannot set its batch", code=Code.REBATCH_FAILED)
        dims[0].ClearField("dim_param")
        dims[0].dim_value = batch
    used = {name for n in g.node for name in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        onnx.checker.check_model(m)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise PackageError(f"the graph does not take batch {batch}: {exc}", code=Code.REBATCH_FAILED) from exc
    return m


def _const(g: onnx.GraphProto, name: str) -> np.ndarray | None:
    for init in g.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for n in g.node:
        if n.op_type == "Constant" and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
    return None


def _concat_constant_to_pad(g: onnx.GraphProto) -> None:
    producers = {out: n for n in g.node for out in n.output}
    consumers: dict[str, int] = {}
    for n in g.node:
        for name in n.input:
            consumers[name] = consumers.get(name, 0) + 1
    for n in list(g.node):
        if n.op_type != "Concat" or len(n.input) != 2:
            continue
        filler = producers.get(n.input[1])
        if filler is None or filler.op_type != "ConstantOfShape" or consumers.get(n.input[1]) != 1:
            continue
        value = next(
            (numpy_helper.to_array(a.t) for a in filler.attribute if a.name == "value"), np.zeros(1, np.float32)
        )
        shape = _const(g, filler.input[0])
        if shape is None or value.size != 1:
            continue
        axis = next(a.i for a in n.attribute if a.name == "axis")
        rank = len(shape)
        axis = axis % rank
        pads = [0] * (2 * rank)
        pads[rank + axis] = int(shape[axis])
        pads_name = f"{n.output[0]}__pads"
        fill_name = f"{n.output[0]}__fill"
        g.initializer.append(numpy_helper.from_array(np.array(pads, np.int64), pads_name))
        g.initializer.append(numpy_helper.from_array(value.reshape(()).astype(value.dtype), fill_name))
        pad = helper.make_node(
            "Pad", [n.input[0], pads_name, fill_name], list(n.output), mode="constant", name=f"{n.output[0]}__pad"
        )
        index = list(g.node).index(n)
        g.node.remove(n)
        g.node.insert(index, pad)
        g.node.remove(filler)


def _reshape_batch_to_zero(g: onnx.GraphProto) -> None:
    for n in g.node:
        if n.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in n.attribute):
            continue
        target = _const(g, n.input[1])
        if target is None or target.ndim != 1 or target.size == 0 or target[0] != 1:
            continue
        fixed = target.astype(np.int64).copy()
        fixed[0] = 0
        name = f"{n.output[0]}__shape"
        g.initializer.append(numpy_helper.from_array(fixed, name))
        n.input[1] = name
