"""Warm-up given in epochs or as a fraction of training: the preset keeps its 75 warm-up steps,
a short trial run of the preset loads, and a warm-up that cannot fit names the keys to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from partialfc.cli import main
from partialfc.train.config import ConfigError, load_config
from partialfc.train.engine import steps_per_epoch
from partialfc.train.lr_schedule import warmup_steps

PRESET = Path(__file__).resolve().parents[2] / "configs" / "omniglot_cpu.yaml"
OMNIGLOT_BACKGROUND_IMAGES = 19_280


def _preset_warmup(*overrides: str) -> tuple[int, int]:
    cfg = load_config(PRESET, list(overrides))
    images = OMNIGLOT_BACKGROUND_IMAGES * cfg.data.rotation_classes
    per_epoch = steps_per_epoch(images, cfg.data.batch_size)
    total = max(1, round(cfg.train.epochs * per_epoch))
    sch = cfg.schedule
    return warmup_steps(sch.warmup_epochs, sch.warmup_fraction, per_epoch, total), total


def test_preset_warms_up_over_a_twentieth_of_its_steps():
    # 4 x 19,280 images, 602 full batches of 128 an epoch, 7.7 epochs: 4,635 steps
    assert _preset_warmup() == (round(0.05 * 4635), 4635) == (232, 4635)
    # the rule before warm-up fractions: round(0.5 epochs * 150 steps per epoch) = 75 of 1,500
    assert _preset_warmup("data.rotation_classes=1", "train.epochs=10") == (75, 1500)


def test_short_trial_of_the_preset_scales_the_warmup(capsys):
    assert _preset_warmup("train.epochs=0.05") == (2, 30)  # round(0.05 * 30)
    args = ["train", "--config", str(PRESET), "--set", "train.epochs=0.05", "--print-config"]
    assert main(args) == 0
    assert "warmup_fraction: 0.05" in capsys.readouterr().out


def test_epochs_rule_and_cap():
    assert warmup_steps(0.5, 0.0, 150, 1500) == 75
    assert warmup_steps(0.0, 0.1, 150, 300) == 30
    assert warmup_steps(0.0, 0.9, 10, 1) == 0  # one step: nothing left to warm up
    assert warmup_steps(0.19, 0.0, 10, 2) == 1  # rounding up to T is capped at T - 1


def test_warmup_longer_than_training_names_the_keys():
    with pytest.raises(ConfigError) as info:
        load_config(
            PRESET, ["schedule.warmup_fraction=0", "schedule.warmup_epochs=0.5", "train.epochs=0.2"]
        )
    message = str(info.value)
    assert "schedule.warmup_epochs=0.5 must be below train.epochs=0.2" in message
    assert "schedule.warmup_fraction=0.05" in message


def test_warmup_given_twice_is_an_error():
    with pytest.raises(ConfigError, match="give the warm-up one way"):
        load_config(PRESET, ["schedule.warmup_epochs=0.5"])
