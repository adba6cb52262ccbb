"""The cleaning rule of Sub-center ArcFace (Deng et al., ECCV 2020, §3.2): each sample's angle
to the dominant sub-center of its labelled class; samples beyond the threshold (75 degrees by
default; the paper tested 70-85) are dropped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_THRESHOLD_DEG = 75.0


@dataclass
class CleaningResult:
    """Per-sample outcome of the cleaning rule (arrays have one entry per sample, N).

    labels: int64 training labels.
    assigned_subcenter: int64, the sub-center of its own class each sample is closest to.
    dominant_subcenter: int64 (C,), per class the most-assigned sub-center (-1: empty class).
    is_dominant: bool, ``assigned_subcenter == dominant_subcenter[label]``.
    angle_deg: float32, angle to the dominant center of its own class, degrees.
    keep: bool, ``angle_deg <= threshold_deg``.
    noisy_mask: bool ground truth (True = wrong label), or None when unknown.
    """

    labels: np.ndarray
    assigned_subcenter: np.ndarray
    dominant_subcenter: np.ndarray
    is_dominant: np.ndarray
    angle_deg: np.ndarray
    keep: np.ndarray
    threshold_deg: float
    num_subcenters: int
    noisy_mask: np.ndarray | None = None

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def groups(self) -> dict[str, int]:
        """Sample counts: dominant / non-dominant (x clean / noisy when ground truth is known)."""
        dom = self.is_dominant
        if self.noisy_mask is None:
            return {"dominant": int(dom.sum()), "non_dominant": int((~dom).sum())}
        noisy = self.noisy_mask
        return {
            "dominant_clean": int((dom & ~noisy).sum()),
            "dominant_noisy": int((dom & noisy).sum()),
            "non_dominant_clean": int((~dom & ~noisy).sum()),
            "non_dominant_noisy": int((~dom & noisy).sum()),
        }

    def removal_quality(self) -> dict[str, float] | None:
        """Against the ground truth: how many removed samples were noisy (precision), how many
        noisy samples were removed (recall), and the noise rate before and after."""
        if self.noisy_mask is None:
            return None
        removed, noisy = ~self.keep, self.noisy_mask
        hits = int((removed & noisy).sum())
        return {
            "removed": int(removed.sum()),
            "removed_noisy": hits,
            "precision": hits / max(int(removed.sum()), 1),
            "recall": hits / max(int(noisy.sum()), 1),
            "noise_rate_before": float(noisy.mean()) if noisy.size else 0.0,
            "noise_rate_after": float(noisy[self.keep].mean()) if self.keep.any() else 0.0,
        }

    def per_class(self) -> dict[str, np.ndarray]:
        """Per class: samples, kept, assigned to the dominant sub-center, and the dominant index."""
        c = len(self.dominant_subcenter)
        return {
            "samples": np.bincount(self.labels, minlength=c),
            "kept": np.bincount(self.labels[self.keep], minlength=c),
            "dominant_assigned": np.bincount(self.labels[self.is_dominant], minlength=c),
            "dominant_subcenter": self.dominant_subcenter,
        }

    def summary(self) -> dict:
        per_class = self.per_class()
        kept_per_class = per_class["kept"][per_class["samples"] > 0]
        out = {
            "samples": self.num_samples,
            "kept": int(self.keep.sum()),
            "removed": int((~self.keep).sum()),
            "threshold_deg": self.threshold_deg,
            "num_subcenters": self.num_subcenters,
            "classes": int(len(self.dominant_subcenter)),
            "classes_emptied": int((kept_per_class == 0).sum()),
            "groups": self.groups(),
            "angle_deg_quantiles": {
                str(q): float(np.quantile(self.angle_deg, q)) if self.num_samples else 0.0
                for q in (0.05, 0.25, 0.5, 0.75, 0.95)
            },
        }
        quality = self.removal_quality()
        if quality is not None:
            out["removal_vs_ground_truth"] = quality
        return out


def clean_by_dominant_subcenter(
    own_cos: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    threshold_deg: float = DEFAULT_THRESHOLD_DEG,
    noisy_mask: np.ndarray | None = None,
) -> CleaningResult:
    """Apply the rule to ``own_cos`` (N, K): cosines of each sample to its own class's K
    sub-centers (see :func:`own_class_subcenter_cosines`).

    Ties in the per-class vote go to the lowest sub-center index (``np.argmax``).
    """
    own_cos = np.asarray(own_cos, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    if own_cos.ndim != 2 or own_cos.shape[0] != labels.shape[0]:
        raise ValueError(
            f"own_cos must be (N, K) with N = len(labels) = {labels.shape[0]}, got {own_cos.shape}"
        )
    if not 0.0 < threshold_deg <= 180.0:
        raise ValueError(f"threshold_deg must be in (0, 180], got {threshold_deg}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes})")
    if noisy_mask is not None:
        noisy_mask = np.asarray(noisy_mask, dtype=bool)
        if noisy_mask.shape != labels.shape:
            raise ValueError(f"noisy_mask has shape {noisy_mask.shape}, labels {labels.shape}")
    k = own_cos.shape[1]
    assigned = own_cos.argmax(axis=1).astype(np.int64)
    votes = np.zeros((num_classes, k), dtype=np.int64)
    np.add.at(votes, (labels, assigned), 1)
    dominant = votes.argmax(axis=1).astype(np.int64)
    dominant[votes.sum(axis=1) == 0] = -1
    dom_of_sample = dominant[labels]
    cos_dom = own_cos[np.arange(len(labels)), dom_of_sample] if labels.size else own_cos[:, 0]
    from partialfc.losses.margins import angle_from_cos

    angle = torch.rad2deg(angle_from_cos(torch.from_numpy(np.ascontiguousarray(cos_dom))))
    angle_deg = angle.numpy().astype(np.float32)
    return CleaningResult(
        labels=labels,
        assigned_subcenter=assigned,
        dominant_subcenter=dominant,
        is_dominant=assigned == dom_of_sample,
        angle_deg=angle_deg,
        keep=angle_deg <= threshold_deg,
        threshold_deg=float(threshold_deg),
        num_subcenters=k,
        noisy_mask=noisy_mask,
    )
