"""Markdown tables (mean ± sample standard deviation over seeds) from result files, and
per-seed (paired) differences against a baseline row.

python -m experiments.robustness.report docs/noisy_data/*.jsonl
python -m experiments.robustness.report docs/noisy_data/*.jsonl \
    --experiment label_flips --against "flip 40% FC (r=1)" --rows "flip 40%"
"""

from __future__ import annotations

import argparse
import sys

from experiments.robustness.common import (
    markdown_table,
    paired_differences,
    read_records,
    summarize_records,
)
from experiments.robustness.run_all import PRIORITY


def _position(order: list[str], name: str) -> float:
    return order.index(name) if name in order else float("inf")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON-lines files written by the drivers")
    parser.add_argument("--experiment", default=None, help="only this experiment's tables")
    parser.add_argument(
        "--against", default=None, help="print each row minus this row, seed by seed"
    )
    parser.add_argument("--rows", default=None, help="only rows whose name contains this text")
    args = parser.parse_args(argv)
    if args.against and not args.experiment:
        parser.error("--against needs --experiment")
    records = read_records(args.results)
    if args.rows:
        records = [r for r in records if args.rows in r["name"] or r["name"] == args.against]
    for module in PRIORITY:
        if args.experiment not in (None, module.EXPERIMENT):
            continue
        order = [r["name"] for r in module.per_seed(0)]
        rows = summarize_records(records, module.EXPERIMENT)
        rows.sort(key=lambda row: _position(order, row["name"]))
        if rows:
            print(f"### {module.EXPERIMENT}\n\n{markdown_table(rows)}")
        if args.against:
            try:
                paired = paired_differences(records, module.EXPERIMENT, args.against)
            except ValueError as err:
                parser.error(str(err))
            paired.sort(key=lambda row: _position(order, row["name"].split(" − ")[0]))
            print(f"#### paired differences (points)\n\n{markdown_table(paired)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
