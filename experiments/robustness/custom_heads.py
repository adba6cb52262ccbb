"""The two losses of the margin sweep that are not margin-softmax heads: a plain linear softmax
and a triplet loss with semi-hard mining on P x K batches.

The training engine drives a Partial FC head (``head(embeddings, labels) -> loss`` plus a
row-sparse optimizer). :func:`install_custom_head` swaps in a head with the same call and a
torch optimizer for it, so these runs share the engine's data pipeline, augmentation, LR
schedule, clipping and timing with every other row. These heads have no Partial FC
checkpoint, so the swapped trainer writes none.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

TRIPLET_MARGIN = 0.2  # on squared distances of unit vectors (FaceNet)
PK_CLASSES_PER_BATCH = 8


class LinearSoftmaxHead(nn.Module):
    """``cross_entropy(W e + b, y)`` on unnormalised embeddings (the 'Softmax' row)."""

    def __init__(self, num_classes: int, embedding_dim: int):
        super().__init__()
        self.fc = nn.Linear(embedding_dim, num_classes)

    def forward(self, embeddings, labels):
        return F.cross_entropy(self.fc(embeddings), labels)

    def consume_active_rows(self):
        return None


def semi_hard_triplet_loss(embeddings, labels, margin: float = TRIPLET_MARGIN):
    """Mean over anchor-positive pairs (a, p) of ``relu(d(a,p) - d(a,n) + margin)``, squared
    Euclidean distances of L2-normalised embeddings. ``n`` is the closest negative farther than
    the positive (semi-hard: ``d(a,p) < d(a,n)``); when the anchor has none, its farthest
    negative (FaceNet, §3.2)."""
    x = F.normalize(embeddings, dim=1)
    d = (2.0 - 2.0 * x @ x.T).clamp_min(0.0)  # (B, B)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    pos_pairs = (same & ~eye).nonzero(as_tuple=False)  # (P, 2): anchor, positive
    if len(pos_pairs) == 0:
        return embeddings.sum() * 0.0
    a, p = pos_pairs[:, 0], pos_pairs[:, 1]
    d_ap = d[a, p]  # (P,)
    d_an = d[a]  # (P, B)
    negative = ~same[a]
    inf = torch.tensor(float("inf"), device=d.device)
    beyond = negative & (d_an > d_ap[:, None])
    semi_hard = torch.where(beyond, d_an, inf).min(dim=1).values
    farthest = torch.where(negative, d_an, -inf).max(dim=1).values
    d_neg = torch.where(torch.isfinite(semi_hard), semi_hard, farthest)
    return F.relu(d_ap - d_neg + margin).mean()


class TripletHead(nn.Module):
    def forward(self, embeddings, labels):
        return semi_hard_triplet_loss(embeddings, labels)

    def consume_active_rows(self):
        return None


class _NoParameters:
    """Optimizer stand-in for a head without parameters (the LR schedule still writes lr)."""

    def __init__(self, lr: float):
        self.param_groups = [{"lr": lr, "params": []}]

    def step(self):
        pass

    def zero_grad(self, set_to_none: bool = True):
        pass


class PKBatchSampler(torch.utils.data.Sampler):
    """Indices in batches of P classes x K images (K = batch_size / P), drawn per epoch from
    ``(seed, epoch)``; same length as the uniform sampler so the engine's step count holds.
    Implements the engine's sampler hooks (``load_state_dict``, ``advance``)."""

    def __init__(self, labels, batch_size: int, classes_per_batch: int, seed: int):
        if batch_size % classes_per_batch:
            raise ValueError(f"batch_size {batch_size} is not a multiple of P={classes_per_batch}")
        self.labels = np.asarray(labels)
        self.batch_size = batch_size
        self.p = classes_per_batch
        self.k = batch_size // classes_per_batch
        self.seed = seed
        self.epoch = 0
        self.consumed = 0
        self.by_class = [np.flatnonzero(self.labels == c) for c in range(self.labels.max() + 1)]
        self.usable = np.array([c for c, m in enumerate(self.by_class) if len(m) >= 2])
        self.num_batches = len(self.labels) // batch_size

    def __len__(self):
        return self.num_batches * self.batch_size

    def load_state_dict(self, state):
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed_samples"])

    def advance(self, n: int):
        self.consumed += n

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        order: list[int] = []
        classes = rng.permutation(self.usable)
        cursor = 0
        for _ in range(self.num_batches):
            if cursor + self.p > len(classes):
                classes, cursor = rng.permutation(self.usable), 0
            for c in classes[cursor : cursor + self.p]:
                members = self.by_class[c]
                order.extend(rng.choice(members, self.k, replace=len(members) < self.k).tolist())
            cursor += self.p
        return iter(order[self.consumed :])


def install_custom_head(trainer, method: str) -> None:
    """Replace the trainer's Partial FC head by ``linear_softmax`` or ``triplet``."""
    from partialfc.train.lr_schedule import WarmupLR

    cfg = trainer.cfg
    device = trainer.ctx.device
    if method == "linear_softmax":
        head = LinearSoftmaxHead(trainer.num_classes, cfg.model.embedding_dim).to(device)
        opt = torch.optim.SGD(
            head.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
            weight_decay=cfg.optim.weight_decay,
        )  # fmt: skip
    elif method == "triplet":
        head = TripletHead()
        opt = _NoParameters(cfg.optim.lr)
        trainer.sampler = PKBatchSampler(
            trainer.train_set.labels, cfg.data.batch_size, PK_CLASSES_PER_BATCH, cfg.train.seed
        )
    else:
        raise ValueError(f"method {method!r}: choose linear_softmax or triplet")
    trainer.head = head
    trainer.head_optimizer = opt
    trainer.optimizers = [trainer.optimizer, opt]
    WarmupLR.remember_base_lr(trainer.optimizers)
    trainer.save_checkpoint = lambda: None  # no Partial FC table to write
