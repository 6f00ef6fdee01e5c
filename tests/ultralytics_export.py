"""A stand-in for a real Ultralytics YOLOv8 detect export, built with onnx's helper: the parts of its graph
that init, rebatch and the decoder meet, as the exporter writes them.

- three heads (strides 8/16/32), each flattened with a Reshape: a constant ``[1, C, -1]`` target in a static
  export (``dynamic=False``: the batch baked in as 1), a target computed from ``Shape`` in a dynamic one;
- the anchor grid computed in the graph from each head's ``Shape``/``Gather``/``Range`` (as
  ``make_anchors`` traces), through ``torch.meshgrid``'s ``Reshape`` to ``[1, -1]`` and ``[-1, 1]``: the
  ``[1, -1]`` is the grid's x row, its first dimension is **not** the batch;
- boxes decoded from distances to the anchors times the strides (``dist2bbox``), class scores through a
  sigmoid: ``output0`` ``[B, 4 + C, A]`` in input pixels, as a real export gives;
- the metadata Ultralytics writes (names, imgsz, stride, task, batch).

The weights are random (a seeded generator); `class_bias` sets how many cells pass a threshold on a real
photograph (-1: a few at 0.5; 0: a few at 0.7): detections are few and depend on the image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def yolov8_export(
    path: Path, classes: list[str], imgsz: int = 320, dynamic: bool = False, seed: int = 0, class_bias: float = -1.0
) -> Path:
    rng = np.random.default_rng(seed)
    ch = 4 + len(classes)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    const("zero", np.array(0, np.int64))
    const("one", np.array(1, np.int64))
    const("half", np.array(0.5, np.float32))
    const("row", np.array([1, -1], np.int64))  # meshgrid's x: [W] -> [1, W]
    const("col", np.array([-1, 1], np.int64))  # meshgrid's y: [H] -> [H, 1]
    const("flat", np.array([-1], np.int64))
    const("axis0", np.array([0], np.int64))
    flats, grids, strides = [], [], []
    for s in (8, 16, 32):
        w = rng.normal(0, 0.02, (ch, 3, s, s)).astype(np.float32)
        b = np.concatenate([rng.normal(0, 0.1, 4), np.full(len(classes), class_bias)]).astype(np.float32)
        f = node(
            "Conv", ["images", const(f"w{s}", w), const(f"b{s}", b)], f"head{s}", kernel_shape=[s, s], strides=[s, s]
        )
        shape = node("Shape", [f], f"shape{s}")
        if dynamic:
            n = node("Gather", [shape, "axis0"], f"n{s}", axis=0)
            target = node("Concat", [n, const(f"rest{s}", np.array([ch, -1], np.int64))], f"target{s}", axis=0)
        else:
            target = const(f"target{s}", np.array([1, ch, -1], np.int64))
        flats.append(node("Reshape", [f, target], f"flat{s}"))
        h = node("Gather", [shape, const(f"hi{s}", np.array(2, np.int64))], f"h{s}", axis=0)
        wd = node("Gather", [shape, const(f"wi{s}", np.array(3, np.int64))], f"w{s}_", axis=0)
        sx = node(
            "Add", [node("Cast", [node("Range", ["zero", wd, "one"], f"rx{s}")], f"fx{s}", to=1), "half"], f"sx{s}"
        )
        sy = node(
            "Add", [node("Cast", [node("Range", ["zero", h, "one"], f"ry{s}")], f"fy{s}", to=1), "half"], f"sy{s}"
        )
        hw = node(
            "Concat",
            [node("Unsqueeze", [h, "axis0"], f"h1{s}"), node("Unsqueeze", [wd, "axis0"], f"w1{s}")],
            f"hw{s}",
            axis=0,
        )
        gx = node("Expand", [node("Reshape", [sx, "row"], f"gxr{s}"), hw], f"gx{s}")
        gy = node("Expand", [node("Reshape", [sy, "col"], f"gyr{s}"), hw], f"gy{s}")
        px = node("Unsqueeze", [node("Reshape", [gx, "flat"], f"px{s}"), "axis0"], f"pxu{s}")
        py = node("Unsqueeze", [node("Reshape", [gy, "flat"], f"py{s}"), "axis0"], f"pyu{s}")
        grids.append(node("Concat", [px, py], f"grid{s}", axis=0))  # [2, h*w]
        zeros = node("Mul", [px, "zero_f"], f"z{s}")
        strides.append(node("Add", [zeros, const(f"s{s}", np.array(s, np.float32))], f"stride{s}"))  # [1, h*w] of s
    const("zero_f", np.array(0, np.float32))
    anchors = node("Concat", grids, "anchors", axis=1)  # [2, A]
    stride = node("Concat", strides, "strides", axis=1)  # [1, A]
    cat = node("Concat", flats, "cat", axis=2)  # [B, 4 + C, A]
    nodes.append(
        helper.make_node("Split", [cat, const("split", np.array([4, len(classes)], np.int64))], ["box", "cls"], axis=1)
    )
    dist = node("Mul", [node("Sigmoid", ["box"], "box_s"), const("reach", np.array(6.0, np.float32))], "dist")
    nodes.append(helper.make_node("Split", [dist, const("halves", np.array([2, 2], np.int64))], ["lt", "rb"], axis=1))
    x1y1 = node("Sub", [anchors, "lt"], "x1y1")
    x2y2 = node("Add", [anchors, "rb"], "x2y2")
    cxy = node("Div", [node("Add", [x1y1, x2y2], "sum"), const("two", np.array(2, np.float32))], "cxy")
    wh = node("Sub", [x2y2, x1y1], "wh")
    dbox = node("Mul", [node("Concat", [cxy, wh], "xywh", axis=1), stride], "dbox")
    node("Concat", [dbox, node("Sigmoid", ["cls"], "scores")], "output0", axis=1)
    cells = sum((imgsz // s) ** 2 for s in (8, 16, 32))
    in_shape: list[str | int] = ["batch", 3, "height", "width"] if dynamic else [1, 3, imgsz, imgsz]
    out_shape: list[str | int] = ["batch", ch, "anchors"] if dynamic else [1, ch, cells]
    graph = helper.make_graph(
        nodes,
        "main_graph",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    names = "{" + ", ".join(f"{i}: '{n}'" for i, n in enumerate(classes)) + "}"
    meta = {"description": "Ultralytics YOLOv8n model", "author": "Ultralytics", "stride": "32", "task": "detect",
            "batch": "1", "imgsz": str([imgsz, imgsz]), "names": names}  # fmt: skip
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
