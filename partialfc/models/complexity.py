"""Parameter and multiply-accumulate counting.

Units, explicitly: ``macs`` counts multiply-accumulates of convolutions, matrix products and
attention (``torch.utils.flop_counter.FlopCounterMode`` reports ``2 × MACs`` as FLOPs; we
halve it). The ArcFace / InsightFace "GFLOPs" tables (r18 2.6, r50 6.3, r100 12.1,
r200 23.5 at 112×112) are MAC counts of the same layers, so compare ``gmacs`` to them and
``gflops = 2 × gmacs`` to hardware FLOP/s. BatchNorm, PReLU, additions and pooling are not
counted (under 1% of the total for these backbones).

Counting runs on the ``meta`` device when the model is built there, so IResNet-200 is
counted without allocating its weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class Complexity:
    params: int  # all parameters, trainable or not
    trainable_params: int
    macs: int  # multiply-accumulates of one forward pass on one image

    @property
    def gmacs(self) -> float:
        return self.macs / 1e9

    @property
    def gflops(self) -> float:
        """Forward FLOPs per image, counting a MAC as 2 FLOPs."""
        return 2 * self.macs / 1e9

    def to_dict(self) -> dict:
        return {**asdict(self), "gmacs": self.gmacs, "gflops": self.gflops}


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_macs(model: nn.Module, input_size: tuple[int, int], in_channels: int) -> int:
    """MACs of one forward pass of one image, in eval mode, on the model's own device."""
    param = next(model.parameters())
    x = torch.empty(1, in_channels, *input_size, device=param.device, dtype=param.dtype)
    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2


def complexity(model: nn.Module) -> Complexity:
    """Parameters and MACs of a partialfc backbone (uses its ``input_size``/``in_channels``)."""
    return Complexity(
        params=count_parameters(model),
        trainable_params=count_parameters(model, trainable_only=True),
        macs=count_macs(model, model.input_size, model.in_channels),
    )
