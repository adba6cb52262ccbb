"""Greedy non-maximum suppression in plain PyTorch (no torchvision)."""

from __future__ import annotations

import torch


def box_overlap(
    box: torch.Tensor, others: torch.Tensor, mode: str = "union", inclusive: bool = False
) -> torch.Tensor:
    """Overlap of one ``(4,)`` box ``x1, y1, x2, y2`` with ``(N, 4)`` boxes.

    ``mode="union"``: intersection over union; ``mode="min"``: intersection over the smaller
    area (suppresses a small box lying inside a larger one). ``inclusive``: sides are
    ``x2 - x1 + 1`` (corners are pixel indices, the Fast R-CNN convention InsightFace keeps).
    """
    one = 1.0 if inclusive else 0.0
    x1 = torch.maximum(box[0], others[:, 0])
    y1 = torch.maximum(box[1], others[:, 1])
    x2 = torch.minimum(box[2], others[:, 2])
    y2 = torch.minimum(box[3], others[:, 3])
    inter = (x2 - x1 + one).clamp(min=0) * (y2 - y1 + one).clamp(min=0)
    area = (box[2] - box[0] + one).clamp(min=0) * (box[3] - box[1] + one).clamp(min=0)
    areas = (others[:, 2] - others[:, 0] + one).clamp(min=0) * (
        others[:, 3] - others[:, 1] + one
    ).clamp(min=0)
    if mode == "union":
        denominator = area + areas - inter
    elif mode == "min":
        denominator = torch.minimum(area, areas)
    else:
        raise ValueError(f"mode must be 'union' or 'min', got {mode!r}")
    return inter / denominator.clamp(min=1e-12)


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    threshold: float,
    mode: str = "union",
    inclusive: bool = False,
):
    """Indices of the boxes kept by greedy NMS, highest score first (equal scores: in input
    order).

    A box is dropped when its overlap (see :func:`box_overlap`, ``mode`` and ``inclusive``)
    with a higher-scoring kept box exceeds ``threshold``.
    """
    if boxes.ndim != 2 or boxes.shape[1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"need (N, 4) boxes and (N,) scores, got {boxes.shape}, {scores.shape}")
    order = torch.argsort(scores, descending=True, stable=True)
    boxes = boxes[order]
    if len(boxes) <= 2048:  # one overlap matrix, then a greedy pass over the kept rows
        over = _overlap_matrix(boxes, mode, inclusive) > threshold
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
        remaining = rest[box_overlap(boxes[best], boxes[rest], mode, inclusive) <= threshold]
    return order[torch.stack(keep)] if keep else torch.zeros(0, dtype=torch.long)


def _overlap_matrix(boxes: torch.Tensor, mode: str, inclusive: bool = False) -> torch.Tensor:
    """``(N, N)`` pairwise overlaps (see :func:`box_overlap`)."""
    one = 1.0 if inclusive else 0.0
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt + one).clamp(min=0).prod(dim=2)
    area = (boxes[:, 2:] - boxes[:, :2] + one).clamp(min=0).prod(dim=1)
    if mode == "union":
        denominator = area[:, None] + area[None, :] - inter
    elif mode == "min":
        denominator = torch.minimum(area[:, None], area[None, :])
    else:
        raise ValueError(f"mode must be 'union' or 'min', got {mode!r}")
    return inter / denominator.clamp(min=1e-12)
