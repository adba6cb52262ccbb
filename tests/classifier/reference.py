"""Independent dense reference for Partial FC tests: full-softmax margin logits built directly
from the formulas (no partialfc.losses code), then ``F.cross_entropy``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def margin_logits(
    embeddings: Tensor,
    centers: Tensor,
    labels: Tensor,
    *,
    scale: float,
    m1: float = 1.0,
    m2_rad: float = 0.0,
    m3: float = 0.0,
    num_subcenters: int = 1,
    negative_cos_threshold: float | None = None,
    columns: Tensor | None = None,
    cosines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(logits, target)``: ``s * cos`` with ``s * (cos(m1*theta + m2) - m3)`` at the label.

    ``columns`` restricts the softmax to those classes (sorted global ids); ``target`` is then
    the label's position among them. Angles here stay below pi (no continuation branch needed).
    ``cosines`` replaces the ``(B, C*K)`` cosine matrix computed from the inputs.
    """
    if cosines is None:
        cos = F.normalize(embeddings, dim=1) @ F.normalize(centers, dim=1).t()
    else:  # given (e.g. from rounded operands)
        cos = cosines
    if num_subcenters > 1:
        cos = cos.view(cos.shape[0], -1, num_subcenters).max(dim=2).values
    if columns is not None:
        cos = cos[:, columns]
        target = torch.searchsorted(columns, labels)
        assert bool((columns[target] == labels).all()), "a positive is missing from the columns"
    else:
        target = labels
    theta = torch.acos(cos.gather(1, target[:, None]).clamp(-1.0, 1.0))
    assert bool((m1 * theta + m2_rad < torch.pi).all())
    target_value = torch.cos(m1 * theta + m2_rad) - m3
    one_hot = F.one_hot(target, cos.shape[1]).bool()
    logits = torch.where(one_hot, target_value.expand_as(cos), cos) * scale
    if negative_cos_threshold is not None:
        logits = logits.masked_fill((cos > negative_cos_threshold) & ~one_hot, float("-inf"))
    return logits, target


def dense_reference(embeddings: Tensor, centers: Tensor, labels: Tensor, **kwargs):
    """Loss and gradients (embeddings, centers) of the mean cross-entropy, in float64."""
    x = embeddings.detach().double().requires_grad_(True)
    w = centers.detach().double().requires_grad_(True)
    logits, target = margin_logits(x, w, labels, **kwargs)
    loss = F.cross_entropy(logits, target)
    loss.backward()
    return loss.detach(), x.grad, w.grad


def assert_close_at_scale(actual, expected, rtol: float = 1e-5, atol_of_max: float = 1e-5):
    """``assert_close`` with an absolute tolerance of ``atol_of_max * max|expected|``.

    Two float32 computations that sum in different orders (GEMM blocks, micro-batches, ranks)
    differ by a few ulp of the *largest* term: an element that is a small difference of large
    terms needs the tensor's scale, not its own, as the absolute tolerance.
    """
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol_of_max * scale)
