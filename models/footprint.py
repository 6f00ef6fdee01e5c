"""A model's working memory before it is loaded: the intermediate tensors of an ONNX graph.

ONNX Runtime plans the intermediate tensors of a graph with fixed shapes before the first run and
reuses a buffer once its last reader has run, so what a batch needs on top of the weights and the
graph's inputs and outputs is about the largest set of tensors alive at one time. This walks the
graph's nodes in order (ONNX keeps them topologically sorted) with the shapes from the model's
`value_info` (shape inference fills in what the exporter left out) and returns that peak: with a
fixed batch B it grows with B, which is what makes a big-batch package's warm-up blow a memory
budget that its weights fit easily.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edged.errors import EngineLoadError

if TYPE_CHECKING:
    import onnx


# ONNX Runtime's CPU arena over the graph's planned peak of intermediate tensors: what admission counts before
# a model loads (daemon/lifecycle/) and what the loaded model reports (daemon/backends/onnxruntime.py), one figure.
# Measured (x86-64, onnxruntime 1.32, one thread, RSS after 20 batches of a second session in a warm process):
# BlazeFace back batch 4 +43.5 MB for an 18.0 MB plan, front batch 4 +18.9 MB for 5.2 MB; earlier, 1.2x to
# 1.8x on both (batch 8 to 64). Disabling the arena (enable_cpu_mem_arena=False) costs more, not less (a fresh
# process, load + 20 batches: back +84.6 MB against +51.2 with it, front +42.8 against +26.7: malloc keeps
# what ORT frees), so the arena stays on and is counted.
ARENA_FACTOR = 2.0


def working_bytes(model: Path) -> int:
    """What a graph's batch takes while it runs under ONNX Runtime: its planned peak times ARENA_FACTOR."""
    return int(activation_bytes(model) * ARENA_FACTOR)


def activation_bytes(model: Path) -> int:
    """Peak bytes of intermediate tensors alive at once when `model`'s graph runs node by node.

    A dimension that is not a fixed size counts as 1 (a package's graph has a fixed batch)."""
    import onnx  # here: the daemon needs it only to admit a model
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

    try:
        m = onnx.load(str(model), load_external_data=False)
    except (OSError, DecodeError, ValueError) as exc:
        raise EngineLoadError(f"{model}: not a readable ONNX model: {exc}") from exc
    g = m.graph
    sizes = _tensor_sizes(m)
    if any(out not in sizes for n in g.node for out in n.output if out):
        try:
            m = onnx.shape_inference.infer_shapes(m)
        except (onnx.shape_inference.InferenceError, ValueError) as exc:
            raise EngineLoadError(f"{model}: cannot infer the graph's shapes: {exc}") from exc
        g, sizes = m.graph, _tensor_sizes(m)
    graph_io = {v.name for v in g.input} | {v.name for v in g.output} | {i.name for i in g.initializer}
    last_use: dict[str, int] = {}
    for i, node in enumerate(g.node):
        for name in node.input:
            last_use[name] = i
    live: dict[str, int] = {}
    now = peak = 0
    for i, node in enumerate(g.node):
        for out in node.output:
            if out and out not in graph_io:
                live[out] = sizes.get(out, 0)
                now += live[out]
        peak = max(peak, now)
        for name in set(node.input):
            if name in live and last_use.get(name) == i:
                now -= live.pop(name)
    return peak


def _tensor_sizes(m: onnx.ModelProto) -> dict[str, int]:
    from onnx import helper

    out: dict[str, int] = {}
    for v in [*m.graph.value_info, *m.graph.input, *m.graph.output]:
        t = v.type.tensor_type
        if not t.HasField("shape"):
            continue
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except (KeyError, TypeError):
            itemsize = 4
        n = 1
        for d in t.shape.dim:
            n *= d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
        out[v.name] = n * itemsize
    return out
