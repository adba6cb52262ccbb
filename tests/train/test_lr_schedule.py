"""LR schedule values, recomputed by hand."""

from __future__ import annotations

import json

import pytest
import torch

from partialfc.train.lr_schedule import WarmupLR


def test_warmup_then_poly_power_2():
    s = WarmupLR("poly", total_steps=110, warmup_steps=10, power=2.0)
    assert s.factor(0) == pytest.approx(1 / 10)  # the first step already trains
    assert s.factor(9) == pytest.approx(1.0)
    assert s.factor(10) == pytest.approx(1.0)
    assert s.factor(60) == pytest.approx((1 - 50 / 100) ** 2)  # 0.25
    assert s.factor(109) == pytest.approx((1 - 99 / 100) ** 2)


def test_step_schedule_divides_by_ten_at_milestones():
    s = WarmupLR("step", total_steps=180, warmup_steps=0, milestone_steps=[80, 140])
    assert [s.factor(t) for t in (0, 79, 80, 139, 140, 179)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01]
    )


def test_apply_sets_every_group_from_its_base_lr():
    a = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    b = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    WarmupLR.remember_base_lr([a, b])
    WarmupLR("poly", total_steps=10, warmup_steps=4).apply([a, b], 0)
    assert a.param_groups[0]["lr"] == pytest.approx(0.025)
    assert b.param_groups[0]["lr"] == pytest.approx(0.125)


def test_first_training_step_uses_the_warmup_lr(tmp_path):
    from partialfc.train.engine import Trainer
    from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config

    # 200 images, batch 20: 10 steps per epoch; warm-up over 5 steps; run 2 steps
    cfg = tiny_config(
        tmp_path,
        "data.batch_size=20",
        "train.epochs=0.2",
        "schedule.warmup_epochs=0.1",
        "optim.lr=0.1",
    )
    trainer = Trainer(
        cfg, backbone=tiny_backbone(), model_config=TINY_MODEL_CONFIG, train_set=omniglot_subset(10)
    )
    assert trainer.lr_schedule.warmup_steps == 1 and trainer.total_steps == 2
    cfg2 = tiny_config(
        tmp_path / "b",
        "data.batch_size=20",
        "train.epochs=0.5",
        "schedule.warmup_epochs=0.4",
        "optim.lr=0.1",
    )
    trainer = Trainer(
        cfg2,
        backbone=tiny_backbone(),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )
    assert trainer.lr_schedule.warmup_steps == 4
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "b" / "run" / "metrics.jsonl").open()]
    lrs = [r["lr"] for r in records if r["kind"] == "train"]
    assert lrs[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])  # head and backbone alike
    assert trainer.head_optimizer.param_groups[0]["lr"] == pytest.approx(lrs[-1])
