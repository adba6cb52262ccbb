"""Row 4 (Sub-center ArcFace, Deng et al., ECCV 2020): ArcFace with K in {1, 3, 10} sub-centers on
label-flipped data, and K = 3 -> 1: train K = 3, drop every sample more than 75 degrees from its
class's dominant sub-center (``partialfc clean``), retrain from scratch with K = 1 on what is left.

    python -m experiments.robustness.subcenters --seeds 2 --jobs 2
"""

from __future__ import annotations

import sys

from experiments.robustness.common import experiment_main, spec

EXPERIMENT = "subcenters"
FLIP_RATES = (0.4, 0.2)
THRESHOLD_DEG = 75.0


def per_seed(seed: int) -> list[dict]:
    runs = []
    for rate in FLIP_RATES:
        noise = {"kind": "flip", "rate": rate}
        prefix = f"flip {int(rate * 100)}%"
        for k in (1, 3, 10):
            runs.append(spec(EXPERIMENT, f"{prefix} K={k}", seed, {"head.num_subcenters": k},
                             corruption=noise))  # fmt: skip
        runs.append(
            spec(EXPERIMENT, f"{prefix} K=3->1, drop >75deg", seed, {"head.num_subcenters": 3},
                 corruption=noise, method="clean_retrain", threshold_deg=THRESHOLD_DEG)
        )  # fmt: skip
    return runs


def main(argv=None) -> int:
    return experiment_main(EXPERIMENT, per_seed, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
