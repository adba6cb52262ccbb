"""Input checks shared by the loss family: clear ValueErrors naming the argument."""

from __future__ import annotations

import torch
from torch import Tensor


def embeddings_and_labels_error(
    embeddings: Tensor,
    labels: Tensor,
    embedding_dim: int | None = None,
    num_classes: int | None = None,
    names: tuple[str, str] = ("embeddings", "labels"),
    check_finite: bool = True,
    check_label_range: bool = True,
) -> str | None:
    """What is wrong with ``(B, d)`` float embeddings and ``(B,)`` integer labels, or None.

    Checks shapes, dtypes, ``d == embedding_dim``, labels in ``[0, num_classes)`` (or >= 0)
    and, with ``check_finite``, that no embedding is NaN or inf. ``names`` are the argument
    names the message uses. Partial FC asks for the message instead of an exception, so that
    every rank can learn that one rank's input is bad before any collective runs.
    ``check_finite=False, check_label_range=False`` checks what the host knows (shapes and
    dtypes) without reading values from the device.
    """
    e_name, l_name = names
    if not isinstance(embeddings, Tensor) or embeddings.dim() != 2:
        shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings)
        return f"{e_name} must be a 2-D tensor (B, d), got {shape}"
    if not embeddings.is_floating_point():
        return f"{e_name} must be floating point, got dtype {embeddings.dtype}"
    if embedding_dim is not None and embeddings.shape[1] != embedding_dim:
        return (
            f"{e_name} has dimension {embeddings.shape[1]}, expected embedding_dim={embedding_dim}"
        )
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels)
        return f"{l_name} must be a 1-D tensor (B,), got {shape}"
    if labels.shape[0] != embeddings.shape[0]:
        return f"{l_name} has {labels.shape[0]} entries for {embeddings.shape[0]} embeddings"
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        return f"{l_name} must be an integer tensor, got dtype {labels.dtype}"
    if check_finite and not bool(torch.isfinite(embeddings).all()):
        bad_row = int((~torch.isfinite(embeddings)).any(dim=1).nonzero()[0, 0])
        return f"{e_name} contain NaN or inf (first bad row: {bad_row})"
    if not check_label_range:
        return None
    if num_classes is not None and labels.numel():
        bad = (labels < 0) | (labels >= num_classes)
        if bool(bad.any()):
            return (
                f"{l_name} contains {int(labels[bad][0])}, outside [0, num_classes={num_classes})"
            )
    elif labels.numel() and bool((labels < 0).any()):
        return f"{l_name} must be >= 0, got {int(labels.min())}"
    return None


def check_embeddings_and_labels(
    embeddings: Tensor,
    labels: Tensor,
    embedding_dim: int | None = None,
    num_classes: int | None = None,
) -> None:
    """Raise ``ValueError`` with :func:`embeddings_and_labels_error`'s message, if any."""
    error = embeddings_and_labels_error(embeddings, labels, embedding_dim, num_classes)
    if error is not None:
        raise ValueError(error)


def check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
