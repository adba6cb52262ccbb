"""Fused margin-softmax cross-entropy (the hot path of every margin head).

``margin_cross_entropy(cos, target_col, margin)`` equals
``F.cross_entropy(margin(cos, target_col), target_col)`` (mean over rows) in value and gradient.
``normalized_margin_cross_entropy(embeddings, centers, target_col, margin)`` additionally fuses
the L2 normalisation of both sides and the cosine GEMM, ``cos = x_hat @ w_hat^T``.

Both keep a single ``(B, N)`` float32 buffer: the forward pass writes ``exp(logit - row max)``
into it and the backward pass turns it in place into the gradient

    d loss / d cos[i, j] = s (p[i, j] - [j = t_i]) / B                     (j != t_i)
    d loss / d cos[i, t] = (p[i, t] - 1) / B * d(s f(cos)) / d cos          (f: target logit)

so a graph through them can be differentiated once (a second backward raises); with
``reuse_buffer=False`` the gradient goes to a fresh tensor instead (same arithmetic), which allows
``retain_graph`` and ``gradcheck`` at the cost of one more ``(B, N)`` allocation. The margin's
derivative comes from autograd on the B target values, so these paths and
:class:`~partialfc.losses.margins.CombinedMargin` cannot disagree. The fused GEMM variant never
materialises the normalised centers: with ``r_c = 1 / |w_c|`` it scales the cosine matrix by
``r`` in place and, in backward, uses ``grad_w = r grad_u - r^3 w <w, grad_u>`` on the GEMM
output, so its only ``(B, N)``/``(N, d)`` allocations are the ones the bare GEMMs make anyway.
Its three GEMMs take operands in ``precision`` (float32 by default; bfloat16 / float16 with
float32 accumulation, :mod:`partialfc.losses.gemm_precision`); the rest is float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from partialfc.losses.gemm_precision import GemmPrecision
from partialfc.losses.margins import CombinedMargin

__all__ = ["margin_cross_entropy", "normalized_margin_cross_entropy"]

_NORM_EPS = 1e-12


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(1)`` as one batched product (no ``(N, d)`` temporary, a single kernel)."""
    return torch.einsum("nd,nd->n", a, b)


def _target_logit_and_slope(margin: CombinedMargin, target_cos: Tensor) -> tuple[Tensor, Tensor]:
    """``s f(cos_t)`` and its derivative on the B target cosines (autograd on B values only)."""
    with torch.enable_grad():
        leaf = target_cos.detach().requires_grad_(True)
        logit = margin.target_logit(leaf) * margin.scale
        (slope,) = torch.autograd.grad(logit.sum(), leaf)
    return logit.detach(), slope


def _softmax_in_place(buffer: Tensor, index: Tensor, target_logit: Tensor):
    """Buffer holds the scaled logits (target column already set); leave exp(logit - max)."""
    buffer.scatter_(1, index, target_logit.unsqueeze(1))
    row_max = buffer.amax(dim=1)
    buffer.sub_(row_max.unsqueeze(1)).exp_()
    row_sum = buffer.sum(dim=1)
    losses = row_max + row_sum.log() - target_logit
    p_target = torch.exp(target_logit - row_max) / row_sum
    return losses, row_sum, p_target


def _gradient_buffer(ctx) -> Tensor:
    """The forward buffer itself (first and only backward) or a copy (``reuse_buffer=False``)."""
    if not ctx.reuse_buffer:
        return ctx.buffer.clone()
    if ctx.consumed:
        raise RuntimeError(
            "the fused margin cross-entropy reuses its buffer for the gradient and can be "
            "differentiated only once per forward; pass reuse_buffer=False to differentiate again"
        )
    ctx.consumed = True
    buffer, ctx.buffer = ctx.buffer, None
    return buffer


