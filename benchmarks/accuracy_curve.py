"""Omniglot one-shot accuracy versus training steps, from measured runs.

Reads ``benchmarks/results/accuracy_runs.json`` (a list of runs, one object each; see
:data:`FIELDS`) and writes ``docs/omniglot_accuracy_vs_steps.png``:

* x: training steps; the top axis converts them to minutes at ``--step-seconds`` (default
  0.352 s: the 1,500-step preset took 8.8 min including its evaluation on a quiet 2-core
  AVX2 machine with two threads; one-thread 28x28 steps are slower and 56x56 steps cost
  about 4x);
* y: one-shot accuracy on Lake's 20 runs with its Wilson 95 % interval (Wilson, JASA 1927),
  one marker per run; runs with the same ``label`` and ``steps`` but different seeds get one
  more marker at their mean with a ±1 sample standard deviation bar;
* each marker is annotated with the measured wall clock and the load it ran under;
* a second panel puts the same runs against that measured wall clock (log scale), with the
  main job's 10-minute budget marked.

    python benchmarks/accuracy_curve.py [--runs FILE] [--out PNG] [--step-seconds S]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from partialfc.eval.intervals import wilson

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "accuracy_runs.json"
OUT = ROOT / "docs" / "omniglot_accuracy_vs_steps.png"
QUIET_STEP_SECONDS = 8.8 * 60 / 1500  # 0.352 s: the quiet-machine preset run, with evaluation
PUBLISHED = {"Siamese networks": 0.920, "humans": 0.955, "BPL": 0.967}  # same 20 runs

# key: (type, may be null). A run may carry a free-text "note" as well.
FIELDS = {
    "label": (str, False),  # the configuration, the same for all seeds of it
    "preset": (str, False),
    "change": (str, False),  # the --set overrides or a description
    "steps": (int, False),
    "seed": (int, False),
    "one_shot_hits": (int, False),
    "one_shot_trials": (int, False),
    "open_set_auc": (float, True),
    "tar_at_far_1e-3": (float, True),
    "wall_clock_min": (float, False),  # training + evaluation
    "load": (str, False),  # load average while it ran, e.g. "8-11"
    "machine": (str, False),
}
OPTIONAL = {"note": str}


@dataclass(frozen=True)
class Run:
    label: str
    preset: str
    change: str
    steps: int
    seed: int
    one_shot_hits: int
    one_shot_trials: int
    open_set_auc: float | None
    tar_at_far_1e3: float | None
    wall_clock_min: float
    load: str
    machine: str
    note: str = ""

    @property
    def accuracy(self) -> float:
        return self.one_shot_hits / self.one_shot_trials

    @property
    def interval(self) -> tuple[float, float]:
        """Wilson 95 % interval of the one-shot accuracy."""
        return wilson(self.one_shot_hits, self.one_shot_trials)


def _check_value(source: str, key: str, value, kind, nullable: bool):
    if value is None and nullable:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{source}: {key!r} must be {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{source}: {key!r} must be finite, got {value!r}")
    return value


def run_records(records, source: str, allowed) -> list[tuple[str, dict]]:
    """``(where, record)`` for each object of a runs list, refusing anything but a list of
    objects with keys from ``allowed`` (errors name ``source``, the run index and the key)."""
    if not isinstance(records, list):
        raise ValueError(f"{source}: expected a list of runs, got {type(records).__name__}")
    out = []
    for i, record in enumerate(records):
        where = f"{source}: run {i}"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected an object, got {record!r}")
        unknown = set(record) - set(allowed)
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        out.append((where, record))
    return out


def read_json(path: str | Path):
    """The parsed JSON of ``path``; invalid JSON is a ValueError naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def run_marker(ax, x, value, low, high, color, hollow: bool, label=None) -> None:
    """One run: a circle at ``value`` (a fraction, drawn in %) with a bar from ``low`` to
    ``high``; hollow when the run is one of several seeds."""
    ax.errorbar(
        x,
        100 * value,
        yerr=[[100 * (value - low)], [100 * (high - value)]],
        fmt="o",
        mfc="none" if hollow else color,
        color=color,
        capsize=3,
        label=label,
    )


def seed_mean_marker(ax, x, group: SeedGroup, color, labelled: bool = True) -> None:
    """A seed group's mean (a fraction, drawn in %) as a diamond with a ±1 sd bar; with
    ``labelled`` (default) it gets a legend entry."""
    ax.errorbar(
        x,
        100 * group.mean,
        yerr=100 * group.sd,
        fmt="D",
        color=color,
        capsize=5,
        elinewidth=2.5,
        label=f"{group.label}: mean ± sd of {len(group.seeds)} seeds" if labelled else None,
    )


