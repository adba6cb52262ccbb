"""InsightFace model-zoo recognition ONNX files: recognised by their graph, with InsightFace's
preprocessing (the rules of InsightFace's ``model_zoo`` router and ``ArcFaceONNX``).

A **recognition graph**: one image input ``(N, 3, S, S)`` with a fixed side ``S >= 112``
divisible by 16 other than 192 (the side InsightFace routes to its landmark models), and one
output ``(N, d)``.

Its **preprocessing**: the aligned crop (InsightFace's ``norm_crop``: the ArcFace five-point
template scaled by ``S / 112`` when 112 divides ``S``, else scaled by ``S / 128`` and moved
``8 · S / 128`` pixels right) is fed
in RGB channel order (InsightFace reads BGR images and swaps R and B when it builds the
blob), as ``x = (pixel - m) / s`` per channel with

* ``m = s = 127.5``, i.e. partialfc's ``(pixel / 255 - 0.5) / 0.5``; or
* ``m = 0, s = 1`` (raw 0-255 pixels) when, among the graph's first eight nodes, one is named
  ``Sub*`` or ``_minus*`` and one ``Mul*`` or ``_mul*``: the network normalises its input
  itself (models converted from MXNet).
"""

from __future__ import annotations

import os
from pathlib import Path

from partialfc.backbone.spec import PreprocessingSpec
from partialfc.onnx_layout import OnnxLayout, colour_image_input_problem, read_onnx_layout

# (mean, std) in 0-255 pixel units, as InsightFace's ArcFaceONNX states them
INSIGHTFACE_NORMALISATION = (127.5, 127.5)
IN_GRAPH_NORMALISATION = (0.0, 1.0)
LANDMARK_SIDE = 192  # InsightFace's router takes 192x192 inputs for landmark models
_SUB_PREFIXES = ("Sub", "_minus")
_MUL_PREFIXES = ("Mul", "_mul")


def recognition_problem(layout: OnnxLayout) -> str | None:
    """Why ``layout`` is not an InsightFace recognition graph, or None when it is one."""
    problem = colour_image_input_problem(layout, "(N, 3, S, S)")
    if problem:
        return problem
    shape = layout.inputs[0][1]
    side_h, side_w = shape[2:]
    if not (isinstance(side_h, int) and side_h == side_w and side_h >= 112 and side_h % 16 == 0):
        return f"input sides {side_h}x{side_w} are not one fixed S >= 112 divisible by 16"
    if side_h == LANDMARK_SIDE:
        return f"input sides {side_h}x{side_w}: an InsightFace landmark model"
    if len(layout.outputs) != 1 or len(layout.outputs[0][1]) != 2:
        shapes = [s for _, s in layout.outputs]
        return f"outputs {shapes} are not one (N, d) embedding"
    return None


def normalises_inside(layout: OnnxLayout) -> bool:
    """InsightFace's test for a graph that subtracts and scales its own input."""
    names = layout.first_node_names
    return any(n.startswith(_SUB_PREFIXES) for n in names) and any(
        n.startswith(_MUL_PREFIXES) for n in names
    )


def insightface_spec(layout: OnnxLayout, embedding_dim: int | None = None) -> PreprocessingSpec:
    """The :class:`PreprocessingSpec` InsightFace's ``ArcFaceONNX`` applies to this graph.

    ``embedding_dim``: used when the output's width is not fixed in the graph.
    """
    problem = recognition_problem(layout)
    if problem is not None:
        raise ValueError(f"{layout.path}: not an InsightFace recognition model: {problem}")
    side = int(layout.inputs[0][1][2])
    width = layout.outputs[0][1][1]
    dim = width if isinstance(width, int) else embedding_dim
    if dim is None:
        raise ValueError(f"{layout.path}: the embedding width is not fixed in the graph")
    mean, std = IN_GRAPH_NORMALISATION if normalises_inside(layout) else INSIGHTFACE_NORMALISATION
    return PreprocessingSpec(
        alignment_landmarks=None if side % 112 == 0 else _template_128(side),
        model_name=layout.path.name,
        embedding_dim=int(dim),
        input_size=(side, side),
        in_channels=3,
        colour_order="RGB",
        mean=(mean / 255.0,) * 3,
        std=(std / 255.0,) * 3,
    )


def _template_128(side: int) -> tuple[tuple[float, float], ...]:
    """InsightFace's crop template for a side that 112 does not divide (128, 256, ...)."""
    from partialfc.data.align import ARCFACE_TEMPLATE_112

    points = ARCFACE_TEMPLATE_112 * (side / 128.0) + (8.0 * side / 128.0, 0.0)
    return tuple((float(x), float(y)) for x, y in points)


def find_recognition_onnx(folder: str | os.PathLike) -> Path:
    """The recognition ONNX of an InsightFace model pack folder (the first by file name, as
    InsightFace keeps the first model of each task); ValueError naming the folder and listing
    what it holds when there is none."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.glob("*.onnx")):
        try:
            layout = read_onnx_layout(path)
        except ValueError as err:
            found.append(f"{path.name} (unreadable: {err})")
            continue
        problem = recognition_problem(layout)
        if problem is None:
            return path
        found.append(f"{path.name} ({layout.describe()})")
    held = "; ".join(found) if found else "no .onnx files"
    raise ValueError(
        f"{folder}: no recognition ONNX (one input (N, 3, S, S), S >= 112 divisible by 16, "
        f"not 192, one (N, d) output) in the folder; found: {held}"
    )
