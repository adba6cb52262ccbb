"""The input/output layout of an ONNX file, read from its graph without running it.

    layout = read_onnx_layout("det_10g.onnx")
    layout.inputs     # [("input.1", (1, 3, "?", "?"))]   fixed sides are ints, free ones names
    layout.outputs    # [("448", (12800, 1)), ...]
    layout.first_node_names   # the names of the graph's first eight nodes, in order

Graph inputs that are initializers (listed as inputs by files of ONNX IR version < 4) are left
out, as onnxruntime leaves them out of ``InferenceSession.get_inputs()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

Shape = tuple[int | str, ...]


@dataclass(frozen=True)
class OnnxLayout:
    path: Path
    inputs: list[tuple[str, Shape]]
    outputs: list[tuple[str, Shape]]
    first_node_names: tuple[str, ...]

    def describe(self) -> str:
        """``input (1, 3, 112, 112), 1 output`` — for messages listing what a folder holds."""
        shapes = ", ".join(_shape_text(shape) for _, shape in self.inputs) or "none"
        count = len(self.outputs)
        return f"input {shapes}, {count} output{'s' if count != 1 else ''}"


def _shape_text(shape: Shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _shape(value) -> Shape:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return ()
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
        for d in tensor.shape.dim
    )


def read_onnx_layout(path: str | os.PathLike, first_nodes: int = 8) -> OnnxLayout:
    """The layout of the ONNX file ``path``; ValueError naming it when it is not ONNX."""
    import onnx

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError among others; name the file
        raise ValueError(f"{path}: cannot read ONNX model: {err}") from None
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    return OnnxLayout(
        path=path,
        inputs=[(v.name, _shape(v)) for v in graph.input if v.name not in weights],
        outputs=[(v.name, _shape(v)) for v in graph.output],
        first_node_names=tuple(node.name for node in graph.node[:first_nodes]),
    )


def colour_image_input_problem(layout: OnnxLayout, form: str) -> str | None:
    """Why ``layout`` does not take one 4-D, 3-channel image input (``form`` names the shape
    expected, e.g. ``"(N, 3, S, S)"``), or None when it does."""
    if len(layout.inputs) != 1:
        return f"{len(layout.inputs)} inputs, not one"
    shape = layout.inputs[0][1]
    if len(shape) != 4 or shape[1] != 3:
        return f"input {shape} is not {form}"
    return None
