"""Small autograd helpers shared by the classifier and the training loop."""

from __future__ import annotations

import torch


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scale_gradient(x: torch.Tensor, factor) -> torch.Tensor:
    """Identity in the forward pass; multiplies the gradient by ``factor`` (float or 0-d tensor).

    Partial FC scales the embedding gradient by the world size (so that DDP's average is the
    global-batch gradient); the training loop applies the fp16 GradScaler's loss scale between
    the backbone and the fp32 head with it.
    """
    return _ScaleGradient.apply(x, factor)
