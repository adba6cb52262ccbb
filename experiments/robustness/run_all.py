"""All five rows in one process pool, in priority order (rows 1, 2, 4 first), seed by seed so
that a deadline leaves whole seeds; results go to one JSON-lines file per experiment.

    python -m experiments.robustness.run_all --jobs 12 --device cuda --deadline-s 480 \
        --out-dir docs/noisy_data
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.robustness import (
    conflicts_longtail,
    label_flips,
    margins,
    sampling_rate,
    subcenters,
)
from experiments.robustness.common import RESULTS_DIR, markdown_table, run_specs, summarize_records

PRIORITY = (sampling_rate, label_flips, subcenters, conflicts_longtail, margins)
# seeds per row: more where the differences are expected to be small
SEEDS = {"sampling_rate": 3, "label_flips": 3, "subcenters": 2, "conflicts_longtail": 2,
         "margins": 2}  # fmt: skip


def all_specs(seeds: dict[str, int]) -> list[dict]:
    runs = []
    for seed in range(max(seeds.values())):
        for module in PRIORITY:
            if seed < seeds[module.EXPERIMENT]:
                runs.extend(module.per_seed(seed))
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=None)
    parser.add_argument("--max-seeds", type=int, default=None, help="cap seeds of every row")
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    seeds = {k: min(v, args.max_seeds or v) for k, v in SEEDS.items()}
    runs = all_specs(seeds)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "all_runs.jsonl"
    print(f"{len(runs)} runs, {args.jobs} at a time, results in {out}", flush=True)
    records = run_specs(runs, out, args.jobs, args.tiny, args.device, args.deadline_s,
                        log=lambda s: print(s, flush=True))  # fmt: skip
    for module in PRIORITY:
        print(f"\n## {module.EXPERIMENT}\n")
        print(markdown_table(summarize_records(records, module.EXPERIMENT)))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
