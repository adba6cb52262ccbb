"""The margin sweep's plain linear softmax, the one loss the training engine does not run.

The training engine drives a Partial FC head (``head(embeddings, labels) -> loss`` plus a
row-sparse optimizer). :func:`install_custom_head` swaps in a head with the same call and a
torch optimizer for it, so this run shares the engine's data pipeline, augmentation, LR
schedule, clipping and timing with every other row. The head has no Partial FC checkpoint, so
the swapped trainer writes none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearSoftmaxHead(nn.Module):
    """``cross_entropy(W e + b, y)`` on unnormalised embeddings (the 'Softmax' row)."""

    def __init__(self, num_classes: int, embedding_dim: int):
        super().__init__()
        self.fc = nn.Linear(embedding_dim, num_classes)

    def forward(self, embeddings, labels):
        return F.cross_entropy(self.fc(embeddings), labels)

    def consume_active_rows(self):
        return None


def install_custom_head(trainer, method: str) -> None:
    """Replace the trainer's Partial FC head by ``linear_softmax``."""
    from partialfc.train.lr_schedule import WarmupLR

    cfg = trainer.cfg
    device = trainer.ctx.device
    if method == "linear_softmax":
        head = LinearSoftmaxHead(trainer.num_classes, cfg.model.embedding_dim).to(device)
        opt = torch.optim.SGD(
            head.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
            weight_decay=cfg.optim.weight_decay,
        )  # fmt: skip
    else:
        raise ValueError(f"method {method!r}: only linear_softmax")
    trainer.head = head
    trainer.head_optimizer = opt
    trainer.optimizers = [trainer.optimizer, opt]
    WarmupLR.remember_base_lr(trainer.optimizers)
    trainer.save_checkpoint = lambda: None  # no Partial FC table to write
