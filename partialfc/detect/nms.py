"""Greedy non-maximum suppression in plain PyTorch (no torchvision)."""

from __future__ import annotations

import torch


def box_overlap(box: torch.Tensor, others: torch.Tensor, mode: str = "union") -> torch.Tensor:
    """Overlap of one ``(4,)`` box ``x1, y1, x2, y2`` with ``(N, 4)`` boxes.

    ``mode="union"``: intersection over union; ``mode="min"``: intersection over the smaller
    area (suppresses a small box lying inside a larger one).
    """
    x1 = torch.maximum(box[0], others[:, 0])
    y1 = torch.maximum(box[1], others[:, 1])
    x2 = torch.minimum(box[2], others[:, 2])
    y2 = torch.minimum(box[3], others[:, 3])
    inter = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    area = (box[2] - box[0]).clamp(min=0) * (box[3] - box[1]).clamp(min=0)
    areas = (others[:, 2] - others[:, 0]).clamp(min=0) * (others[:, 3] - others[:, 1]).clamp(min=0)
    if mode == "union":
        denominator = area + areas - inter
    elif mode == "min":
        denominator = torch.minimum(area, areas)
    else:
        raise ValueError(f"mode must be 'union' or 'min', got {mode!r}")
    return inter / denominator.clamp(min=1e-12)


def nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float, mode: str = "union"):
    """Indices of the boxes kept by greedy NMS, highest score first.

    A box is dropped when its overlap (see :func:`box_overlap`) with a higher-scoring kept box
    exceeds ``threshold``.
    """
    if boxes.ndim != 2 or boxes.shape[1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"need (N, 4) boxes and (N,) scores, got {boxes.shape}, {scores.shape}")
    order = torch.argsort(scores, descending=True)
    boxes = boxes[order]
    if len(boxes) <= 2048:  # one overlap matrix, then a greedy pass over the kept rows
        over = _overlap_matrix(boxes, mode) > threshold
        removed = torch.zeros(len(boxes), dtype=torch.bool)
        keep = []
        for i in range(len(boxes)):
            if not removed[i]:
                keep.append(i)
                removed |= over[i]
        return order[torch.tensor(keep, dtype=torch.long)]
    keep = []
    remaining = torch.arange(len(boxes))
    while remaining.numel() > 0:
        best = remaining[0]
        keep.append(best)
        rest = remaining[1:]
        remaining = rest[box_overlap(boxes[best], boxes[rest], mode) <= threshold]
    return order[torch.stack(keep)] if keep else torch.zeros(0, dtype=torch.long)


def _overlap_matrix(boxes: torch.Tensor, mode: str) -> torch.Tensor:
    """``(N, N)`` pairwise overlaps (see :func:`box_overlap`)."""
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    area = (boxes[:, 2:] - boxes[:, :2]).clamp(min=0).prod(dim=1)
    if mode == "union":
        denominator = area[:, None] + area[None, :] - inter
    elif mode == "min":
        denominator = torch.minimum(area[:, None], area[None, :])
    else:
        raise ValueError(f"mode must be 'union' or 'min', got {mode!r}")
    return inter / denominator.clamp(min=1e-12)
