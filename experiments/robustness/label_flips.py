"""Row 2 (Partial FC, An et al., CVPR 2022, table 4): 10 / 20 / 40 % label flips; FC vs PFC r = 0.1
vs PFC* r = 0.1 (negatives with cosine > 0.4 dropped from the softmax).

    python -m experiments.robustness.label_flips --seeds 2 --jobs 2
"""

from __future__ import annotations

import sys

from experiments.robustness.common import experiment_main, spec

EXPERIMENT = "label_flips"
FLIP_RATES = (0.1, 0.2, 0.4)
METHODS = (
    ("FC (r=1)", {"head.sample_rate": 1.0}),
    ("PFC r=0.1", {"head.sample_rate": 0.1}),
    ("PFC* r=0.1 (0.4)", {"head.sample_rate": 0.1, "head.negative_cos_threshold": 0.4}),
)


def per_seed(seed: int) -> list[dict]:
    return [
        spec(EXPERIMENT, f"flip {int(rate * 100)}% {name}", seed, overrides,
             corruption={"kind": "flip", "rate": rate})
        for rate in FLIP_RATES
        for name, overrides in METHODS
    ]  # fmt: skip


def main(argv=None) -> int:
    return experiment_main(EXPERIMENT, per_seed, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
