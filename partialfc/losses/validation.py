"""Input checks shared by the loss family: clear ValueErrors naming the argument."""

from __future__ import annotations

import torch
from torch import Tensor


def check_embeddings_and_labels(
    embeddings: Tensor,
    labels: Tensor,
    embedding_dim: int | None = None,
    num_classes: int | None = None,
) -> None:
    """Raise ``ValueError`` for bad shapes/dtypes, non-finite embeddings, out-of-range labels."""
    if not isinstance(embeddings, Tensor) or embeddings.dim() != 2:
        shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings)
        raise ValueError(f"embeddings must be a 2-D tensor (B, d), got {shape}")
    if not embeddings.is_floating_point():
        raise ValueError(f"embeddings must be floating point, got dtype {embeddings.dtype}")
    if embedding_dim is not None and embeddings.shape[1] != embedding_dim:
        raise ValueError(
            f"embeddings must have {embedding_dim} columns, got shape {tuple(embeddings.shape)}"
        )
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels)
        raise ValueError(f"labels must be a 1-D tensor (B,), got {shape}")
    if labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels has {labels.shape[0]} entries but embeddings has {embeddings.shape[0]} rows"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if not bool(torch.isfinite(embeddings).all()):
        bad_row = int((~torch.isfinite(embeddings)).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"embeddings contain NaN or inf (first bad row: {bad_row})")
    if num_classes is not None and labels.numel():
        bad = (labels < 0) | (labels >= num_classes)
        if bool(bad.any()):
            raise ValueError(f"labels must be in [0, {num_classes}), got {int(labels[bad][0])}")
    elif labels.numel() and bool((labels < 0).any()):
        raise ValueError(f"labels must be >= 0, got {int(labels.min())}")


def check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
