"""Reading an ONNX file's inputs and outputs without running it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from partialfc.onnx_layout import read_onnx_layout


def test_weights_listed_as_inputs_are_left_out_and_free_sides_are_named(tmp_path):
    weight = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w"], ["out"], name="Sub_first")],
        "g",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, "height", None]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3, 1, 1]),  # IR < 4 style
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, "height", None])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(tmp_path / "g.onnx"))
    layout = read_onnx_layout(tmp_path / "g.onnx")
    assert layout.inputs == [("data", (1, 3, "height", "?"))]
    assert layout.outputs == [("out", (1, 2, "height", "?"))]
    assert layout.first_node_names == ("Sub_first",)
    assert layout.describe() == "input (1, 3, height, ?), 1 output"


def test_a_file_that_is_not_onnx_is_named(tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(b"\x08\x07\x12")
    with pytest.raises(ValueError, match="truncated.onnx: cannot read ONNX model"):
        read_onnx_layout(bad)
