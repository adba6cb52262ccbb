"""The LFW robustness driver runs end to end at CI size and tabulates seeds honestly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import lfw_robustness


def test_tiny_flipped_row_trains_and_evaluates(shared_data, tmp_path):
    out = tmp_path / "results.jsonl"
    code = lfw_robustness.main(
        [
            "--tiny",
            "--epochs=1",
            "--rows=flip 20% PFC* r=0.1",
            f"--data-root={shared_data / 'lfw_dev'}",
            f"--out={out}",
        ]
    )
    assert code == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["name"] == "flip 20% PFC* r=0.1 (0.4)" and rec["flip_rate"] == 0.2
    assert rec["train_images"] == 64 and rec["flipped_samples"] == round(0.2 * 64)
    assert rec["steps"] == 64 // 16  # one epoch of batches of 16
    assert "head.negative_cos_threshold=0.4" in rec["overrides"]
    # the validation people are the preset's: 1,979 images of folds 4-5, all pairs scored
    assert rec["genuine_pairs"] + rec["impostor_pairs"] == 1979 * 1978 // 2
    assert 0.0 <= rec["tar_at_far_1e-3"] <= 1.0 and 0.0 <= rec["auc"] <= 1.0
    assert np.isfinite(rec["final_loss"])


def test_table_shows_mean_and_sample_spread_over_seeds():
    base = {"flip_rate": 0.0, "eer": 0.1, "train_seconds": 10.0}
    records = [
        {**base, "name": "clean PFC r=0.1", "seed": 0, "pair_accuracy": 0.80, "auc": 0.90,
         "tar_at_far_1e-3": 0.20, "k_at_far_1e-3": 5},
        {**base, "name": "clean PFC r=0.1", "seed": 1, "pair_accuracy": 0.84, "auc": 0.92,
         "tar_at_far_1e-3": 0.30, "k_at_far_1e-3": 7},
        {**base, "name": "clean FC (r=1)", "seed": 0, "pair_accuracy": 0.85, "auc": 0.93,
         "tar_at_far_1e-3": 0.25, "k_at_far_1e-3": 6},
    ]  # fmt: skip
    lines = lfw_robustness.markdown_table(records).splitlines()
    assert lines[2].startswith("| clean FC (r=1) | 1 | 85.00 | 93.00 |")  # ROWS order
    # mean 82, sample sd of (80, 84) = 2.83; TAR 25 +- 7.07 with both k shown
    assert lines[3].startswith("| clean PFC r=0.1 | 2 | 82.00 ± 2.83 | 91.00 ± 1.41 |")
    assert "25.00 ± 7.07 (5/7)" in lines[3]


def test_unknown_row_is_refused():
    with pytest.raises(SystemExit):
        lfw_robustness.main(["--rows=no such row"])
