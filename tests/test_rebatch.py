"""The demo models at a fixed batch B compute, per image, exactly what the batch-1 originals do."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edged.daemon.backends import OnnxRuntimeBackend
from edged.errors import PackageError
from edged.models.demo import DemoAssets
from edged.models.rebatch import rebatch


@pytest.mark.parametrize(
    ("package", "original"),
    [("blazeface-back", "face_detection_back_256x256_barracuda.onnx"), ("picodet-layout", "layout_cdla.onnx")],
)
def test_rebatched_rows_are_bit_identical(demo: DemoAssets, package: str, original: str) -> None:
    pkg = demo.packages[package]
    batched = OnnxRuntimeBackend(pkg.model_path, threads=1)
    single = OnnxRuntimeBackend(demo.root / "raw" / original, threads=1)
    spec = pkg.manifest.input
    assert single.inputs[0].shape[0] == 1 and batched.inputs[0].shape[0] == spec.batch > 1
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, spec.shape).astype(np.float32)
    out_b = batched.infer({spec.name: x})
    for row in range(spec.batch):
        out_1 = single.infer({spec.name: x[row : row + 1]})
        for name, value in out_1.items():
            assert np.array_equal(value[0], out_b[name][row]), f"{package} row {row} output {name}"


def test_rebatch_rejects_a_graph_it_cannot_fix() -> None:
    from onnx import TensorProto, helper

    # A Reshape to a constant [1, 12] cannot take batch 2 once the target starts with anything but 1.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [2, 6])
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x], [y], [shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(PackageError, match="does not take batch 4"):
        rebatch(m, 4)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        rebatch(onnx.ModelProto(), 0)
