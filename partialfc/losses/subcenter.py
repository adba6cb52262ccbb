"""Sub-center reduction (Sub-center ArcFace, Deng et al., ECCV 2020): max over the K centers of each
class.

Center tables are class-major: rows ``c*K ... c*K + K - 1`` belong to class ``c``, so the cosine
matrix ``(B, N*K)`` reshapes to ``(B, N, K)`` without copying. The max is taken *before* the
margin; the argmax names each sample's dominant sub-center (used by the cleaning recipe).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["max_over_subcenters"]


def max_over_subcenters(
    cos: Tensor, num_subcenters: int, class_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Reduce ``(B, N*K)`` cosines to ``(B, N)`` by the max over each class's K sub-centers.

    Args:
        cos: ``(B, N*K)`` cosines, class-major (column ``c*K + k`` is sub-center k of class c).
        num_subcenters: K >= 1.
        class_dim: the dimension that holds the ``N*K`` centers: 1 (default, ``(B, N*K)``) or
            0 for the transposed ``(N*K, B)`` layout (Partial FC's score buffer); the result
            then has shape ``(N, B)``.

    Returns:
        ``(max_cos, argmax)``: ``(B, N)`` maximum cosine per class and ``(B, N)`` long index
        ``k`` in ``[0, K)`` of the sub-center that attains it. Gradients flow to the argmax entry.
        For K = 1 the cosines are returned as they are and the argmax is a broadcast view of a
        single zero (read-only; no ``(B, N)`` allocation).
    """
    if isinstance(num_subcenters, bool) or not isinstance(num_subcenters, int):
        raise ValueError(f"num_subcenters must be an int >= 1, got {num_subcenters!r}")
    if num_subcenters < 1:
        raise ValueError(f"num_subcenters must be >= 1, got {num_subcenters}")
    if class_dim not in (0, 1):
        raise ValueError(f"class_dim must be 0 or 1, got {class_dim!r}")
    if cos.dim() != 2:
        raise ValueError(f"cos must be 2-D (B, N*K), got shape {tuple(cos.shape)}")
    if cos.shape[class_dim] % num_subcenters != 0:
        raise ValueError(
            f"cos has {cos.shape[class_dim]} centers along dim {class_dim}, not a multiple of "
            f"num_subcenters={num_subcenters}"
        )
    if num_subcenters == 1:
        return cos, torch.zeros((), dtype=torch.long, device=cos.device).expand(cos.shape)
    if class_dim == 0:
        grouped = cos.reshape(cos.shape[0] // num_subcenters, num_subcenters, cos.shape[1])
        return grouped.max(dim=1)
    batch, columns = cos.shape
    grouped = cos.reshape(batch, columns // num_subcenters, num_subcenters)
    max_cos, argmax = grouped.max(dim=2)
    return max_cos, argmax
