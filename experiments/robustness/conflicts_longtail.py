"""Row 3 (Partial FC, An et al., CVPR 2022, tables 3 and 5): inter-class conflicts and a long tail.

* Conflicts: a third of the 964 identities are each split into 3 pseudo classes (the paper
  splits 200K of WebFace12M's 600K identities into 3: 600K -> 1M classes); here 964 -> 1,606
  classes. FC, FC*, PFC r = 0.1, PFC* r = 0.1 (threshold 0.4).
* Long tail: 45 % of the classes cut to 1-9 images (WebFace42M: 44.57 % of identities have
  fewer than 10). FC vs PFC r in {0.1, 0.2, 0.4}.

    python -m experiments.robustness.conflicts_longtail --seeds 2 --jobs 2
"""

from __future__ import annotations

import sys

from experiments.robustness.common import experiment_main, spec

EXPERIMENT = "conflicts_longtail"
CONFLICT = {"kind": "conflict", "fraction": 1 / 3, "parts": 3}
LONG_TAIL = {"kind": "long_tail", "tail_fraction": 0.45, "k": 10}
CONFLICT_METHODS = (
    ("FC (r=1)", {"head.sample_rate": 1.0}),
    ("FC* (0.4)", {"head.sample_rate": 1.0, "head.negative_cos_threshold": 0.4}),
    ("PFC r=0.1", {"head.sample_rate": 0.1}),
    ("PFC* r=0.1 (0.4)", {"head.sample_rate": 0.1, "head.negative_cos_threshold": 0.4}),
)
LONG_TAIL_RATES = (1.0, 0.1, 0.2, 0.4)


def per_seed(seed: int) -> list[dict]:
    runs = [
        spec(EXPERIMENT, f"conflict {name}", seed, overrides, corruption=CONFLICT)
        for name, overrides in CONFLICT_METHODS
    ]
    for rate in LONG_TAIL_RATES:
        name = "FC (r=1)" if rate == 1.0 else f"PFC r={rate:g}"
        runs.append(
            spec(EXPERIMENT, f"long tail {name}", seed, {"head.sample_rate": rate},
                 corruption=LONG_TAIL)
        )  # fmt: skip
    return runs


def main(argv=None) -> int:
    return experiment_main(EXPERIMENT, per_seed, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
