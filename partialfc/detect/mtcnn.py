"""MTCNN face detector with five landmarks, in PyTorch.

K. Zhang, Z. Zhang, Z. Li, Y. Qiao, "Joint Face Detection and Alignment Using Multitask
Cascaded Convolutional Networks", IEEE Signal Processing Letters 23(10), 2016.

Three small networks run as a cascade:

* **P-Net** (fully convolutional, 12x12 receptive field, stride 2) scans an image pyramid and
  proposes windows with a face probability and a box regression;
* **R-Net** (24x24 input) rescores and refines the surviving windows;
* **O-Net** (48x48 input) rescores and refines them again and regresses the five landmarks.

Between stages: non-maximum suppression, box regression, squaring of boxes. Inputs are scaled
as ``(x - 127.5) / 128``. The fully connected layers of R-Net and O-Net read the feature map
flattened in (width, height, channel) order, the layout in which the released weights were
trained. Weights: ``weights/mtcnn_{pnet,rnet,onet}.safetensors`` (see ``weights/README.md``).
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from partialfc.detect.base import Face, as_rgb
from partialfc.detect.nms import nms

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


class PNet(nn.Module):
    """Proposal network: ``(N, 3, H, W)`` -> face probability ``(N, H', W')``, box offsets
    ``(N, 4, H', W')`` with ``H' = ceil((H - 2) / 2) - 4`` (one cell per 12x12 window, stride 2).
    """

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, 1)  # face / not-face logits
        self.conv4_2 = nn.Conv2d(32, 4, 1)  # box offsets

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 2, 2, ceil_mode=True)
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return torch.softmax(self.conv4_1(x), dim=1)[:, 1], self.conv4_2(x)


def _flatten_whc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 2, 1).flatten(1)


class RNet(nn.Module):
    """Refinement network: ``(N, 3, 24, 24)`` -> face probability ``(N,)``, offsets ``(N, 4)``."""

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = self.prelu4(self.dense4(_flatten_whc(self.prelu3(self.conv3(x)))))
        return torch.softmax(self.dense5_1(x), dim=1)[:, 1], self.dense5_2(x)


class ONet(nn.Module):
    """Output network: ``(N, 3, 48, 48)`` -> probability ``(N,)``, offsets ``(N, 4)``, landmarks
    ``(N, 10)`` (five x then five y, as fractions of the box width/height)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu3(self.conv3(x)), 2, 2, ceil_mode=True)
        x = self.prelu5(self.dense5(_flatten_whc(self.prelu4(self.conv4(x)))))
        return torch.softmax(self.dense6_1(x), dim=1)[:, 1], self.dense6_2(x), self.dense6_3(x)


def _load(net: nn.Module, name: str, weights_dir: Path) -> nn.Module:
    from safetensors.torch import load_file

    path = weights_dir / f"mtcnn_{name}.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: MTCNN weights missing (reinstall partialfc)")
    net.load_state_dict(load_file(str(path)), strict=True)
    return net.eval()


def _normalise(batch: np.ndarray) -> torch.Tensor:
    """uint8 ``(N, H, W, 3)`` -> float ``(N, 3, H, W)`` scaled as ``(x - 127.5) / 128``."""
    x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2).float()
    return (x - 127.5) * 0.0078125