class _MarginCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, cos: Tensor, target_col: Tensor, margin: CombinedMargin, reuse_buffer: bool
    ) -> Tensor:
        work_dtype = torch.promote_types(cos.dtype, torch.float32)
        index = target_col.unsqueeze(1)
        target_cos = cos.gather(1, index).squeeze(1).to(work_dtype)
        target_logit, slope = _target_logit_and_slope(margin, target_cos)
        buffer = torch.empty(cos.shape, dtype=work_dtype, device=cos.device)
        if cos.dtype == work_dtype:
            torch.mul(cos, margin.scale, out=buffer)
        else:  # widen first so the scaling is not rounded in the narrow dtype
            buffer.copy_(cos).mul_(margin.scale)
        losses, row_sum, p_target = _softmax_in_place(buffer, index, target_logit)
        ctx.buffer = buffer  # an intermediate, so kept on ctx (overwritten by backward)
        ctx.save_for_backward(row_sum, p_target, slope, target_col)
        ctx.scale = margin.scale
        ctx.cos_dtype = cos.dtype
        ctx.consumed = False
        ctx.reuse_buffer = reuse_buffer
        return losses.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor):
        row_sum, p_target, slope, target_col = ctx.saved_tensors
        buffer = _gradient_buffer(ctx)
        grad_mean = grad_loss.to(buffer.dtype) / buffer.shape[0]
        buffer.mul_((grad_mean * ctx.scale / row_sum).unsqueeze(1))
        grad_target = (p_target - 1.0) * grad_mean * slope
        buffer.scatter_(1, target_col.unsqueeze(1), grad_target.unsqueeze(1))
        return buffer.to(ctx.cos_dtype), None, None, None


class _NormalizedMarginCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        unit_embeddings: Tensor,
        centers: Tensor,
        target_col: Tensor,
        margin: CombinedMargin,
        reuse_buffer: bool,
        precision: GemmPrecision | None,
    ) -> Tensor:
        inv_norms = torch.linalg.vector_norm(centers, dim=1).clamp_min_(_NORM_EPS).reciprocal_()
        if precision is None:
            buffer = unit_embeddings @ centers.T  # raw dot products, (B, N), fresh
        else:
            buffer = precision.mm(unit_embeddings, centers.T)
        index = target_col.unsqueeze(1)
        target_cos = buffer.gather(1, index).squeeze(1) * inv_norms[target_col]
        target_logit, slope = _target_logit_and_slope(margin, target_cos)
        buffer.mul_(inv_norms * margin.scale)  # scaled cosines
        losses, row_sum, p_target = _softmax_in_place(buffer, index, target_logit)
        ctx.buffer = buffer  # an intermediate, so kept on ctx (overwritten by backward)
        ctx.save_for_backward(
            row_sum, p_target, slope, target_col, unit_embeddings, centers, inv_norms
        )
        ctx.scale = margin.scale
        ctx.consumed = False
        ctx.reuse_buffer = reuse_buffer
        ctx.precision = precision
        return losses.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor):
        row_sum, p_target, slope, target_col, unit_embeddings, centers, inv_norms = (
            ctx.saved_tensors
        )
        buffer = _gradient_buffer(ctx)
        # cos = raw * r (r: inverse center norms). Off the target, d loss / d raw[i, j] =
        # row_coef[i] * exp[i, j] * r[j]; the per-row factor is moved onto the small (B, d) side
        # so the (B, N) buffer is touched once. The target entry holds d loss / d raw[i, t]
        # divided by row_coef[i], i.e. (p_t - 1) * slope * r_t * row_sum / s.
        grad_mean = grad_loss.to(buffer.dtype) / buffer.shape[0]
        row_coef = grad_mean * ctx.scale / row_sum
        target_value = (p_target - 1.0) * slope * inv_norms[target_col] * row_sum / ctx.scale
        buffer.mul_(inv_norms)
        buffer.scatter_(1, target_col.unsqueeze(1), target_value.unsqueeze(1))
        prec = ctx.precision
        if prec is None:
            grad_embeddings = (buffer @ centers).mul_(row_coef.unsqueeze(1))
            # grad_a = d loss / d raw^T @ x_hat = r * (d loss / d unit centers)
            grad_centers = buffer.T @ (unit_embeddings * row_coef.unsqueeze(1))
        else:  # the same products with low-precision operands
            buffer_op = prec.operand(buffer)
            grad_embeddings = prec.mm(buffer_op, prec.operand(centers), rounded=True)
            grad_embeddings.mul_(row_coef.unsqueeze(1))
            scaled = prec.operand(unit_embeddings * row_coef.unsqueeze(1))
            grad_centers = prec.mm(buffer_op.T, scaled, rounded=True)
        # through r = 1 / |w|:  grad_w = grad_a - r^2 w <w, grad_a>
        along = _row_dot(centers, grad_centers).mul_(inv_norms.square())
        along.mul_(inv_norms < 1.0 / _NORM_EPS)  # clamped (zero) rows: r is a constant there
        grad_centers.addcmul_(centers, along.unsqueeze(1), value=-1.0)
        return grad_embeddings, grad_centers, None, None, None, None


