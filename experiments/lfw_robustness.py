"""Partial FC under label noise on a second, face data set: the LFW development people.

    python -m experiments.lfw_robustness --epochs 10 --seeds 0 \\
        --out docs/noisy_data_lfw/results.jsonl

The split and the training recipe are those of the LFW validation preset
(``configs/lfw_dev_val.yaml``, see ``experiments/lfw_face_recipe.py``): train on the grey
crops of the 498 people of folds 0-3 with at least two images, evaluate on the people of folds
4-5, who never appear in training (asserted by name). Only the schedule is shorter
(``--epochs``, 10 by default: 800 steps of 32 over 2,561 images) and the head changes per row.

Rows (the claims of Partial FC, An et al., CVPR 2022, table 4, on faces): full softmax (FC, r = 1),
Partial FC r = 0.1 and PFC* r = 0.1 (negatives with cosine > 0.4 dropped), on clean labels and with
20 % of the training labels flipped to a random other person (``partialfc.data.corruption``, seeded,
the same flips for every row of a seed). At 498 classes and a batch of 32 (about 31 people per
batch), r = 0.1 keeps 50 classes: the batch's people plus about 19 sampled negatives.

Each row reports the pair accuracy on the 1,109 validation pairs whose images are in the grey
set (threshold chosen on the other fold), ROC AUC and EER of those pairs, and TAR at
FAR = 1e-3 over all pairs of the 1,979 validation images (with ``k``, the impostor pairs above
the threshold), plus the training time. Results are appended to a JSON-lines file, one record
per run; the table printed at the end is built from that file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "lfw_dev_val.yaml"
DEFAULT_OUT = REPO / "docs" / "noisy_data_lfw" / "results.jsonl"

# (row name, engine overrides, fraction of training labels flipped)
ROWS: list[tuple[str, list[str], float]] = [
    ("clean FC (r=1)", ["head.sample_rate=1.0"], 0.0),
    ("clean PFC r=0.1", ["head.sample_rate=0.1"], 0.0),
    ("clean PFC* r=0.1 (0.4)", ["head.sample_rate=0.1", "head.negative_cos_threshold=0.4"], 0.0),
    ("flip 20% FC (r=1)", ["head.sample_rate=1.0"], 0.2),
    ("flip 20% PFC r=0.1", ["head.sample_rate=0.1"], 0.2),
    ("flip 20% PFC* r=0.1 (0.4)", ["head.sample_rate=0.1", "head.negative_cos_threshold=0.4"], 0.2),
]

# a CI-sized run: 64 training images, one epoch, small inputs, no flip test
TINY_OVERRIDES = [
    "recipe.max_train_images=64",
    "recipe.flip_test=false",
    "recipe.pair_sources=[grey]",
    "data.batch_size=16",
    "data.input_size=32",
    "model.embedding_dim=16",
]


def run_row(
    name: str,
    overrides: list[str],
    flip_rate: float,
    seed: int,
    epochs: float,
    data_root: str | None = None,
    tiny: bool = False,
    threads: int = 1,
) -> dict:
    """Train one row and evaluate it on the validation people; returns the JSON record."""
    from partialfc.data.corruption import flip_labels

    settings = [
        f"train.epochs={epochs}",
        f"train.num_threads={threads}",
        f"train.seed={seed}",
        "run.progress=false",
        "data.num_workers=0",
        *overrides,
        *(TINY_OVERRIDES if tiny else []),
    ]
    if data_root:
        settings.append(f"recipe.data_root={data_root}")
    recipe, cfg = recipe_mod.load_recipe(CONFIG, settings)
    split = recipe_mod.build_split(recipe)
    clean_labels = split.train_labels
    if flip_rate > 0:
        split.train_labels = flip_labels(clean_labels, flip_rate, seed=seed).labels
    flipped = int(np.count_nonzero(split.train_labels != clean_labels))
    with tempfile.TemporaryDirectory() as work:
        cfg.run.output_dir = work
        trainer = recipe_mod.build_trainer(recipe, cfg, split)
        t0 = time.perf_counter()
        fit = trainer.fit()
        train_seconds = time.perf_counter() - t0
        metrics = recipe_mod.evaluate_validation(
            trainer.embed_fn(), split, recipe, cfg.data.input_size, baseline=False
        )["model"]
    pairs = metrics["pairs_grey"]
    ava = metrics["all_vs_all"]["tar@far=0.001"]
    return {
        "name": name,
        "seed": seed,
        "flip_rate": flip_rate,
        "flipped_samples": flipped,
        "overrides": overrides,
        "epochs": epochs,
        "steps": fit.steps,
        "train_images": int(len(split.train_images)),
        "train_identities": int(split.num_classes),
        "train_seconds": round(train_seconds, 1),
        "final_loss": float(np.nanmean(fit.losses[-20:])) if fit.losses else None,
        "pair_accuracy": pairs["accuracy"]["mean"],
        "pairs": pairs["accuracy"]["n_pairs"],
        "auc": pairs["auc"],
        "eer": pairs.get("eer"),
        "tar_at_far_1e-3": ava["tar"],
        "k_at_far_1e-3": ava["k_false_accepts"],
        "impostor_pairs": ava["n_impostor"],
        "genuine_pairs": ava["n_genuine"],
    }


def _mean_spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def markdown_table(records: list[dict]) -> str:
    """One line per row name (in :data:`ROWS` order): mean ± sample sd over its seeds."""
    order = {name: i for i, (name, _, _) in enumerate(ROWS)}
    by_name: dict[str, list[dict]] = {}
    for rec in records:
        by_name.setdefault(rec["name"], []).append(rec)
    lines = [
        "| row | seeds | pair accuracy % | AUC % | EER % | TAR@FAR=1e-3 % (k) | train s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(by_name, key=lambda n: order.get(n, len(order))):
        recs = by_name[name]
        ks = "/".join(str(r["k_at_far_1e-3"]) for r in recs)
        eers = [100 * r["eer"] for r in recs if r.get("eer") is not None]
        lines.append(
            f"| {name} | {len(recs)} "
            f"| {_mean_spread([100 * r['pair_accuracy'] for r in recs])} "
            f"| {_mean_spread([100 * r['auc'] for r in recs])} "
            f"| {_mean_spread(eers) if eers else '–'} "
            f"| {_mean_spread([100 * r['tar_at_far_1e-3'] for r in recs])} ({ks}) "
            f"| {statistics.mean(r['train_seconds'] for r in recs):.0f} |"
        )
    return "\n".join(lines)


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=10.0, help="training epochs (default 10)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--rows", default=None, help="only the rows whose name contains this")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON-lines results")
    parser.add_argument("--data-root", default=None, help="the lfw_dev folder (default: shared)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--tiny", action="store_true", help="CI size: 64 images, small inputs")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = [r for r in ROWS if args.rows is None or args.rows in r[0]]
    if not rows:
        parser.error(f"--rows {args.rows!r} matches no row")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for name, overrides, flip_rate in rows:
            rec = run_row(
                name, overrides, flip_rate, seed, args.epochs, args.data_root, args.tiny,
                args.threads,
            )  # fmt: skip
            with args.out.open("a") as f:  # one complete line per finished run
                f.write(json.dumps(rec) + "\n")
            print(
                f"{name} seed {seed}: pair accuracy {100 * rec['pair_accuracy']:.2f}% "
                f"AUC {100 * rec['auc']:.2f}% TAR@1e-3 {100 * rec['tar_at_far_1e-3']:.2f}% "
                f"(k={rec['k_at_far_1e-3']}) in {rec['train_seconds']:.0f} s",
                flush=True,
            )
    print(markdown_table(read_records(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
