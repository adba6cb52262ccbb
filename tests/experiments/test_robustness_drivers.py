"""The robustness experiment drivers: every row is a valid config, the drivers run end to end at
CI size (engine, PFC*, clean-and-retrain, triplet), and the triplet row is the engine's own
classifier-free triplet training on P x K batches."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.robustness import (
    common,
    conflicts_longtail,
    label_flips,
    margins,
    run_all,
    sampling_rate,
    subcenters,
)

DRIVERS = (sampling_rate, label_flips, conflicts_longtail, subcenters, margins)


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda m: m.EXPERIMENT)
def test_every_row_is_a_valid_config(driver, tmp_path):
    runs = common.seed_major(driver.per_seed, 2)
    assert {r["seed"] for r in runs} == {0, 1}
    names = [r["name"] for r in runs if r["seed"] == 0]
    assert len(names) == len(set(names))
    for run in runs:
        cfg = common.build_config(run, tiny=False, run_dir=tmp_path / "x", device="cpu")
        for key, value in run["overrides"].items():
            section, *rest = key.split(".")
            node = getattr(cfg, section)
            for part in rest:
                node = getattr(node, part)
            assert node == value, key
        assert cfg.data.batch_size == 32 and cfg.train.seed == run["seed"]


def test_sampling_rate_means_something_at_this_batch_size():
    """At batch 32 of 964 classes r = 0.1 samples twice as many negatives as positives."""
    from partialfc.classifier import sampling_budget

    budget = sampling_budget(964, 0.1)
    expected_positives = 964 * (1 - (1 - 1 / 964) ** 32)  # distinct classes in a batch
    assert budget == 97
    assert 31 < expected_positives < 32
    assert sampling_budget(964, 0.02) < expected_positives  # the "positives only" row


def test_run_all_orders_whole_seeds_by_priority():
    runs = run_all.all_specs({name: 2 for name in run_all.SEEDS})
    first_seed1 = next(i for i, r in enumerate(runs) if r["seed"] == 1)
    assert all(r["seed"] == 0 for r in runs[:first_seed1])
    assert runs[0]["experiment"] == "sampling_rate"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_drivers_run_end_to_end_tiny(tmp_path):
    out = tmp_path / "r.jsonl"
    common_args = ["--tiny", "--seeds", "1", "--device", "cpu", "--out", str(out)]
    assert label_flips.main([*common_args, "--rows", "flip 40% PFC*"]) == 0
    assert subcenters.main([*common_args, "--rows", "flip 40% K=3->1"]) == 0
    assert margins.main([*common_args, "--rows", "Triplet"]) == 0
    records = _records(out)
    assert [r["status"] for r in records] == ["ok"] * 3
    flips, cleaned, triplet = records
    assert flips["training_set"]["noisy_samples"] == round(0.4 * 400)
    for r in records:
        assert 0.0 <= r["metrics"]["auc"] <= 1.0
        assert r["metrics"]["k@far=0.001"] >= 0
        assert r["train_time_s"] > 0 and math.isfinite(r["final_loss"])
    groups = cleaned["cleaning"]["groups"]
    assert sum(groups.values()) == 400
    assert groups["dominant_noisy"] + groups["non_dominant_noisy"] == 160
    # the retrain ran on the kept samples only: half an epoch of batches of 16
    kept = cleaned["cleaning"]["kept"]
    assert cleaned["steps"] == max(1, round(0.5 * (kept // 16)))
    assert cleaned["subcenter_run"]["steps"] == round(0.5 * (400 // 16))
    # the triplet row is an engine run on P x K batches of the same size
    assert triplet["method"] == "engine" and triplet["steps"] == round(0.5 * (400 // 16))
    table = common.markdown_table(common.summarize_records(records))
    assert "flip 40% K=3->1" in table and "Triplet" in table


def test_other_drivers_and_the_softmax_row_run_end_to_end_tiny(tmp_path):
    out = tmp_path / "r.jsonl"
    common_args = ["--tiny", "--seeds", "1", "--device", "cpu", "--out", str(out)]
    assert sampling_rate.main([*common_args, "--rows", "PFC r=0.1"]) == 0
    assert conflicts_longtail.main([*common_args, "--rows", "conflict PFC r=0.1"]) == 0
    assert margins.main([*common_args, "--rows", "Softmax"]) == 0
    records = _records(out)
    assert [(r["experiment"], r["status"]) for r in records] == [
        ("sampling_rate", "ok"), ("conflicts_longtail", "ok"), ("margins", "ok")
    ]  # fmt: skip
    rate, conflict, softmax = records
    assert rate["overrides"] == {"head.sample_rate": 0.1}
    assert rate["training_set"]["noisy_samples"] == 0
    assert conflict["training_set"]["classes"] > 20  # split identities add pseudo classes
    assert softmax["overrides"] == {"head.kind": "softmax"}
    for r in records:
        assert 0.0 <= r["metrics"]["auc"] <= 1.0
        assert r["steps"] == round(0.5 * (400 // 16))
        assert r["train_time_s"] > 0 and math.isfinite(r["final_loss"])


def test_softmax_row_trains_the_librarys_softmax_head(tmp_path):
    """The row's head is ``cross_entropy(W e + b, y)`` and its SGD step moves W, b."""
    from partialfc.backbone.pixels import normalize_batch
    from partialfc.losses.heads import SoftmaxHead
    from partialfc.train.engine import Trainer

    (run,) = [r for r in margins.per_seed(0) if r["name"].startswith("Softmax")]
    cfg = common.build_config(run, tiny=True, run_dir=tmp_path / "s", device="cpu")
    training_set = common.build_training_set(None, 0, tiny=True)
    trainer = Trainer(cfg, run_dir=tmp_path / "s", train_set=training_set.dataset())
    assert isinstance(trainer.head, SoftmaxHead) and trainer.head.num_classes == 20
    assert isinstance(trainer.head_optimizer, torch.optim.SGD)
    assert trainer.optimizers == [trainer.optimizer, trainer.head_optimizer]

    indices = list(trainer.sampler)[:16]
    items = [trainer.train_set[i] for i in indices]
    images = torch.stack([image for image, _, _ in items])
    y = torch.tensor([label for _, label, _ in items])
    weight = trainer.head.linear.weight.detach().clone()
    bias = trainer.head.linear.bias.detach().clone()
    with torch.no_grad():
        e = trainer.backbone(normalize_batch(images))
        expected = torch.nn.functional.cross_entropy(e @ weight.T + bias, y)
    loss = trainer.train_step(images, y, indices)
    assert loss == pytest.approx(float(expected), rel=1e-5)
    assert not torch.equal(weight, trainer.head.linear.weight)
    assert not torch.equal(bias, trainer.head.linear.bias)