def _check_margin_inputs(margin: CombinedMargin, num_rows: int, num_cols: int, target_col):
    if not isinstance(margin, CombinedMargin):
        raise ValueError(f"margin must be a CombinedMargin, got {type(margin).__name__}")
    margin.check_hyperparameters()
    if target_col.dim() != 1 or target_col.shape[0] != num_rows:
        raise ValueError(f"target_col must have shape ({num_rows},), got {tuple(target_col.shape)}")
    if target_col.dtype.is_floating_point or target_col.dtype == torch.bool:
        raise ValueError(f"target_col must be an integer tensor, got dtype {target_col.dtype}")
    if num_rows == 0:
        raise ValueError("the batch must have at least one row")
    bad = (target_col < 0) | (target_col >= num_cols)
    if bool(bad.any()):
        raise ValueError(
            f"target_col values must be in [0, {num_cols}) for the loss, "
            f"got {int(target_col[bad][0])}"
        )


def margin_cross_entropy(
    cos: Tensor, target_col: Tensor, margin: CombinedMargin, reuse_buffer: bool = True
) -> Tensor:
    """Mean cross-entropy of ``margin(cos, target_col)`` against ``target_col``, fused.

    Args:
        cos: ``(B, N)`` cosines in [-1, 1].
        target_col: ``(B,)`` column of each row's class; every row must have one (no -1).
        margin: the :class:`CombinedMargin` to apply (its scale included).
        reuse_buffer: backward overwrites the forward buffer (default True; see module doc).

    Returns:
        Scalar loss, float32 (float64 for float64 input).
    """
    if cos.dim() != 2 or not cos.is_floating_point():
        raise ValueError(f"cos must be a 2-D floating tensor (B, N), got {tuple(cos.shape)}")
    _check_margin_inputs(margin, cos.shape[0], cos.shape[1], target_col)
    return _MarginCrossEntropy.apply(cos, target_col.long(), margin, bool(reuse_buffer))


def normalized_margin_cross_entropy(
    embeddings: Tensor,
    centers: Tensor,
    target_col: Tensor,
    margin: CombinedMargin,
    reuse_buffer: bool = True,
    precision: GemmPrecision | None = None,
) -> Tensor:
    """Mean margin cross-entropy of ``cos = normalize(embeddings) @ normalize(centers)^T``.

    Args:
        embeddings: ``(B, d)`` un-normalised embeddings.
        centers: ``(N, d)`` un-normalised class centers (one per column).
        target_col: ``(B,)`` row of ``centers`` holding each sample's class.
        margin: the :class:`CombinedMargin` to apply.
        reuse_buffer: backward overwrites the forward buffer (default True; see module doc).
        precision: operand precision of the three GEMMs (default None: the inputs' dtype);
            see :func:`partialfc.losses.gemm_precision.gemm_precision`.

    Returns:
        Scalar loss in the (common, at least float32) dtype of the inputs.
    """
    if embeddings.dim() != 2 or centers.dim() != 2 or embeddings.shape[1] != centers.shape[1]:
        raise ValueError(
            f"embeddings (B, d) and centers (N, d) must share d, got "
            f"{tuple(embeddings.shape)} and {tuple(centers.shape)}"
        )
    _check_margin_inputs(margin, embeddings.shape[0], centers.shape[0], target_col)
    work_dtype = torch.promote_types(
        torch.promote_types(embeddings.dtype, centers.dtype), torch.float32
    )
    unit = F.normalize(embeddings.to(work_dtype), dim=1, eps=_NORM_EPS)
    return _NormalizedMarginCrossEntropy.apply(
        unit, centers.to(work_dtype), target_col.long(), margin, bool(reuse_buffer), precision
    )
