"""Small ONNX graphs laid out like InsightFace's model-zoo files, built with ``onnx.helper``
(no weights are downloaded): a recognition graph (``w600k_r50.onnx``-like, optionally with the
MXNet-style ``_minus``/``_mul`` input nodes) and SCRFD detection graphs (``det_10g.onnx``-like)
whose outputs are either constants chosen by the caller or a function of the input's red
channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(graph, path: Path, opset: int = 13) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def recognition_graph(
    path: Path, side: int = 112, dim: int = 16, normalises_inside: bool = False, seed: int = 0
) -> Path:
    """``input.1`` ``(N, 3, side, side)`` -> ``fc1`` ``(N, dim)``: a 16x16 stride-16 convolution
    (4 channels, weights differ per colour channel) then a fully connected layer.

    ``normalises_inside``: the graph starts with ``_minus0`` (x - 127.5) and ``_mul0``
    (x · 0.0078125), as MXNet-converted InsightFace models do; it then takes raw pixels.
    """
    rng = np.random.default_rng(seed)
    cells = (side // 16) ** 2 * 4
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.05, (4, 3, 16, 16)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (dim, cells)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (dim,)).astype(np.float32), "fc_b"),
    ]
    nodes, current = [], "input.1"
    if normalises_inside:
        weights += [
            numpy_helper.from_array(np.array(127.5, np.float32), "mean"),
            numpy_helper.from_array(np.array(0.0078125, np.float32), "scale"),
        ]
        nodes += [
            helper.make_node("Sub", ["input.1", "mean"], ["centred"], name="_minus0"),
            helper.make_node("Mul", ["centred", "scale"], ["scaled"], name="_mul0"),
        ]
        current = "scaled"
    nodes += [
        helper.make_node(
            "Conv",
            [current, "conv_w"],
            ["conv"],
            name="Conv_0",
            kernel_shape=[16, 16],
            strides=[16, 16],
        ),
        helper.make_node("Flatten", ["conv"], ["flat"], name="Flatten_1", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["fc1"], name="Gemm_2", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "recognition",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["None", 3, side, side])],
        [helper.make_tensor_value_info("fc1", TensorProto.FLOAT, ["None", dim])],
        weights,
    )
    return _save(graph, path)


def other_graph(path: Path, side: int = 192, outputs: int = 1) -> Path:
    """A graph InsightFace does not take for recognition or detection (e.g. its 192x192
    landmark models): global average pooling of a ``(N, 3, side, side)`` input."""
    nodes = [helper.make_node("GlobalAveragePool", ["data"], ["pooled"], name="Pool_0")]
    outs = []
    for k in range(outputs):
        nodes.append(helper.make_node("Flatten", ["pooled"], [f"out{k}"], name=f"Flatten_{k}"))
        outs.append(helper.make_tensor_value_info(f"out{k}", TensorProto.FLOAT, ["N", 3]))
    graph = helper.make_graph(
        nodes,
        "other",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, side, side])],
        outs,
    )
    return _save(graph, path)


def scrfd_constant_graph(
    path: Path,
    size: tuple[int, int],
    strides: tuple[int, ...],
    anchors: int,
    entries: dict[tuple[int, int], tuple[float, list[float], list[float]]],
    keypoints: bool = True,
    batched: bool = False,
) -> Path:
    """An SCRFD-shaped graph with a fixed ``(1, 3, H, W)`` input (``size = (H, W)``) whose
    outputs are constants: every anchor scores 0 except ``entries[(stride, anchor index)] =
    (score, [l, t, r, b] in strides, [dx1, dy1, ..., dx5, dy5] in strides)``."""
    height, width = size
    scores, boxes, points = [], [], []
    for s in strides:
        count = (height // s) * (width // s) * anchors
        score = np.zeros((count, 1), np.float32)
        box = np.zeros((count, 4), np.float32)
        point = np.zeros((count, 10), np.float32)
        for (stride, index), (value, distances, offsets) in entries.items():
            if stride == s:
                score[index, 0], box[index], point[index] = value, distances, offsets
        scores.append(score)
        boxes.append(box)
        points.append(point)
    arrays = scores + boxes + (points if keypoints else [])
    nodes, outputs = [], []
    for k, array in enumerate(arrays):
        array = array[None] if batched else array
        nodes.append(
            helper.make_node(
                "Constant",
                [],
                [f"out{k}"],
                name=f"Constant_{k}",
                value=numpy_helper.from_array(array, f"value{k}"),
            )
        )
        outputs.append(helper.make_tensor_value_info(f"out{k}", TensorProto.FLOAT, array.shape))
    graph = helper.make_graph(
        nodes,
        "scrfd_constant",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, height, width])],
        outputs,
    )
    return _save(graph, path)


def scrfd_red_graph(path: Path, distance: float = 2.0) -> Path:
    """An SCRFD-shaped graph (strides 8, 16, 32, two anchors, keypoints) with a free
    ``(1, 3, H, W)`` input: the score of each cell is the mean of the normalised red channel
    over the cell (0.996 on pure red, -0.996 on black), the same for both anchors; every box is
    ``distance`` strides from the anchor centre on each side; keypoint ``k`` sits ``k / 4`` of a
    stride right and down of the centre."""
    offsets = np.array([[k / 4, k / 4] for k in range(5)], np.float32).reshape(1, 10)
    weights = [
        numpy_helper.from_array(np.array([-1, 1], np.int64), "column"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.full((1, 4), distance, np.float32), "distances"),
        numpy_helper.from_array(offsets, "offsets"),
        numpy_helper.from_array(np.array(0.0, np.float32), "nothing"),
    ]
    nodes, scores, boxes, points = [], [], [], []
    nodes.append(helper.make_node("Slice", ["input.1", "zero", "one", "one"], ["red"]))
    for s in (8, 16, 32):
        nodes += [
            helper.make_node(
                "AveragePool", ["red"], [f"pool{s}"], kernel_shape=[s, s], strides=[s, s]
            ),
            helper.make_node("Transpose", [f"pool{s}"], [f"cells{s}"], perm=[0, 2, 3, 1]),
            helper.make_node("Concat", [f"cells{s}", f"cells{s}"], [f"pair{s}"], axis=3),
            helper.make_node("Reshape", [f"pair{s}", "column"], [f"score{s}"]),
            helper.make_node("Mul", [f"score{s}", "nothing"], [f"zeros{s}"]),
            helper.make_node("Add", [f"zeros{s}", "distances"], [f"box{s}"]),
            helper.make_node("Add", [f"zeros{s}", "offsets"], [f"kps{s}"]),
        ]
        scores.append(helper.make_tensor_value_info(f"score{s}", TensorProto.FLOAT, [f"K{s}", 1]))
        boxes.append(helper.make_tensor_value_info(f"box{s}", TensorProto.FLOAT, [f"K{s}", 4]))
        points.append(helper.make_tensor_value_info(f"kps{s}", TensorProto.FLOAT, [f"K{s}", 10]))
    graph = helper.make_graph(
        nodes,
        "scrfd_red",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "?", "?"])],
        scores + boxes + points,
        weights,
    )
    return _save(graph, path)
