"""What the optimizers, checkpoints and diagnostics of this package read from a Partial FC head.

:class:`ShardedCenters` is the part of :class:`~partialfc.classifier.PartialFC` that
:mod:`~partialfc.classifier.optim` and :mod:`~partialfc.classifier.checkpoint` use: this rank's
block of class centers, where they live, and the sampling state a checkpoint carries. Typing
against it instead of the class keeps the arrows one way: ``partial_fc`` imports those
modules, they never import ``partial_fc``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from partialfc.classifier.sharding import ClassBlock
from partialfc.classifier.storage import RowTable

__all__ = ["ShardedCenters"]


class ShardedCenters(Protocol):
    """This rank's shard of a class-center table (Partial FC, An et al., arXiv 2010.05222)."""

    num_classes: int
    embedding_dim: int
    num_subcenters: int
    #: ``"sparse"``: :attr:`centers` holds the rows; ``"dense"``: :attr:`weight` does
    update: str
    centers: RowTable | None
    weight: nn.Parameter
    storage_dtype: torch.dtype
    device: torch.device | str | None
    process_group: Any
    rank: int
    world_size: int
    #: this rank's contiguous class range
    block: ClassBlock
    seed: int
    sampling_step: int
    #: active rows walked at a time by the layer, its optimizers and conversions
    chunk_rows: int

    def consume_active_rows(self) -> Any:
        """The last forward's record of active rows (``ActiveRows``), or ``None``; cleared."""

    def parameters(self, recurse: bool = True) -> Any: ...
