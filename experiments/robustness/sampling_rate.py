"""Row 1 (Partial FC, An et al., CVPR 2022, table 1): clean data, full softmax (r = 1) vs Partial FC
r in {0.1 .. 0.4}.

Also r = 0.02, below the batch's own share of the classes (32 / 964 = 0.033): the active set
is then the batch's positives only, the analogue of the paper's PFC-0.0017 / 0.008 rows.

    python -m experiments.robustness.sampling_rate --seeds 3 --jobs 2
"""

from __future__ import annotations

import sys

from experiments.robustness.common import experiment_main, spec

EXPERIMENT = "sampling_rate"
RATES = (1.0, 0.4, 0.3, 0.2, 0.1, 0.02)


def row_name(rate: float) -> str:
    if rate == 1.0:
        return "FC (r=1)"
    if rate < 0.033:
        return f"PFC r={rate:g} (positives only)"
    return f"PFC r={rate:g}"


def per_seed(seed: int) -> list[dict]:
    return [spec(EXPERIMENT, row_name(r), seed, {"head.sample_rate": r}) for r in RATES]


def main(argv=None) -> int:
    return experiment_main(EXPERIMENT, per_seed, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
