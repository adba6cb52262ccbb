"""Distributed sampler with a resumable position inside an epoch.

Each epoch draws one permutation of the dataset (seeded by ``seed + epoch``), padded by
wrapping around so that every rank gets the same number of samples (or truncated with
``drop_last``). The position is kept as the **global** number of samples consumed this epoch:
rank ``r`` of ``W`` takes ``order[consumed + r :: W]``. Because the position is global, a run
resumed with a different number of ranks still continues the same epoch where it stopped.

The engine tells the sampler what was consumed (``advance(global_batch_size)`` after each
step) — DataLoader workers prefetch ahead, so counting yielded indices would overcount.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler[int]):
    """Every rank's share of each epoch, resumable mid-epoch via ``state_dict()``.

    Args: dataset_size (or any sized dataset), num_replicas (world size, default 1), rank
    (default 0), shuffle (default True), seed (default 0), drop_last (default False).
    """

    def __init__(
        self,
        dataset_size,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        self.dataset_size = dataset_size if isinstance(dataset_size, int) else len(dataset_size)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.consumed_samples = 0

    @property
    def total_size(self) -> int:
        """Samples per epoch over all ranks (a multiple of ``num_replicas``)."""
        if self.drop_last:
            return self.dataset_size // self.num_replicas * self.num_replicas
        return math.ceil(self.dataset_size / self.num_replicas) * self.num_replicas

    def epoch_order(self) -> torch.Tensor:
        """The global order of this epoch, padded/truncated to ``total_size``."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=g)
        else:
            order = torch.arange(self.dataset_size)
        total = self.total_size
        if total > len(order):
            repeats = math.ceil(total / max(len(order), 1))
            order = order.repeat(repeats)
        return order[:total]

    def __iter__(self):
        order = self.epoch_order()[self.consumed_samples :]
        return iter(order[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        remaining = max(self.total_size - self.consumed_samples, 0)
        return len(range(self.rank, remaining, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (unless it is the epoch being resumed)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.consumed_samples = 0

    def advance(self, num_samples: int) -> None:
        """Record that ``num_samples`` more samples (summed over all ranks) were consumed."""
        self.consumed_samples = min(self.consumed_samples + int(num_samples), self.total_size)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed_samples": self.consumed_samples, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.consumed_samples = int(state["consumed_samples"])
        self.seed = int(state.get("seed", self.seed))
