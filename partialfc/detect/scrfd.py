"""SCRFD face detector (an ONNX file, e.g. ``det_10g.onnx`` of an InsightFace model pack).

J. Guo, J. Deng, A. Lattas, S. Zafeiriou, "Sample and Computation Redistribution for Efficient
Face Detection", ICLR 2022; decoding as InsightFace's ``SCRFD`` class.

**Graph layout.** One input ``(1, 3, H, W)``; ``3·F`` outputs (``F`` strides) in groups of
``F``: scores ``(K_s, 1)``, box distances ``(K_s, 4)``, and with landmarks keypoint offsets
``(K_s, 10)`` (a leading batch axis of 1 is allowed; a last axis the graph leaves free is
accepted). 6 or 9 outputs: strides 8, 16, 32 with
two anchors per cell; 10 or 15 outputs: strides 8 ... 128 with one anchor. ``K_s = (H // s) ·
(W // s) · anchors``, cells in row-major order, the anchors of one cell consecutive.

**Detection.** The RGB image is resized keeping its aspect ratio to fit the input size
(``int`` rounding of the free side, bilinear) and placed at the top-left of a black canvas;
input ``(pixel - 127.5) / 128``, RGB order. For a cell ``(i, j)`` at stride ``s`` the anchor
centre is ``(j·s, i·s)``; a box is ``centre ∓ s·(l, t, r, b)`` and landmark ``k`` is
``centre + s·(dx_k, dy_k)``, both divided by the resize scale. Candidates scoring at least
``score_threshold`` go through greedy NMS (IoU > ``nms_threshold`` suppressed, sides counted
inclusively as ``x2 - x1 + 1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from partialfc.detect.base import Face, as_rgb
from partialfc.detect.nms import nms
from partialfc.onnx_layout import OnnxLayout, colour_image_input_problem, read_onnx_layout

INPUT_MEAN = 127.5
INPUT_STD = 128.0
# outputs -> (strides, anchors per cell, has keypoints)
LAYOUTS = {
    6: ((8, 16, 32), 2, False),
    9: ((8, 16, 32), 2, True),
    10: ((8, 16, 32, 64, 128), 1, False),
    15: ((8, 16, 32, 64, 128), 1, True),
}
GROUP_WIDTHS = (1, 4, 10)  # scores, box distances, keypoint offsets


def layout_problem(layout: OnnxLayout) -> str | None:
    """Why ``layout`` is not an SCRFD graph, or None when it is one."""
    problem = colour_image_input_problem(layout, "(1, 3, H, W)")
    if problem:
        return problem
    count = len(layout.outputs)
    if count not in LAYOUTS:
        return f"{count} outputs, not 6, 9, 10 or 15"
    strides = len(LAYOUTS[count][0])
    for index, (name, out) in enumerate(layout.outputs):
        width = GROUP_WIDTHS[index // strides]
        # a width the graph leaves free (a name) is accepted; a fixed one must match
        if len(out) not in (2, 3) or (isinstance(out[-1], int) and out[-1] != width):
            return f"output {index} ({name}) has shape {out}, expected (K, {width})"
    return None


@dataclass(frozen=True)
class Detections:
    """``boxes`` ``(N, 4)`` x1, y1, x2, y2; ``scores`` ``(N,)``; ``keypoints`` ``(N, 5, 2)`` or
    None; best score first."""

    boxes: np.ndarray
    scores: np.ndarray
    keypoints: np.ndarray | None


def anchor_centres(height: int, width: int, stride: int, anchors: int) -> np.ndarray:
    """``(height·width·anchors, 2)`` float32 ``(x, y)`` centres, row-major, anchors repeated."""
    ys, xs = np.mgrid[:height, :width]
    centres = np.stack([xs, ys], axis=-1).reshape(-1, 2).astype(np.float32) * stride
    return np.repeat(centres, anchors, axis=0)


def distances_to_boxes(centres: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """``(K, 4)`` boxes from centres ``(K, 2)`` and ``(left, top, right, bottom)`` distances."""
    return np.concatenate([centres - distances[:, :2], centres + distances[:, 2:4]], axis=1)


def offsets_to_keypoints(centres: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(K, P, 2)`` points from centres ``(K, 2)`` and ``(K, 2P)`` ``(dx, dy)`` offsets."""
    return centres[:, None, :] + offsets.reshape(len(offsets), offsets.shape[1] // 2, 2)


class SCRFD:
    """An SCRFD ONNX model as a :class:`~partialfc.detect.base.FaceDetector`.

    ``input_size``: ``(width, height)`` of the network input (a graph with fixed sides uses
    its own); ``score_threshold``, ``nms_threshold``: as InsightFace's defaults (0.5, 0.4);
    ``device``: ``cpu`` or ``cuda[:N]`` (onnxruntime's CUDA provider).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        input_size: tuple[int, int] = (640, 640),
        score_threshold: float = 0.5,
        nms_threshold: float = 0.4,
        device: str = "cpu",
    ):
        import onnxruntime as ort

        self.path = Path(path)
        layout = read_onnx_layout(self.path)
        problem = layout_problem(layout)
        if problem is not None:
            raise ValueError(f"{self.path}: not an SCRFD detection model: {problem}")
        if not 0 <= score_threshold <= 1 or not 0 <= nms_threshold <= 1:
            raise ValueError(
                f"thresholds must be in [0, 1], got {score_threshold} and {nms_threshold}"
            )
        self.strides, self.anchors, self.has_keypoints = LAYOUTS[len(layout.outputs)]
        _, _, fixed_h, fixed_w = layout.inputs[0][1]
        if isinstance(fixed_h, int) and isinstance(fixed_w, int):
            input_size = (fixed_w, fixed_h)
        if len(input_size) != 2 or min(input_size) < max(self.strides):
            raise ValueError(f"input_size must be (width, height) >= {max(self.strides)}")
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.score_threshold = float(score_threshold)
        self.nms_threshold = float(nms_threshold)
        self.batched = len(layout.outputs[0][1]) == 3
        try:
            self.session = ort.InferenceSession(str(self.path), providers=_providers(device))
        except Exception as err:  # noqa: BLE001 - ORT raises several types; name the file
            raise ValueError(f"{self.path}: cannot load ONNX model: {err}") from None
        self.input_name = self.session.get_inputs()[0].name

    def network_input(self, image: np.ndarray) -> tuple[np.ndarray, float]:
        """RGB ``(H, W, 3)`` uint8 -> ``((1, 3, h, w) float32 input, resize scale)``."""
        width, height = self.input_size
        if image.shape[0] / image.shape[1] > height / width:
            new_h = height
            new_w = int(new_h / (image.shape[0] / image.shape[1]))
        else:
            new_w = width
            new_h = int(new_w * (image.shape[0] / image.shape[1]))
        canvas = np.zeros((height, width, 3), dtype=np.uint8)
        canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h))
        x = (canvas.astype(np.float32) - INPUT_MEAN) / INPUT_STD
        return np.ascontiguousarray(x.transpose(2, 0, 1)[None]), new_h / image.shape[0]

    def candidates(self, blob: np.ndarray) -> Detections:
        """Every anchor scoring at least the threshold, in network-input pixels, unsorted."""
        outputs = self.session.run(None, {self.input_name: blob})
        if self.batched:
            outputs = [o[0] for o in outputs]
        count, (height, width) = len(self.strides), blob.shape[2:]
        scores, boxes, points = [], [], []
        for k, stride in enumerate(self.strides):
            centres = anchor_centres(height // stride, width // stride, stride, self.anchors)
            score = outputs[k].reshape(-1)
            keep = score >= self.score_threshold
            scores.append(score[keep])
            distances = outputs[k + count][keep] * stride
            boxes.append(distances_to_boxes(centres[keep], distances))
            if self.has_keypoints:
                offsets = outputs[k + 2 * count][keep] * stride
                points.append(offsets_to_keypoints(centres[keep], offsets))
        return Detections(
            np.concatenate(boxes).astype(np.float32),
            np.concatenate(scores).astype(np.float32),
            np.concatenate(points).astype(np.float32) if self.has_keypoints else None,
        )

    def detect_arrays(self, image: np.ndarray, max_num: int = 0) -> Detections:
        """Boxes, scores and keypoints in image pixels after NMS, best score first.

        ``max_num > 0``: keep that many, ranked as InsightFace does by box area minus twice
        the squared distance of the box centre from the image centre.
        """
        image = as_rgb(image)
        blob, scale = self.network_input(image)
        found = self.candidates(blob)
        order = np.argsort(-found.scores, kind="stable")
        boxes, scores = found.boxes[order] / scale, found.scores[order]
        points = found.keypoints[order] / scale if found.keypoints is not None else None
        keep = (
            nms(
                torch.from_numpy(boxes),
                torch.from_numpy(scores),
                self.nms_threshold,
                inclusive=True,
            ).numpy()
            if len(boxes)
            else np.zeros(0, dtype=np.int64)
        )
        boxes, scores = boxes[keep], scores[keep]
        points = points[keep] if points is not None else None
        if 0 < max_num < len(boxes):
            area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            centre_y, centre_x = image.shape[0] // 2, image.shape[1] // 2
            off_x = (boxes[:, 0] + boxes[:, 2]) / 2 - centre_x
            off_y = (boxes[:, 1] + boxes[:, 3]) / 2 - centre_y
            best = np.argsort(area - 2.0 * (off_x**2 + off_y**2))[::-1][:max_num]
            boxes, scores = boxes[best], scores[best]
            points = points[best] if points is not None else None
        return Detections(boxes, scores, points)

    def detect(self, image: np.ndarray) -> list[Face]:
        """Faces in a uint8 RGB (or grey) image, highest score first (needs a graph with
        keypoints: alignment uses them)."""
        if not self.has_keypoints:
            raise ValueError(f"{self.path}: this SCRFD model gives no landmarks; cannot align")
        found = self.detect_arrays(image)
        return [
            Face(box=b.astype(np.float32), score=float(s), landmarks=p.astype(np.float32))
            for b, s, p in zip(found.boxes, found.scores, found.keypoints, strict=True)
        ]


def _providers(device: str) -> list:
    """onnxruntime providers for ``cpu`` or ``cuda[:N]`` (CUDA needs ``onnxruntime-gpu``)."""
    import onnxruntime as ort

    text = str(device)
    if text == "cpu":
        return ["CPUExecutionProvider"]
    kind, _, index = text.partition(":")
    if kind != "cuda" or not (index == "" or index.isdigit()):
        raise ValueError(f"SCRFD device must be cpu, cuda or cuda:N, got {text!r}")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ValueError(f"SCRFD on {text} needs onnxruntime-gpu's CUDA provider")
    return [("CUDAExecutionProvider", {"device_id": int(index or 0)}), "CPUExecutionProvider"]


def find_scrfd_onnx(folder: str | os.PathLike) -> Path:
    """The SCRFD detection ONNX of an InsightFace model pack folder (the first by file name);
    ValueError naming the folder and listing what it holds when there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    found = []
    for path in sorted(folder.glob("*.onnx")):
        try:
            layout = read_onnx_layout(path)
        except ValueError as err:
            found.append(f"{path.name} (unreadable: {err})")
            continue
        if layout_problem(layout) is None:
            return path
        found.append(f"{path.name} ({layout.describe()})")
    held = "; ".join(found) if found else "no .onnx files"
    raise ValueError(
        f"{folder}: no SCRFD detection ONNX (one (1, 3, H, W) input; 6, 9, 10 or 15 outputs "
        f"of scores, boxes and landmarks per stride) in the folder; found: {held}"
    )
