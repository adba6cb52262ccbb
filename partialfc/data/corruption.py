"""Controlled corruption of a labelled set, for robustness studies (Partial FC, An et al.,
CVPR 2022, §3.3, tables 3-5): label flips, inter-class conflicts and long-tail resampling.

Each function takes the clean labels (int64 (N,), contiguous 0..K-1) and a seed, and returns a
:class:`Corruption` that keeps the ground truth next to what the model will see; wrap the base
dataset with :class:`CorruptedDataset` to train on it. Same labels + same seed -> same result.

* :func:`flip_labels` — exactly ``round(rate·N)`` samples get a label drawn uniformly from the
  other K-1 classes (table 4: WebFace12M-Flip 10/20/40 %).
* :func:`split_identities` — ``round(fraction·K)`` identities are each split at random into
  ``parts`` pseudo classes of (near-)equal size, so one person appears as several classes
  (table 3: 200K of WebFace12M's 600K identities split into 600K -> 1M classes, i.e.
  ``fraction=1/3, parts=3``).
* :func:`long_tail` — classes are sub-sampled so that a target fraction of them has fewer than
  ``k`` images (table 5; WebFace42M has 44.57 % of identities with < 10 images).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

from partialfc.data.loaders import check_contiguous_labels


@dataclass
class Corruption:
    """What a corruption did. All arrays have one entry per sample of the corrupted set.

    indices: int64, position of each sample in the base set.
    labels: int64, the label to train on (possibly wrong / a pseudo class).
    clean_labels: int64, the true identity.
    noisy_mask: bool, True where ``labels`` misrepresents the identity (flipped label, or a
        sample of an identity that was split into several classes).
    num_classes: number of classes in ``labels``.
    counts: what was done (numbers of samples / classes affected), for reports.
    """

    indices: np.ndarray
    labels: np.ndarray
    clean_labels: np.ndarray
    noisy_mask: np.ndarray
    num_classes: int
    counts: dict[str, float] = field(default_factory=dict)


def _clean(labels) -> tuple[np.ndarray, int]:
    labels = np.asarray(labels, dtype=np.int64)
    return labels, check_contiguous_labels(labels, "labels")


def flip_labels(labels, rate: float, seed: int = 0) -> Corruption:
    """Give exactly ``round(rate·N)`` random samples a uniformly random *different* class."""
    labels, k = _clean(labels)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if k < 2 and rate > 0:
        raise ValueError("label flips need at least 2 classes")
    rng = np.random.default_rng(seed)
    n = len(labels)
    flipped = rng.choice(n, size=int(round(rate * n)), replace=False)
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + rng.integers(1, k, size=len(flipped))) % k
    mask = np.zeros(n, dtype=bool)
    mask[flipped] = True
    return Corruption(
        indices=np.arange(n, dtype=np.int64),
        labels=noisy,
        clean_labels=labels,
        noisy_mask=mask,
        num_classes=k,
        counts={"samples": n, "flipped_samples": int(mask.sum()), "flip_rate": mask.mean()},
    )


def split_identities(labels, fraction: float, parts: int = 3, seed: int = 0) -> Corruption:
    """Split ``round(fraction·K)`` identities (chosen among those with >= ``parts`` images)
    into ``parts`` pseudo classes each. Part 0 keeps the identity's label; the others get new
    labels K, K+1, ... so labels stay contiguous."""
    labels, k = _clean(labels)
    if parts < 2:
        raise ValueError(f"parts must be >= 2, got {parts}")
    rng = np.random.default_rng(seed)
    sizes = np.bincount(labels, minlength=k)
    eligible = np.flatnonzero(sizes >= parts)
    wanted = int(round(fraction * k))
    if wanted > len(eligible):
        raise ValueError(
            f"cannot split {wanted} identities into {parts}: only {len(eligible)} of {k} "
            f"have >= {parts} images"
        )
    chosen = np.sort(rng.choice(eligible, size=wanted, replace=False))
    noisy = labels.copy()
    mask = np.zeros(len(labels), dtype=bool)
    next_label = k
    for identity in chosen:
        members = rng.permutation(np.flatnonzero(labels == identity))
        part = np.arange(len(members)) % parts
        new_labels = np.concatenate([[identity], np.arange(next_label, next_label + parts - 1)])
        noisy[members] = new_labels[part]
        mask[members] = True
        next_label += parts - 1
    return Corruption(
        indices=np.arange(len(labels), dtype=np.int64),
        labels=noisy,
        clean_labels=labels,
        noisy_mask=mask,
        num_classes=next_label,
        counts={
            "identities": k,
            "identities_split": wanted,
            "pseudo_classes_added": next_label - k,
            "classes_after": next_label,
            "samples_in_split_identities": int(mask.sum()),
        },
    )


def long_tail(labels, tail_fraction: float, k: int = 10, seed: int = 0) -> Corruption:
    """Sub-sample classes so that ``round(tail_fraction·K)`` classes have fewer than ``k``
    images: classes with >= ``k`` images are chosen at random and cut to a size drawn
    uniformly from 1..k-1. Classes already in the tail count toward the target; if there are
    already enough, nothing is removed. Labels stay clean (``noisy_mask`` is all False)."""
    labels, num_classes = _clean(labels)
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    rng = np.random.default_rng(seed)
    sizes = np.bincount(labels, minlength=num_classes)
    already = int((sizes < k).sum())
    target = int(round(tail_fraction * num_classes))
    heads = np.flatnonzero(sizes >= k)
    to_cut = max(target - already, 0)
    if to_cut > len(heads):
        raise ValueError(f"cannot reach {target} tail classes: only {num_classes} classes")
    cut = rng.choice(heads, size=to_cut, replace=False)
    keep = np.ones(len(labels), dtype=bool)
    for identity in cut:
        members = np.flatnonzero(labels == identity)
        size = int(rng.integers(1, k))
        keep[rng.choice(members, size=len(members) - size, replace=False)] = False
    indices = np.flatnonzero(keep).astype(np.int64)
    final_sizes = np.bincount(labels[indices], minlength=num_classes)
    return Corruption(
        indices=indices,
        labels=labels[indices],
        clean_labels=labels[indices],
        noisy_mask=np.zeros(len(indices), dtype=bool),
        num_classes=num_classes,
        counts={
            "classes": num_classes,
            "tail_classes_before": already,
            "classes_cut": int(to_cut),
            "tail_classes_after": int((final_sizes < k).sum()),
            "tail_fraction_after": float((final_sizes < k).mean()),
            "samples_before": len(labels),
            "samples_after": len(indices),
        },
    )


class CorruptedDataset(Dataset):
    """A base labelled dataset seen through a :class:`Corruption`.

    Yields ``(image, label)`` (+ index into this dataset with ``return_index``) where ``label``
    is the corrupted label; ``labels``, ``clean_labels``, ``noisy_mask`` stay available.
    """

    def __init__(self, base, corruption: Corruption, return_index: bool = False):
        if len(corruption.indices) and corruption.indices.max() >= len(base):
            raise ValueError(
                f"corruption refers to sample {int(corruption.indices.max())} of a base set of "
                f"{len(base)} samples"
            )
        self.base = base
        self.corruption = corruption
        self.return_index = return_index

    def __len__(self) -> int:
        return len(self.corruption.indices)

    @property
    def labels(self) -> np.ndarray:
        return self.corruption.labels

    @property
    def clean_labels(self) -> np.ndarray:
        return self.corruption.clean_labels

    @property
    def noisy_mask(self) -> np.ndarray:
        return self.corruption.noisy_mask

    @property
    def num_classes(self) -> int:
        return self.corruption.num_classes

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | tuple[torch.Tensor, int, int]:
        image = self.base[int(self.corruption.indices[index])][0]
        label = int(self.corruption.labels[index])
        return (image, label, int(index)) if self.return_index else (image, label)
