"""Shared machinery of the robustness experiments: one configured training on (corrupted)
Omniglot, its open-set evaluation, and a pool that runs many of them.

A *run spec* is a plain dict (picklable, JSON-able)::

    {"experiment": "label_flips", "name": "PFC r=0.1", "seed": 0,
     "method": "engine",                      # engine | clean_retrain
     "corruption": {"kind": "flip", "rate": 0.2},   # or None; kinds: flip, conflict, long_tail
     "overrides": {"head.sample_rate": 0.1}}         # dotted config keys on top of BASE_CONFIG

:func:`run_spec` trains on the Omniglot background set (964 classes, 19,280 images, 28x28)
seen through the corruption, then scores all pairs of the evaluation set (659 unseen classes,
13,180 images, ~8.7e7 impostor pairs) and Lake's 20-way one-shot runs; it returns the
TAR@FAR (with k, the number of impostors above the threshold), ROC AUC, EER, one-shot
accuracy and the training time.

Batch size and the sampling rate. Partial FC keeps ``ceil(r * C)`` active classes per step,
*including* every class that has a sample in the batch. With C = 964 and a batch of 128
(~120 distinct classes), r = 0.1 (97 classes) would be all positives and r in {0.1 .. 0.4}
would differ little. BASE_CONFIG therefore uses a batch of 32 (~31.5 distinct classes, 3.3 %
of C): r = 0.1 then means ~32 positives + ~65 sampled negatives, r = 0.4 means ~354 sampled
negatives, and the positives-only floor is r ~ 0.033 (the paper's PFC-0.0017 regime: batch /
classes).
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "noisy_data"

# The training setup shared by every run (the bundled-Omniglot CPU config, with a batch of 32
# so that the sampling rate matters, see the module docstring).
BASE_CONFIG: dict = {
    "model": {"name": "iresnet_small", "embedding_dim": 128},
    "data": {
        "source": "omniglot",
        "input_size": 28,
        "batch_size": 32,
        "num_workers": 1,
        "augment": {
            "hflip": False,
            "max_rotation_deg": 10.0,
            "max_shift_frac": 0.1,
            "max_scale_delta": 0.1,
        },
    },
    "head": {"sample_rate": 1.0, "margin": {"m1": 1.0, "m2_rad": 0.3, "m3": 0.0, "scale": 30.0}},
    "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
    "schedule": {"kind": "poly", "warmup_epochs": 0.5, "power": 2.0},
    "train": {
        "epochs": 5.0,
        "precision": "fp32",
        "log_every": 1_000_000,
        "diagnostics_every": 0,
        "num_threads": 1,
        "device": "auto",
    },
    "checkpoint": {"every_steps": 0, "at_epoch_end": False, "keep_last": 1},
    "run": {"progress": False},
}

# CI: 20 classes (400 images), half an epoch of batches of 16 (P x K rows keep K and take
# P = 16 / K), 300 evaluation images and no one-shot runs.
TINY = {"classes": 20, "epochs": 0.5, "batch_size": 16, "eval_images": 300, "threshold_deg": 100.0}

OPEN_SET_FARS = (1e-5, 1e-4, 1e-3, 1e-2)


# ---------------------------------------------------------------------------- specs


def spec(experiment: str, name: str, seed: int, overrides=None, corruption=None, **extra) -> dict:
    return {
        "experiment": experiment,
        "name": name,
        "seed": int(seed),
        "method": extra.pop("method", "engine"),
        "corruption": corruption,
        "overrides": dict(overrides or {}),
        **extra,
    }


def build_config(run: dict, tiny: bool, run_dir: Path, device: str):
    """The :class:`partialfc.train.config.Config` of a run spec: :data:`BASE_CONFIG` with the
    spec's overrides, through the engine's own loader (every key checked, values typed)."""
    from partialfc.train.config import apply_overrides, config_from_dict, validate

    settings = dict(run["overrides"])
    settings.update({"train.seed": run["seed"], "train.device": device})
    settings.update({"run.output_dir": str(run_dir.parent), "run.name": run_dir.name})
    if tiny:
        settings.update(
            {
                "train.epochs": TINY["epochs"],
                "data.batch_size": TINY["batch_size"],
                "data.num_workers": 0,
                "schedule.warmup_epochs": 0.1,
            }
        )
        if settings.get("data.pk_images"):
            settings["data.pk_identities"] = TINY["batch_size"] // settings["data.pk_images"]
    overrides = [f"{key}={json.dumps(value)}" for key, value in settings.items()]
    data = apply_overrides(copy.deepcopy(BASE_CONFIG), overrides)  # JSON values are YAML
    return validate(config_from_dict(data, f"{run['experiment']}/{run['name']}"))


# ---------------------------------------------------------------------------- data


class TrainingSet:
    """Images, the labels to train on, and the truth (``clean_labels``, ``noisy_mask``)."""

    def __init__(self, images, labels, clean_labels, counts=None):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.clean_labels = np.asarray(clean_labels, dtype=np.int64)
        self.noisy_mask = self.labels != self.clean_labels
        self.counts = dict(counts or {})

    def dataset(self):
        from partialfc.data.datasets import ArrayDataset

        return ArrayDataset(self.images, self.labels)

    def subset(self, keep: np.ndarray) -> TrainingSet:
        keep = np.asarray(keep, dtype=bool)
        return TrainingSet(self.images[keep], self.labels[keep], self.clean_labels[keep])


def build_training_set(corruption: dict | None, seed: int, tiny: bool) -> TrainingSet:
    """Omniglot background (all 964 classes, or the first 20 when ``tiny``), corrupted."""
    from partialfc.data.corruption import flip_labels, long_tail, split_identities
    from partialfc.data.loaders import load_omniglot

    split = load_omniglot("background", size=28)
    images, labels = split.images, split.labels
    if tiny:
        keep = labels < TINY["classes"]
        images, labels = images[keep], labels[keep]
    if not corruption:
        return TrainingSet(images, labels, labels)
    kind = corruption["kind"]
    if kind == "flip":
        c = flip_labels(labels, corruption["rate"], seed=seed)
    elif kind == "conflict":
        c = split_identities(labels, corruption["fraction"], corruption["parts"], seed=seed)
    elif kind == "long_tail":
        c = long_tail(labels, corruption["tail_fraction"], corruption["k"], seed=seed)
    else:
        raise ValueError(f"corruption kind {kind!r}: choose flip, conflict or long_tail")
    counts = {k: float(v) for k, v in c.counts.items()}
    ts = TrainingSet(images[c.indices], c.labels, c.clean_labels, counts)
    if kind == "conflict":  # a split identity is "noisy" as a whole; labels != truth says less
        ts.noisy_mask = np.asarray(c.noisy_mask, dtype=bool)
    return ts


# ---------------------------------------------------------------------------- evaluation


def evaluate(embed_fn, tiny: bool) -> dict:
    """Open-set pairs of the Omniglot evaluation set and the 20-way one-shot runs."""
    from partialfc.eval.protocols import OmniglotOneShot, OmniglotOpenSet
    from partialfc.train.evaluation import summarize

    open_set = OmniglotOpenSet(
        size=28,
        fars=OPEN_SET_FARS,
        batch_size=512,
        max_images=TINY["eval_images"] if tiny else None,
    )
    reports = open_set.run(embed_fn)
    if not tiny:
        reports += OmniglotOneShot(size=28).run(embed_fn)
    summary = summarize(reports)
    out: dict = {}
    for name, entry in summary.items():
        if "one_shot" in name:
            out["one_shot_acc"] = entry["rank1"]
        elif "auc" in entry:  # the pair (verification) report
            out.update(entry)
        elif "rank1" in entry:  # identification against a one-image-per-class gallery
            out["open_set_rank1"] = entry["rank1"]
    return out


# ---------------------------------------------------------------------------- one run


def _train(cfg, training_set: TrainingSet, run_dir: Path, method: str):
    """Build the trainer (its head is the config's ``head.kind``) and fit;
    ``(trainer, seconds, losses)``."""
    from partialfc.train.engine import Trainer

    trainer = Trainer(cfg, run_dir=run_dir, train_set=training_set.dataset())
    start = time.perf_counter()
    result = trainer.fit()
    return trainer, time.perf_counter() - start, result


def _train_and_eval(cfg, training_set, run_dir, method, tiny) -> dict:
    trainer, seconds, result = _train(cfg, training_set, run_dir, method)
    start = time.perf_counter()
    metrics = evaluate(trainer.embed_fn(batch_size=512), tiny)
    losses = [x for x in result.losses[-50:] if math.isfinite(x)]
    return {
        "trainer": trainer,
        "checkpoint": result.last_checkpoint,
        "record": {
            "train_time_s": seconds,
            "eval_time_s": time.perf_counter() - start,
            "steps": result.steps,
            "skipped_steps": result.skipped_steps,
            "final_loss": float(np.mean(losses)) if losses else float("nan"),
            "metrics": metrics,
        },
    }


def run_spec(run: dict, work_dir: str | Path, tiny: bool = False, device: str = "auto") -> dict:
    """Train and evaluate one spec; the returned record is JSON-serialisable."""
    import torch

    torch.set_num_threads(1)
    work_dir = Path(work_dir)
    tag = f"{run['experiment']}-{run['name']}-s{run['seed']}"
    safe = "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in tag)
    run_dir = work_dir / safe
    record = {k: run[k] for k in ("experiment", "name", "seed", "method", "corruption")}
    record["overrides"] = run["overrides"]
    start = time.perf_counter()
    try:
        training_set = build_training_set(run["corruption"], run["seed"], tiny)
        record["training_set"] = {
            "samples": len(training_set.labels),
            "classes": int(training_set.labels.max()) + 1,
            "noisy_samples": int(training_set.noisy_mask.sum()),
            **training_set.counts,
        }
        cfg = build_config(run, tiny, run_dir, device)
        record["device"] = str(torch.device("cuda" if _use_cuda(device) else "cpu"))
        if run["method"] == "clean_retrain":
            record.update(_clean_and_retrain(run, cfg, training_set, run_dir, tiny, device))
        else:
            out = _train_and_eval(cfg, training_set, run_dir, run["method"], tiny)
            record.update(out["record"])
        record["status"] = "ok"
    except Exception:  # noqa: BLE001 - a failed run is reported, the others go on
        record["status"] = "error"
        record["error"] = traceback.format_exc(limit=6)
    record["wall_time_s"] = time.perf_counter() - start
    return record


def _use_cuda(device: str) -> bool:
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def _clean_and_retrain(run, cfg, training_set, run_dir, tiny, device) -> dict:
    """Sub-center ArcFace cleaning (Deng et al., ArcFace, TPAMI 2022): train K sub-centers, drop
    samples > threshold from the dominant sub-center, retrain from scratch with K = 1 on what is
    left."""
    from partialfc.tools.cleaning import clean_checkpoint

    first = _train_and_eval(cfg, training_set, run_dir / "subcenter", "engine", tiny)
    # a half-epoch CI model sits near 90 degrees from everything: keep enough to retrain on
    threshold = TINY["threshold_deg"] if tiny else float(run.get("threshold_deg", 75.0))
    result, summary = clean_checkpoint(
        first["checkpoint"],
        training_set.dataset(),
        run_dir / "cleaning",
        threshold_deg=threshold,
        noisy_mask=training_set.noisy_mask,
        batch_size=512,
        device="cuda" if _use_cuda(device) else "cpu",
        write_set=False,
    )
    cleaned = training_set.subset(result.keep)
    retrain_cfg = copy.deepcopy(cfg)
    retrain_cfg.head.num_subcenters = 1
    retrain_cfg.head.num_classes = int(training_set.labels.max()) + 1
    second = _train_and_eval(retrain_cfg, cleaned, run_dir / "retrain", "engine", tiny)
    summary.pop("checkpoint", None)
    record = dict(second["record"])
    record["train_time_s"] += first["record"]["train_time_s"]
    record["subcenter_run"] = first["record"]
    record["cleaning"] = summary
    record["threshold_sweep"] = threshold_sweep(result)
    return record


def threshold_sweep(result, thresholds=(60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0)) -> dict:
    """What other thresholds would have removed (the paper tested 70-85 degrees)."""
    out = {}
    noisy = result.noisy_mask
    for t in thresholds:
        keep = result.angle_deg <= t
        removed = ~keep
        hits = int((removed & noisy).sum())
        out[f"{t:g}"] = {
            "kept": int(keep.sum()),
            "precision": hits / max(int(removed.sum()), 1),
            "recall": hits / max(int(noisy.sum()), 1),
            "noise_rate_after": float(noisy[keep].mean()) if keep.any() else 0.0,
        }
    return out


# ---------------------------------------------------------------------------- many runs


def _worker(args):
    run, work_dir, tiny, device = args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return run_spec(run, work_dir, tiny, device)


def run_specs(
    runs: list[dict],
    out_path: str | Path | None,
    jobs: int = 1,
    tiny: bool = False,
    device: str = "auto",
    deadline_s: float | None = None,
    log=print,
) -> list[dict]:
    """Run ``runs`` in order (``jobs`` processes), append each record to ``out_path`` (JSON
    lines) as it finishes; runs not started before ``deadline_s`` are skipped."""
    start = time.perf_counter()
    records: list[dict] = []
    out_path = Path(out_path) if out_path else None
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)

    def done(record):
        records.append(record)
        if out_path:
            with open(out_path, "a") as f:
                f.write(json.dumps(record, default=_jsonable) + "\n")
        m = record.get("metrics", {})
        log(
            f"[{time.perf_counter() - start:6.0f}s] {record['experiment']:<18} "
            f"{record['name']:<28} s{record['seed']} {record['status']:<5} "
            f"TAR@1e-4={m.get('tar@far=0.0001', float('nan')):.4f} "
            f"AUC={m.get('auc', float('nan')):.4f} train={record.get('train_time_s', 0):.0f}s"
            + (f"\n{record['error']}" if record["status"] == "error" else "")
        )

    with tempfile.TemporaryDirectory(prefix="partialfc-robustness-") as work:
        if jobs <= 1:
            for run in runs:
                if deadline_s is not None and time.perf_counter() - start > deadline_s:
                    log(f"deadline: skipping {run['experiment']}/{run['name']} s{run['seed']}")
                    continue
                done(run_spec(run, work, tiny, device))
            return records
        import concurrent.futures as cf
        import multiprocessing as mp

        pending = list(runs)
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            active = set()
            while pending or active:
                while pending and len(active) < jobs:
                    if deadline_s is not None and time.perf_counter() - start > deadline_s:
                        for run in pending:
                            log(f"deadline: skipping {run['experiment']}/{run['name']}")
                        pending = []
                        break
                    active.add(pool.submit(_worker, (pending.pop(0), work, tiny, device)))
                if not active:
                    break
                finished, active = cf.wait(active, return_when=cf.FIRST_COMPLETED)
                for future in finished:
                    done(future.result())
    return records


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def read_records(paths: Iterable[str | Path]) -> list[dict]:
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


# ---------------------------------------------------------------------------- tables

COLUMNS = (
    ("TAR@FAR=1e-4", "tar@far=0.0001", 100.0),
    ("TAR@FAR=1e-3", "tar@far=0.001", 100.0),
    ("AUC %", "auc", 100.0),
    ("EER %", "eer", 100.0),
    ("1-shot %", "one_shot_acc", 100.0),
)


def _fmt(values: list[float], scale: float, digits: int = 2) -> str:
    values = [v * scale for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def summarize_records(records: list[dict], experiment: str | None = None) -> list[dict]:
    """One row per (experiment, name), in first-seen order: mean and spread over seeds."""
    rows: dict = {}
    for r in records:
        if experiment is not None and r["experiment"] != experiment:
            continue
        rows.setdefault((r["experiment"], r["name"]), []).append(r)
    out = []
    for (exp, name), group in rows.items():
        ok = [r for r in group if r["status"] == "ok"]
        row = {"experiment": exp, "name": name, "seeds": len(ok), "failed": len(group) - len(ok)}
        by_device = _seeds_by_device(ok)
        row["device: seeds"] = "; ".join(
            f"{device} {','.join(str(r['seed']) for r in runs)}" for device, runs in by_device
        )
        for label, key, scale in COLUMNS:
            row[label] = _fmt([r["metrics"].get(key) for r in ok], scale)
        ks = [r["metrics"].get("k@far=0.0001") for r in ok]
        row["k@1e-4"] = str(int(statistics.fmean(ks))) if ks else "n/a"
        # training times are only comparable on one device (and one load): one entry per device
        times = [
            (device, _fmt([r["train_time_s"] for r in runs], 1.0, 0)) for device, runs in by_device
        ]
        row["train s"] = times[0][1] if len(times) == 1 else "; ".join(f"{d} {t}" for d, t in times)
        cleaning = [r["cleaning"] for r in ok if "cleaning" in r]
        if cleaning:
            q = [c.get("removal_vs_ground_truth", {}) for c in cleaning]
            row["removed"] = _fmt([c["removed"] for c in cleaning], 1.0, 0)
            row["precision"] = _fmt([x.get("precision") for x in q], 100.0, 1)
            row["recall"] = _fmt([x.get("recall") for x in q], 100.0, 1)
        out.append(row)
    return out


PAIRED_COLUMNS = COLUMNS[:3]  # TAR@FAR=1e-4, TAR@FAR=1e-3, AUC


def paired_differences(records: list[dict], experiment: str, baseline: str) -> list[dict]:
    """Every row of ``experiment`` minus ``baseline`` *seed by seed*: a seed fixes the
    initialisation, the batch order and the corruption, so the per-seed difference removes the
    part of the run-to-run noise the two rows share. One row per (name), in first-seen order:
    the seeds both rows have, each seed's difference and their mean ± sample std (points)."""
    ok = [r for r in records if r["experiment"] == experiment and r["status"] == "ok"]
    base = {r["seed"]: r for r in ok if r["name"] == baseline}
    if not base:
        raise ValueError(f"no successful run of {experiment!r} row {baseline!r} in the records")
    rows: dict[str, dict[int, dict]] = {}
    for r in ok:
        if r["name"] != baseline and r["seed"] in base:
            rows.setdefault(r["name"], {})[r["seed"]] = r
    out = []
    for name, by_seed in rows.items():
        seeds = sorted(by_seed)
        row = {"name": f"{name} − {baseline}", "seeds": ",".join(map(str, seeds))}
        for label, key, scale in PAIRED_COLUMNS:
            deltas = [by_seed[s]["metrics"][key] - base[s]["metrics"][key] for s in seeds]
            row[f"Δ {label}"] = _fmt(deltas, scale)
            row[f"Δ {label} per seed"] = " / ".join(f"{d * scale:+.2f}" for d in deltas)
        out.append(row)
    return out


def _seeds_by_device(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """Records grouped by the device they trained on, seeds ascending (devices in order of their
    lowest seed)."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        groups.setdefault(r.get("device", "n/a"), []).append(r)
    return list(groups.items())


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no results)\n"
    keys = [k for k in rows[0] if k not in ("experiment",)]
    for row in rows[1:]:
        keys += [k for k in row if k not in keys and k != "experiment"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line


def experiment_main(experiment: str, per_seed, doc: str, argv=None) -> int:
    """The command line of every driver: ``per_seed(seed) -> [spec, ...]`` for ``--seeds N``
    (seeds 0 .. N-1) or ``--seed-list 1,2`` (seed-major), run them, print the table. ``doc``
    is the driver's module docstring (its first line is the ``--help`` description)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None, help="seeds 0 .. N-1 per row (default 2)")
    seeds.add_argument(
        "--seed-list",
        type=parse_seed_list,
        default=None,
        metavar="S[,S...]",
        help="only these seeds, e.g. 1,2 (to add seeds to rows already run)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (processes)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--tiny", action="store_true", help="CI size: 20 classes, half an epoch")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no run after")
    parser.add_argument("--rows", default=None, help="only the rows whose name contains this text")
    parser.add_argument(
        "--out",
        default=None,
        help=f"JSON-lines results (default {RESULTS_DIR.relative_to(REPO)}/{experiment}.jsonl)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else RESULTS_DIR / f"{experiment}.jsonl"
    runs = seed_major(per_seed, args.seed_list or args.seeds or 2)
    if args.rows:
        runs = [r for r in runs if args.rows in r["name"]]
        if not runs:
            parser.error(f"--rows {args.rows!r} matches no row")
    records = run_specs(runs, out, args.jobs, args.tiny, args.device, args.deadline_s)
    print(markdown_table(summarize_records(records)))
    failed = [r for r in records if r["status"] != "ok"]
    return 1 if failed else 0


def seed_major(per_seed, seeds: int | Iterable[int]) -> list[dict]:
    """All rows for the first seed, then all for the next, ...: a deadline cut leaves whole
    seeds. ``seeds`` is a count N (seeds 0 .. N-1) or the seeds themselves."""
    runs: list[dict] = []
    for seed in range(seeds) if isinstance(seeds, int) else seeds:
        runs.extend(per_seed(seed))
    return runs


def parse_seed_list(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``; an argparse type (its ValueError names the bad item)."""
    import argparse

    seeds = []
    for item in text.split(","):
        try:
            seed = int(item.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"seed {item.strip()!r} is not an integer") from None
        if seed < 0:
            raise argparse.ArgumentTypeError(f"seed {seed} is negative")
        if seed in seeds:
            raise argparse.ArgumentTypeError(f"seed {seed} is listed twice")
        seeds.append(seed)
    return seeds


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run one of the experiment drivers in this folder")