def _square(boxes: np.ndarray) -> np.ndarray:
    """Grow each ``x1, y1, x2, y2`` box to a square of side max(w, h), same centre."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    out = boxes.copy()
    out[:, 0] = boxes[:, 0] + (w - side) / 2
    out[:, 1] = boxes[:, 1] + (h - side) / 2
    out[:, 2:4] = out[:, 0:2] + side[:, None]
    return out


def _regress(boxes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Move each box edge by its offset times the box width (x) or height (y)."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return boxes + offsets * np.stack([w, h, w, h], axis=1)


def _crops(image: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    """``size`` x ``size`` resamples of integer boxes; parts outside the image read as 0."""
    height, width = image.shape[:2]
    out = np.zeros((len(boxes), size, size, 3), dtype=np.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.astype(np.int64)):
        if x2 <= x1 or y2 <= y1:
            continue
        patch = np.zeros((y2 - y1, x2 - x1, 3), dtype=np.uint8)
        sx1, sy1, sx2, sy2 = max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)
        if sx2 > sx1 and sy2 > sy1:
            patch[sy1 - y1 : sy2 - y1, sx1 - x1 : sx2 - x1] = image[sy1:sy2, sx1:sx2]
        out[i] = cv2.resize(patch, (size, size), interpolation=cv2.INTER_AREA)
    return out


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, mode: str = "union"):
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    return nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold, mode).numpy()


class MTCNN:
    """The three-stage MTCNN cascade; ``detect(image)`` returns :class:`Face` objects.

    ``min_face_size``: smallest face side searched, in pixels (sets the first pyramid scale
    12 / min_face_size); ``scale_factor``: pyramid step; ``thresholds``: face probability
    needed to pass P-Net, R-Net, O-Net; ``device``: where the networks run.
    """

    def __init__(
        self,
        min_face_size: float = 20.0,
        thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
        scale_factor: float = 0.709,
        device: str | torch.device = "cpu",
        weights_dir: str | Path | None = None,
    ):
        if min_face_size < 12:
            raise ValueError(f"min_face_size must be >= 12 pixels, got {min_face_size}")
        if not 0 < scale_factor < 1:
            raise ValueError(f"scale_factor must be in (0, 1), got {scale_factor}")
        if len(thresholds) != 3 or not all(0 <= t <= 1 for t in thresholds):
            raise ValueError(f"thresholds must be three probabilities, got {thresholds}")
        self.min_face_size = float(min_face_size)
        self.thresholds = tuple(float(t) for t in thresholds)
        self.scale_factor = float(scale_factor)
        self.device = torch.device(device)
        weights_dir = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
        self.pnet = _load(PNet(), "pnet", weights_dir).to(self.device)
        self.rnet = _load(RNet(), "rnet", weights_dir).to(self.device)
        self.onet = _load(ONet(), "onet", weights_dir).to(self.device)

    def scales(self, height: int, width: int) -> list[float]:
        """Pyramid scales: from 12 / min_face_size down while the short side stays >= 12."""
        scale = 12.0 / self.min_face_size
        side = min(height, width) * scale
        out = []
        while side >= 12:
            out.append(scale)
            scale *= self.scale_factor
            side *= self.scale_factor
        return out

    @torch.inference_mode()
    def detect(self, image: np.ndarray) -> list[Face]:
        """Faces in a uint8 RGB (or grey) image, highest score first."""
        image = as_rgb(image)
        boxes = self._propose(image)
        if len(boxes):
            boxes = self._refine(image, boxes)
        if not len(boxes):
            return []
        boxes, landmarks = self._output(image, boxes)
        return [
            Face(box=b[:4].astype(np.float32), score=float(b[4]), landmarks=p.astype(np.float32))
            for b, p in zip(boxes, landmarks, strict=True)
        ]

    def _run(self, net: nn.Module, batch: np.ndarray):
        outputs = [
            net(_normalise(batch[i : i + 512]).to(self.device)) for i in range(0, len(batch), 512)
        ]
        return [torch.cat(parts).float().cpu().numpy() for parts in zip(*outputs, strict=True)]

    def _propose(self, image: np.ndarray) -> np.ndarray:
        """Stage 1: ``(N, 5)`` square integer boxes + P-Net score."""
        height, width = image.shape[:2]
        found = []
        for scale in self.scales(height, width):
            h, w = math.ceil(height * scale), math.ceil(width * scale)
            resized = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
            prob, offsets = self.pnet(_normalise(resized[None]).to(self.device))
            prob, offsets = prob[0].float().cpu().numpy(), offsets[0].float().cpu().numpy()
            rows, cols = np.nonzero(prob >= self.thresholds[0])
            if not len(rows):
                continue
            x1, y1 = 2 * cols / scale, 2 * rows / scale
            boxes = np.stack([x1, y1, x1 + 12 / scale, y1 + 12 / scale], axis=1)
            scores = prob[rows, cols]
            keep = _nms(boxes, scores, 0.5)
            found.append(
                np.concatenate(
                    [boxes[keep], scores[keep, None], offsets[:, rows[keep], cols[keep]].T], axis=1
                )
            )
        if not found:
            return np.zeros((0, 5))
        cand = np.concatenate(found)
        cand = cand[_nms(cand[:, :4], cand[:, 4], 0.7)]
        boxes = np.floor(_square(_regress(cand[:, :4], cand[:, 5:9])))
        return np.concatenate([boxes, cand[:, 4:5]], axis=1)

    def _refine(self, image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
        """Stage 2: R-Net rescoring, NMS, regression."""
        prob, offsets = self._run(self.rnet, _crops(image, boxes[:, :4], 24))
        keep = prob >= self.thresholds[1]
        boxes, prob, offsets = boxes[keep, :4], prob[keep], offsets[keep]
        keep = _nms(boxes, prob, 0.7)
        boxes = np.floor(_square(_regress(boxes[keep], offsets[keep])))
        return np.concatenate([boxes, prob[keep, None]], axis=1)

    def _output(self, image: np.ndarray, boxes: np.ndarray):
        """Stage 3: O-Net rescoring, landmarks, regression, NMS (overlap over the smaller)."""
        prob, offsets, points = self._run(self.onet, _crops(image, boxes[:, :4], 48))
        keep = prob >= self.thresholds[2]
        boxes, prob, offsets, points = boxes[keep, :4], prob[keep], offsets[keep], points[keep]
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        xs = boxes[:, 0:1] + w[:, None] * points[:, :5]
        ys = boxes[:, 1:2] + h[:, None] * points[:, 5:]
        landmarks = np.stack([xs, ys], axis=2)
        boxes = _regress(boxes, offsets)
        keep = _nms(boxes, prob, 0.7, mode="min")
        return np.concatenate([boxes[keep], prob[keep, None]], axis=1), landmarks[keep]