def finish_figure(fig, ax, out: str | Path, legend_below: bool = False) -> Path:
    """Grid, legend (inside, lower right; or ``legend_below`` the axes) and layout of a curve
    figure; writes it to ``out`` and closes it."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    if legend_below:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=1)
    else:
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def parse_runs(records, source: str = "runs") -> list[Run]:
    """Check a list of run records against :data:`FIELDS` and return them as :class:`Run`.

    Errors name ``source``, the record index and the key.
    """
    runs = []
    for where, record in run_records(records, source, [*FIELDS, *OPTIONAL]):
        values = {}
        for key, (kind, nullable) in FIELDS.items():
            if key not in record:
                raise ValueError(f"{where}: missing {key!r}")
            values[key] = _check_value(where, key, record[key], kind, nullable)
        note = _check_value(where, "note", record.get("note", ""), str, False)
        if values["steps"] < 1 or values["seed"] < 0 or values["wall_clock_min"] <= 0:
            raise ValueError(f"{where}: steps >= 1, seed >= 0 and wall_clock_min > 0 needed")
        if not 0 <= values["one_shot_hits"] <= values["one_shot_trials"]:
            raise ValueError(
                f"{where}: 'one_shot_hits' must be in [0, one_shot_trials="
                f"{values['one_shot_trials']}], got {values['one_shot_hits']}"
            )
        for key in ("open_set_auc", "tar_at_far_1e-3"):
            if values[key] is not None and not 0 <= values[key] <= 1:
                raise ValueError(f"{where}: {key!r} is a fraction in [0, 1], got {values[key]}")
        values["tar_at_far_1e3"] = values.pop("tar_at_far_1e-3")
        runs.append(Run(**values, note=note))
    return runs


def load_runs(path: str | Path = RUNS) -> list[Run]:
    """Read and check the runs file (see :func:`parse_runs`)."""
    return parse_runs(read_json(path), str(path))


@dataclass(frozen=True)
class SeedGroup:
    """Runs of one configuration (``label``, ``steps``) over several seeds."""

    label: str
    steps: int
    seeds: tuple[int, ...]
    mean: float  # mean one-shot accuracy
    sd: float  # sample standard deviation (n - 1) across seeds


def seed_groups(runs: list[Run]) -> list[SeedGroup]:
    """Mean and sample standard deviation of the one-shot accuracy per (label, steps) with at
    least two runs; a repeated seed within a group is an error."""
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.label, run.steps), []).append(run)
    out = []
    for (label, steps), members in groups.items():
        seeds = tuple(r.seed for r in members)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{label!r} at {steps} steps: seed repeated in {seeds}")
        if len(members) < 2:
            continue
        values = [r.accuracy for r in members]
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        out.append(SeedGroup(label, steps, seeds, mean, sd))
    return out


def plot(runs: list[Run], out: str | Path = OUT, step_seconds: float = QUIET_STEP_SECONDS):
    """Two panels: one-shot accuracy against training steps (top axis: minutes at
    ``step_seconds``), and against the wall clock each run measured (training + evaluation,
    log scale; runs under load sit to the right of what a quiet machine gives)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_time) = plt.subplots(2, 1, figsize=(8.5, 12.5), dpi=120)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.9, bottom=0.27, hspace=0.3)
    labels = list(dict.fromkeys(r.label for r in runs))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for i, label in enumerate(labels):
        members = [r for r in runs if r.label == label]
        left = i % 2 == 1  # alternate the side of the annotations
        for j, r in enumerate(members):
            low, high = r.interval
            shift = (j - (len(members) - 1) / 2) * 12  # seeds side by side, not on top
            hollow = len(members) > 1
            run_marker(ax, r.steps + shift, r.accuracy, low, high, colors[label], hollow)
            run_marker(ax_time, r.wall_clock_min, r.accuracy, low, high, colors[label],
                       hollow, label if j == 0 else None)  # fmt: skip
            ax.annotate(
                f"{r.wall_clock_min:g} min, load {r.load}",
                (r.steps + shift, 100 * r.accuracy),
                textcoords="offset points",
                xytext=(-8 if left else 8, -12 - 11 * j),
                ha="right" if left else "left",
                fontsize=7,
                color=colors[label],
            )
    for g in seed_groups(runs):
        seed_mean_marker(ax, g.steps, g, colors[g.label], labelled=False)
        minutes = [r.wall_clock_min for r in runs if r.label == g.label and r.steps == g.steps]
        seed_mean_marker(ax_time, sum(minutes) / len(minutes), g, colors[g.label])
    ax.set_xlim(0, 1.1 * max(r.steps for r in runs))
    ax_time.set_xscale("log")
    ax_time.set_xticks([5, 10, 20, 40, 80], ["5", "10", "20", "40", "80"])
    ax_time.minorticks_off()
    for axis in (ax, ax_time):
        for i, (name, value) in enumerate(PUBLISHED.items()):
            axis.axhline(100 * value, color="grey", linestyle=(0, (4, 2 + 2 * i)), linewidth=0.8)
            axis.text(axis.get_xlim()[0], 100 * value + 0.1, f" {name} {100 * value:.1f} %",
                      fontsize=7)  # fmt: skip
        axis.set_ylabel("20-way one-shot accuracy, Lake's 20 runs (%)")
        axis.grid(alpha=0.3)
    ax.set_xlabel("training steps (batch 128)")
    ax_time.axvline(10, color="black", linewidth=0.8)
    ax_time.text(10, ax_time.get_ylim()[0], " main job's budget: 10 min", fontsize=7)
    ax_time.set_xlabel("wall clock, training + evaluation, as measured (min, log scale)")
    fig.suptitle(
        "Omniglot: one-shot accuracy vs training steps (top) and vs measured time (bottom)\n"
        "bars: Wilson 95 % (one seed), ± sd (mean of seeds)",
        fontsize=9,
    )
    top = ax.secondary_xaxis(
        "top", functions=(lambda s: s * step_seconds / 60, lambda m: m * 60 / step_seconds)
    )
    top.set_xlabel(
        f"minutes at {step_seconds:.3g} s/step (iresnet_small, 28x28, quiet machine, "
        "incl. evaluation)",
        fontsize=8,
    )
    return finish_figure(fig, ax_time, out, legend_below=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=str(RUNS), help=f"runs file (default {RUNS})")
    parser.add_argument("--out", default=str(OUT), help=f"PNG to write (default {OUT})")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=QUIET_STEP_SECONDS,
        help="seconds per training step for the minutes axis (default: %(default).3f)",
    )
    args = parser.parse_args(argv)
    if not args.step_seconds > 0:
        parser.error(f"--step-seconds must be > 0, got {args.step_seconds}")
    runs = load_runs(args.runs)
    print(f"{len(runs)} runs -> {plot(runs, args.out, args.step_seconds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