def test_summary_reports_mean_and_spread():
    records = [
        {"experiment": "e", "name": "a", "status": "ok", "train_time_s": t, "seed": seed,
         "device": "cpu", "metrics": {"tar@far=0.0001": v, "auc": 0.9, "k@far=0.0001": 8}}
        for seed, t, v in ((2, 10.0, 0.20), (1, 12.0, 0.30))
    ] + [{"experiment": "e", "name": "a", "status": "error", "seed": 3}]  # fmt: skip
    (row,) = common.summarize_records(records)
    assert row["seeds"] == 2 and row["failed"] == 1
    assert row["TAR@FAR=1e-4"] == f"25.00 ± {np.std([20.0, 30.0], ddof=1):.2f}"
    assert row["device: seeds"] == "cpu 1,2"
    assert row["train s"] == "11 ± 1"


def test_summary_pools_seeds_across_devices_but_not_training_times():
    """Metrics are pooled over every seed; times only within a device (a GPU shared by ten
    runs and a CPU core do not measure the same thing)."""
    records = [
        {"experiment": "e", "name": "a", "status": "ok", "train_time_s": t, "seed": seed,
         "device": device, "metrics": {"tar@far=0.0001": v, "k@far=0.0001": 8}}
        for seed, device, t, v in ((0, "cuda", 100.0, 0.10), (1, "cpu", 500.0, 0.20),
                                   (2, "cpu", 520.0, 0.30))
    ]  # fmt: skip
    (row,) = common.summarize_records(records)
    assert row["seeds"] == 3 and row["device: seeds"] == "cuda 0; cpu 1,2"
    assert row["TAR@FAR=1e-4"] == "20.00 ± 10.00"
    assert row["train s"] == f"cuda 100; cpu 510 ± {np.std([500.0, 520.0], ddof=1):.0f}"


