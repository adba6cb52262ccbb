"""Row 5 (the margin sweep of ArcFace, Deng et al., CVPR 2019): losses on clean data at
scale s = 30, full softmax (r = 1).

Plain softmax (a linear layer with bias on unnormalised embeddings), NormFace (no margin),
SphereFace m1 = 1.35, CosFace m3 = 0.35, ArcFace m2 = 0.4 / 0.5 / 0.55, and a triplet loss
alone (no classifier) with semi-hard mining on P x K batches (8 classes x 4 images; margin 0.2
on squared distances of unit embeddings), all run by the training engine; only the softmax row
swaps the engine's Partial FC head for :class:`partialfc.losses.heads.SoftmaxHead`.

    python -m experiments.robustness.margins --seeds 2 --jobs 2
"""

from __future__ import annotations

import sys

from experiments.robustness.common import experiment_main, spec

EXPERIMENT = "margins"


def _margin(m1=1.0, m2=0.0, m3=0.0) -> dict:
    return {"head.margin.m1": m1, "head.margin.m2_rad": m2, "head.margin.m3": m3}


# the engine's classifier-free run: triplet loss only, on batches of 8 classes x 4 images
TRIPLET_SEMIHARD = {
    "loss.classifier_weight": 0.0,
    "loss.triplet_weight": 1.0,
    "loss.triplet_mining": "semihard",
    "loss.triplet_margin": 0.2,
    "data.pk_identities": 8,
    "data.pk_images": 4,
}

ROWS = (
    ("Softmax (linear + bias)", {"head.kind": "softmax"}, "engine"),
    ("NormFace", _margin(), "engine"),
    ("SphereFace m1=1.35", _margin(m1=1.35), "engine"),
    ("CosFace m3=0.35", _margin(m3=0.35), "engine"),
    ("ArcFace m2=0.4", _margin(m2=0.4), "engine"),
    ("ArcFace m2=0.5", _margin(m2=0.5), "engine"),
    ("ArcFace m2=0.55", _margin(m2=0.55), "engine"),
    ("Triplet, semi-hard", TRIPLET_SEMIHARD, "engine"),
)


def per_seed(seed: int) -> list[dict]:
    return [spec(EXPERIMENT, name, seed, overrides, method=method)
            for name, overrides, method in ROWS]  # fmt: skip


def main(argv=None) -> int:
    return experiment_main(EXPERIMENT, per_seed, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
