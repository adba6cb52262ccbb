"""Exponential moving average (EMA) of the backbone weights (``train.ema_decay``).

After every optimizer step that updated the backbone, each floating-point parameter ``θ`` of
the copy moves towards the trained one::

    θ_ema ← d · θ_ema + (1 − d) · θ          (d = train.ema_decay, e.g. 0.999)

the running average of the iterates of Polyak & Juditsky (SIAM J. Control Optim., 1992), in
its exponential form as used for image models (Tan & Le, EfficientNet, ICML 2019, §5). The
average spans about ``1 / (1 − d)`` steps; it starts from the initial weights, with no
bias correction, so a run shorter than that keeps much of the initialisation in it.

Buffers (batch-norm running mean and variance, ``num_batches_tracked``) are *copied* from the
trained backbone, not averaged: they are statistics of the current weights' activations and
the EMA weights are evaluated with the most recent ones. The copy holds no gradients and lives
on the backbone's device, in its dtype.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["BackboneEMA"]


class BackboneEMA:
    """The EMA copy of ``backbone`` (``module``), updated by :meth:`update` with ``decay``."""

    def __init__(self, backbone: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"train.ema_decay must be in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.module = copy.deepcopy(backbone).eval()
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, backbone: nn.Module) -> None:
        """One step of the recurrence on the parameters; buffers copied (module docstring)."""
        d = self.decay
        for ema, trained in zip(self.module.parameters(), backbone.parameters(), strict=True):
            if ema.dtype.is_floating_point:
                ema.mul_(d).add_(trained.detach(), alpha=1.0 - d)
            else:
                ema.copy_(trained)
        for ema, trained in zip(self.module.buffers(), backbone.buffers(), strict=True):
            ema.copy_(trained)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
