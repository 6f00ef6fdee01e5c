"""Give an ONNX model that was exported with batch 1 a fixed batch B.

Exporters often bake the batch into the graph, so changing the input's first dimension alone
does not work. Two patterns cover the exports we have met:

- tf2onnx writes channel padding as ``Concat(x, ConstantOfShape([1, C, H, W]))``; the constant
  carries batch 1, so it becomes ``Pad(x)`` along the same axis (zeros, as before).
- a ``Reshape`` to a constant target that starts with 1 gets 0 ("copy this dimension from the input")
  **only where its input's first dimension is the batch**. Which ones those are is traced, not guessed:
  the input's batch is set to two primes in turn and ONNX's shape inference (with data propagation) carries it
  through the graph; a Reshape whose input's first dimension follows both is rewritten, then the trace runs
  again (a rewritten Reshape passes the batch on), until nothing changes. A ``[1, -1]`` Reshape in an
  anchor grid (Ultralytics' meshgrid: its input is a row of x coordinates) is left alone: rewriting it
  transposes the grid of a square input, every shape still right and every box wrong.

The result is checked by ONNX's strict shape inference here, and on values by the caller
(``batchcheck.check_batches`` against the source, in ``edged model init``): per image it must compute
what the original computes.
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
    _reshape_batch_to_zero(m)
    inits = {i.name for i in g.initializer}
    for t in [*g.input, *g.output]:
        if t.name in inits:
            continue
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


PROBE_BATCHES = (7, 11)  # the batches the trace gives the input: a tensor that follows both is batch-led


def _reshape_batch_to_zero(m: onnx.ModelProto) -> None:
    """Rewrite `Reshape(x, [1, ...])` to `Reshape(x, [0, ...])` where x's first dimension is the batch, as
    traced by `_batch_led`; again until the trace finds no more (each rewrite passes the batch on)."""
    g = m.graph
    done: set[int] = set()
    while True:
        led = _batch_led(m)
        todo = []
        for i, n in enumerate(g.node):
            if i in done or n.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in n.attribute):
                continue
            target = _const(g, n.input[1])
            if target is None or target.ndim != 1 or target.size == 0 or target[0] != 1:
                continue
            if n.input[0] in led:
                todo.append(i)
        if not todo:
            return
        for i in todo:
            n = g.node[i]
            fixed = _const(g, n.input[1]).astype(np.int64).copy()  # type: ignore[union-attr]
            fixed[0] = 0
            name = f"{n.output[0]}__shape"
            g.initializer.append(numpy_helper.from_array(fixed, name))
            n.input[1] = name
            done.add(i)


def _batch_led(m: onnx.ModelProto) -> set[str]:
    """The tensors whose first dimension is the graph input's batch: shapes inferred (with data propagation)
    twice, with the input's batch set to two different primes (7 and 11); a tensor whose first dimension is 7,
    then 11, follows the batch. Concrete sizes rather than a symbol: shape inference keeps a number through
    ops that lose a symbol (a Resize by scales, a Range). Non-strict: a tensor whose shape is unknown is
    simply not batch-led, and a Reshape on it is left as exported; the value check then decides."""
    led: set[str] | None = None
    for probe_batch in PROBE_BATCHES:
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        inits = {i.name for i in probe.graph.initializer}
        for t in probe.graph.input:
            if t.name in inits:
                continue
            dims = t.type.tensor_type.shape.dim
            if dims:
                dims[0].ClearField("dim_param")
                dims[0].dim_value = probe_batch
        del probe.graph.value_info[:]
        for t in probe.graph.output:
            t.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
        except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as exc:  # a custom op, > 2 GB
            raise PackageError(f"cannot trace the batch through the graph: {exc}", code=Code.REBATCH_FAILED) from exc
        found = set()
        for v in [*inferred.graph.input, *inferred.graph.value_info]:
            dims = v.type.tensor_type.shape.dim
            if v.type.tensor_type.HasField("shape") and dims and dims[0].dim_value == probe_batch:
                found.add(v.name)
        led = found if led is None else led & found
    return led or set()
