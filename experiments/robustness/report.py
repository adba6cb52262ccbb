"""Markdown tables (mean ± sample standard deviation over seeds) from result files.

python -m experiments.robustness.report docs/noisy_data/*.jsonl
"""

from __future__ import annotations

import argparse
import sys

from experiments.robustness.common import markdown_table, read_records, summarize_records
from experiments.robustness.run_all import PRIORITY


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON-lines files written by the drivers")
    args = parser.parse_args(argv)
    records = read_records(args.results)
    for module in PRIORITY:
        order = [r["name"] for r in module.per_seed(0)]
        rows = summarize_records(records, module.EXPERIMENT)
        rows.sort(key=lambda row: order.index(row["name"]) if row["name"] in order else 1e9)
        if rows:
            print(f"### {module.EXPERIMENT}\n\n{markdown_table(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