def test_triplet_row_is_the_engines_semihard_triplet_on_pk_batches(tmp_path):
    """No classifier: the step's loss is the library's semi-hard triplet loss of the batch's
    embeddings, the Partial FC centers do not move, and batches hold P classes x K images."""
    from partialfc.backbone.pixels import normalize_batch
    from partialfc.losses.triplet import TripletLoss
    from partialfc.train.engine import Trainer

    (run,) = [r for r in margins.per_seed(0) if r["name"] == "Triplet, semi-hard"]
    assert run["method"] == "engine"
    cfg = common.build_config(run, tiny=True, run_dir=tmp_path / "t", device="cpu")
    assert (cfg.data.pk_identities, cfg.data.pk_images, cfg.data.batch_size) == (4, 4, 16)
    training_set = common.build_training_set(run["corruption"], run["seed"], tiny=True)
    trainer = Trainer(cfg, run_dir=tmp_path / "t", train_set=training_set.dataset())
    assert not trainer.uses_head and [t.name for t in trainer.extra_losses] == ["triplet"]

    labels = training_set.labels
    batches = list(trainer.sampler)
    assert len(batches) == len(trainer.sampler) == 400 // 16
    for batch in batches:
        classes, counts = np.unique(labels[batch], return_counts=True)
        assert len(classes) == 4 and set(counts) == {4}
    trainer.sampler.load_state_dict({"epoch": 0, "consumed_samples": 32})
    assert list(trainer.sampler) == batches[2:]

    items = [trainer.train_set[i] for i in batches[0]]
    images = torch.stack([image for image, _, _ in items])
    y = torch.tensor([label for _, label, _ in items])
    with torch.no_grad():
        expected = TripletLoss(margin=0.2, mining="semihard")(
            trainer.backbone(normalize_batch(images)), y
        )
    # (the Partial FC table is not in the head's state_dict: read the centers themselves)
    centers = trainer.head.local_centers_float32()
    loss = trainer.train_step(images, y, batches[0])
    assert loss == pytest.approx(float(expected), rel=1e-5) and loss > 0
    assert set(trainer.last_terms) == {"triplet"}
    assert torch.equal(trainer.head.local_centers_float32(), centers)


def test_seed_list_runs_only_the_chosen_seeds(monkeypatch, capsys):
    """``--seed-list 2,1`` adds seeds to rows already run: exactly those seeds, in that order,
    seed-major, and still filtered by ``--rows``; a bad list is an argparse error."""
    seen = []

    def fake_run_specs(runs, out, jobs, tiny, device, deadline_s):
        seen.extend((r["seed"], r["name"]) for r in runs)
        return []

    monkeypatch.setattr(common, "run_specs", fake_run_specs)
    assert label_flips.main(["--seed-list", "2,1", "--rows", "flip 40%"]) == 0
    names = [name for name, _ in label_flips.METHODS]
    assert seen == [(s, f"flip 40% {n}") for s in (2, 1) for n in names]

    seen.clear()
    assert sampling_rate.main(["--seeds", "2", "--rows", "FC (r=1)"]) == 0
    assert seen == [(0, "FC (r=1)"), (1, "FC (r=1)")]

    assert common.parse_seed_list(" 3, 0") == [3, 0]
    for bad, message in (("1,x", "'x' is not an integer"), ("1,1", "listed twice"),
                         ("-1", "negative")):  # fmt: skip
        with pytest.raises(SystemExit):
            sampling_rate.main(["--seed-list", bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):  # either a count or a list, not both
        sampling_rate.main(["--seeds", "2", "--seed-list", "1"])


def test_paired_differences_subtract_the_baseline_seed_by_seed():
    """Seed 0 of A minus seed 0 of the baseline, seed 1 minus seed 1; a seed the baseline
    lacks is left out; a missing baseline is a ValueError naming it."""

    def rec(name, seed, tar):
        metrics = {"tar@far=0.0001": tar, "tar@far=0.001": 2 * tar, "auc": 0.9}
        return {"experiment": "e", "name": name, "seed": seed, "status": "ok", "metrics": metrics}

    records = [rec("FC", 0, 0.20), rec("FC", 1, 0.10), rec("A", 1, 0.13), rec("A", 0, 0.21),
               rec("A", 2, 0.50), rec("B", 0, 0.10)]  # fmt: skip
    a, b = common.paired_differences(records, "e", "FC")
    assert a["name"] == "A − FC" and a["seeds"] == "0,1"
    assert a["Δ TAR@FAR=1e-4 per seed"] == "+1.00 / +3.00"
    assert a["Δ TAR@FAR=1e-4"] == f"2.00 ± {np.std([1.0, 3.0], ddof=1):.2f}"
    assert a["Δ TAR@FAR=1e-3 per seed"] == "+2.00 / +6.00"
    assert a["Δ AUC %"] == "0.00 ± 0.00"
    assert b["seeds"] == "0" and b["Δ TAR@FAR=1e-4"] == "-10.00"
    with pytest.raises(ValueError, match="'C'"):
        common.paired_differences(records, "e", "C")
