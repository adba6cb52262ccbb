"""LFW validation pair accuracy versus training time, from measured runs.

Reads ``benchmarks/results/lfw_accuracy_runs.json`` (a list of runs, one object each; see
:data:`FIELDS`) and writes ``docs/lfw_accuracy_vs_time.png``:

* x: training minutes as measured (each marker annotated with its machine and load: the
  same recipe ran 2–3x slower on a busy or older CPU);
* y: pair accuracy on the LFW View 2 pairs of folds 4–5 (grey crops, flip test), the mean of
  the two folds with each fold's threshold chosen on the other; the bar spans the two folds;
* runs with the same ``label`` and different seeds get one more marker at their mean with a
  ±1 sample standard deviation bar (``accuracy_curve.seed_groups``).

    python benchmarks/lfw_accuracy_curve.py [--runs FILE] [--out PNG]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_curve import (  # noqa: E402
    _check_value,
    finish_figure,
    read_json,
    run_marker,
    run_records,
    seed_groups,
    seed_mean_marker,
)

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "lfw_accuracy_runs.json"
OUT = ROOT / "docs" / "lfw_accuracy_vs_time.png"
PUBLISHED = 0.93  # about this much is published without outside data (docs/face_recipe.md)

FIELDS = {  # key: type; every key is required
    "label": str,  # the configuration, the same for all seeds of it
    "change": str,  # the overrides against configs/lfw_dev_val.yaml
    "steps": int,
    "seed": int,
    "pair_accuracy": float,  # mean of folds 4 and 5, as a fraction
    "fold_accuracies": list,  # the two folds (either order), or null where not recorded
    "pair_auc": float,
    "train_min": float,
    "load": str,
    "machine": str,
}


@dataclass(frozen=True)
class LfwRun:
    label: str
    change: str
    steps: int
    seed: int
    pair_accuracy: float
    fold_accuracies: tuple[float, float] | None
    pair_auc: float
    train_min: float
    load: str
    machine: str

    @property
    def accuracy(self) -> float:  # the name accuracy_curve.seed_groups reads
        return self.pair_accuracy


def parse_runs(records, source: str = "runs") -> list[LfwRun]:
    """Check run records against :data:`FIELDS`; errors name ``source``, the run and the key."""
    runs = []
    for where, record in run_records(records, source, FIELDS):
        missing = [key for key in FIELDS if key not in record]
        if missing:
            raise ValueError(f"{where}: missing {missing[0]!r}")
        values = {
            k: _check_value(where, k, record[k], kind, k == "fold_accuracies")
            for k, kind in FIELDS.items()
        }
        folds = values.pop("fold_accuracies")
        folds = [] if folds is None else [
            _check_value(where, "fold_accuracies", f, float, False) for f in folds
        ]  # fmt: skip
        fractions = [values["pair_accuracy"], values["pair_auc"], *folds]
        if len(folds) not in (0, 2) or not all(0 <= f <= 1 for f in fractions):
            raise ValueError(f"{where}: accuracies and AUC are fractions; two folds or null")
        if folds and abs(sum(folds) / 2 - values["pair_accuracy"]) > 1e-4:
            raise ValueError(f"{where}: 'pair_accuracy' must be the mean of the two folds")
        if values["steps"] < 1 or values["seed"] < 0 or values["train_min"] <= 0:
            raise ValueError(f"{where}: steps >= 1, seed >= 0 and train_min > 0 needed")
        runs.append(LfwRun(**values, fold_accuracies=tuple(folds) or None))
    return runs


def load_runs(path: str | Path = RUNS) -> list[LfwRun]:
    """Read and check the runs file (see :func:`parse_runs`)."""
    return parse_runs(read_json(path), str(path))


def plot(runs: list[LfwRun], out: str | Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 9), dpi=120)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.94, bottom=0.42)  # the legend goes below
    labels = list(dict.fromkeys(r.label for r in runs))
    palette = plt.get_cmap("tab20").colors
    colors = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for label in labels:
        members = [r for r in runs if r.label == label]
        for j, r in enumerate(members):
            folds = r.fold_accuracies or (r.pair_accuracy,)
            low, high = min(folds), max(folds)
            run_marker(ax, r.train_min, r.pair_accuracy, low, high, colors[label],
                       len(members) > 1, label if j == 0 else None)  # fmt: skip
            ax.annotate(
                f"{r.machine}, load {r.load}",
                (r.train_min, 100 * r.pair_accuracy),
                textcoords="offset points",
                xytext=(6, 4 if j % 2 else -10),
                fontsize=6,
                color=colors[label],
            )
    for g in seed_groups(runs):
        minutes = [r.train_min for r in runs if r.label == g.label and r.steps == g.steps]
        seed_mean_marker(ax, sum(minutes) / len(minutes), g, colors[g.label])
    ax.axhline(100 * PUBLISHED, color="grey", linestyle=(0, (4, 2)), linewidth=0.8)
    ax.text(0.5, 100 * PUBLISHED + 0.2, f" published without outside data, about {PUBLISHED:.0%}",
            fontsize=7)  # fmt: skip
    ax.axvline(30, color="grey", linewidth=0.8)
    ax.text(30.3, 100 * PUBLISHED - 3, "30-minute budget", fontsize=7, rotation=90)
    ax.set_xlim(0, 1.1 * max(r.train_min for r in runs))
    ax.set_xlabel("training minutes, as measured (2-core CPUs, one or two threads)")
    ax.set_ylabel("pair accuracy, LFW folds 4–5, unseen people (%)")
    fig.suptitle("LFW face recipe: validation accuracy vs training time; bars: the two folds "
                 "(one run), ± sd (mean of seeds)", fontsize=9)  # fmt: skip
    return finish_figure(fig, ax, out, legend_below=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=str(RUNS), help=f"runs file (default {RUNS})")
    parser.add_argument("--out", default=str(OUT), help=f"PNG to write (default {OUT})")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    print(f"{len(runs)} runs -> {plot(runs, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
