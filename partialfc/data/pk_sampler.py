"""P x K identity batches for pair and triplet losses (Hermans et al.; FaceNet batches).

Every batch holds ``P`` distinct identities with ``K`` samples each. Identities are visited in a
seeded random order, ``P`` at a time, reshuffled whenever the order runs out, so within an epoch
the identity counts differ by at most one. For an identity with at least ``K`` samples the ``K``
are drawn without replacement; an identity with fewer than ``K`` samples contributes **all** of
its samples, topped up with draws *with replacement* from them (so a batch may repeat an image of
a small identity, never of a large one).

Use as a batch sampler: ``DataLoader(dataset, batch_sampler=PKSampler(labels, P, K))``. The
batches depend only on ``(labels, P, K, seed, epoch)``: iterating twice gives the same batches;
call ``set_epoch(e)`` to move on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["PKSampler"]


def _as_label_array(labels) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-D (one label per sample), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


class PKSampler(Sampler[list[int]]):
    """Batches of ``identities_per_batch`` (P) identities x ``samples_per_identity`` (K).

    Args:
        labels: one integer label per dataset index (sequence, numpy array or tensor).
        identities_per_batch: P >= 1, at most the number of distinct labels.
        samples_per_identity: K >= 1 (>= 2 for positives to exist).
        num_batches: batches per epoch. Default ``len(labels) // (P * K)`` (at least 1).
        seed: base seed; epoch ``e`` uses ``seed + e``. Default 0.
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        identities_per_batch: int,
        samples_per_identity: int,
        num_batches: int | None = None,
        seed: int = 0,
    ) -> None:
        label_array = _as_label_array(labels)
        for name, value in (
            ("identities_per_batch", identities_per_batch),
            ("samples_per_identity", samples_per_identity),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        identities, inverse = np.unique(label_array, return_inverse=True)
        if identities_per_batch > len(identities):
            raise ValueError(
                f"identities_per_batch={identities_per_batch} exceeds the {len(identities)} "
                f"distinct labels"
            )
        batch_size = identities_per_batch * samples_per_identity
        if num_batches is None:
            num_batches = max(1, len(label_array) // batch_size)
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
            raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
        self.identities = identities
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(identities)))[:-1]
        self.members = np.split(order, bounds)  # dataset indices of each identity
        self.identities_per_batch = identities_per_batch
        self.samples_per_identity = samples_per_identity
        self.num_batches = num_batches
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_batches

    def _identity_stream(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """P distinct identity positions per batch, cycling through reshuffled orders."""
        p = self.identities_per_batch
        pending = rng.permutation(len(self.identities))
        while True:
            if len(pending) < p:
                fresh = rng.permutation(len(self.identities))
                fresh = fresh[~np.isin(fresh, pending)]
                head = np.concatenate([pending, fresh[: p - len(pending)]])
                pending = np.concatenate([fresh[p - len(pending) :], pending])
                yield head
                continue
            yield pending[:p]
            pending = pending[p:]

    def _draw(self, members: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        k = self.samples_per_identity
        if len(members) >= k:
            return rng.choice(members, size=k, replace=False)
        extra = rng.choice(members, size=k - len(members), replace=True)
        return rng.permutation(np.concatenate([members, extra]))

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        stream = self._identity_stream(rng)
        for _ in range(self.num_batches):
            positions = next(stream)
            batch = np.concatenate([self._draw(self.members[i], rng) for i in positions])
            yield batch.tolist()
