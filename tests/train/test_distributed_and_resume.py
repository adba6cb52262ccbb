"""Data-parallel correctness and exact resume.

* 2 gloo ranks × batch b give the same losses and weights as 1 process × batch 2b
  (Partial FC scales the embedding gradient so DDP's average is the global-batch gradient).
* A run resumed mid-epoch from a checkpoint reproduces the uninterrupted run's losses exactly
  (augmentation on, a DataLoader worker, sampled negatives r = 0.5).
* A 1-rank checkpoint resumes on 2 ranks (head resharded) and continues with the same losses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.train.engine import Trainer
from tests.distributed import run_ranks
from tests.train.helpers import (
    TINY_MODEL_CONFIG,
    flat_params,
    omniglot_subset,
    tiny_backbone,
    tiny_config,
)

NUM_CLASSES = 50  # 1,000 real images; global batch 32 -> 31 steps per epoch
STEPS = 6


def _dp_config(run_dir, per_rank_batch, *extra):
    return tiny_config(
        run_dir,
        f"data.batch_size={per_rank_batch}",
        f"train.epochs={STEPS / 31}",
        f"schedule.warmup_epochs={2 / 31}",
        "head.sample_rate=1.0",
        "optim.grad_clip_norm=1.0",
        *extra,
    )


def _train(cfg, extra_losses=()):
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(NUM_CLASSES),
        extra_losses=extra_losses,
    )
    result = trainer.fit()
    return result.losses, flat_params(trainer.backbone)


class _MeanSquaredNorm:
    """An extra term that is a per-sample mean: 0.05 · mean ‖e‖²."""

    name = "norm"

    def __call__(self, ctx):
        from partialfc.train.extra_losses import LossTerm

        loss = 0.05 * ctx.embeddings.square().sum(1).mean()
        return LossTerm(loss, {"value": float(loss.detach())})


def _two_rank_extra_term_body(rank, world_size, run_dir):
    torch.manual_seed(0)
    _, params = _train(_dp_config(run_dir / "two", 16), [_MeanSquaredNorm()])
    return params.numpy().copy()


def test_extra_terms_keep_two_ranks_equal_to_one_rank_with_double_batch(tmp_path):
    """A term's rank-local mean, averaged by DDP, is the global-batch mean."""
    _, one_params = _train(_dp_config(tmp_path / "one", 32), [_MeanSquaredNorm()])
    _, plain_params = _train(_dp_config(tmp_path / "plain", 32))
    assert not torch.allclose(one_params, plain_params, rtol=1e-3, atol=1e-5)  # the term acts
    results = run_ranks(_two_rank_extra_term_body, world_size=2, args=(tmp_path,), timeout_s=150)
    for two_params in results:
        np.testing.assert_allclose(two_params, one_params.numpy(), rtol=1e-4, atol=1e-6)


def _two_rank_body(rank, world_size, run_dir, resume_from):
    torch.manual_seed(0)
    scratch = _train(_dp_config(run_dir / "two", 16))
    resumed = _train(_dp_config(run_dir / "two_resumed", 16, f"checkpoint.resume={resume_from}"))
    # plain numpy back to the parent (tensors would travel through shared memory handles)
    return [(losses, params.numpy().copy()) for losses, params in (scratch, resumed)]


def test_two_ranks_equal_one_rank_with_double_batch_and_resume_across_ranks(tmp_path):
    one_losses, one_params = _train(_dp_config(tmp_path / "one", 32, "checkpoint.every_steps=3"))
    assert len(one_losses) == STEPS
    half = tmp_path / "one" / "run" / "checkpoints" / "step-00000003"
    results = run_ranks(_two_rank_body, world_size=2, args=(tmp_path, half), timeout_s=150)
    one_params_np = one_params.numpy()
    for (two_losses, two_params), (resumed_losses, resumed_params) in results:
        np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(two_params, one_params_np, rtol=1e-4, atol=1e-6)
        # resumed at step 3 on 2 ranks from the 1-rank checkpoint
        np.testing.assert_allclose(resumed_losses, one_losses[3:], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(resumed_params, one_params_np, rtol=1e-4, atol=1e-6)
    # the update is not trivially equal: training moved the weights
    assert not torch.allclose(one_params, flat_params(tiny_backbone(0)))


def _resume_config(run_dir, *extra):
    # 400 images, batch 20: 20 steps per epoch; 14 steps; checkpoint at 7 (mid-epoch)
    return tiny_config(
        run_dir,
        "data.batch_size=20",
        "data.num_workers=1",
        "data.augment.max_rotation_deg=10",
        "data.augment.max_shift_frac=0.1",
        "head.sample_rate=0.5",
        "train.epochs=0.7",
        "schedule.warmup_epochs=0.1",
        "checkpoint.every_steps=7",
        *extra,
    )


TRIPLET_ON_PK_BATCHES = (
    "loss.triplet_weight=0.5",
    "loss.triplet_mining=batch_hard",
    "data.pk_identities=5",
    "data.pk_images=4",
)


@pytest.mark.parametrize("extra", [(), TRIPLET_ON_PK_BATCHES], ids=["arcface", "plus_triplet_pk"])
def test_resume_mid_epoch_reproduces_the_uninterrupted_losses_exactly(tmp_path, extra):
    def train(cfg):
        trainer = Trainer(
            cfg,
            backbone=tiny_backbone(0),
            model_config=TINY_MODEL_CONFIG,
            train_set=omniglot_subset(20),
        )
        return trainer, trainer.fit()

    full_trainer, full = train(_resume_config(tmp_path / "full", *extra))
    assert full.steps == 14
    ckpt = tmp_path / "full" / "run" / "checkpoints" / "step-00000007"
    resumed_trainer, resumed = train(
        _resume_config(tmp_path / "resumed", *extra, f"checkpoint.resume={ckpt}")
    )
    assert resumed_trainer.batches_in_epoch == 14 and resumed.steps == 14
    assert resumed.losses == full.losses[7:]  # bit-identical
    assert torch.equal(flat_params(resumed_trainer.backbone), flat_params(full_trainer.backbone))
    from partialfc.classifier import gather_full_centers

    assert torch.equal(
        gather_full_centers(resumed_trainer.head), gather_full_centers(full_trainer.head)
    )


def test_resume_refuses_another_class_count(tmp_path):
    trainer = Trainer(
        _resume_config(tmp_path / "a", "train.epochs=0.1", "schedule.warmup_epochs=0.05"),
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(20),
    )
    trainer.fit()
    ckpt = tmp_path / "a" / "run" / "checkpoints"
    with pytest.raises(ValueError, match="trained with 20 classes.*init_from"):
        Trainer(
            _resume_config(tmp_path / "b", f"checkpoint.resume={ckpt}"),
            backbone=tiny_backbone(0),
            model_config=TINY_MODEL_CONFIG,
            train_set=omniglot_subset(10),
        )


def test_fine_tune_from_a_checkpoint_with_a_new_class_count(tmp_path):
    trainer = Trainer(
        _resume_config(tmp_path / "a", "train.epochs=0.1", "schedule.warmup_epochs=0.05"),
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(20),
    )
    trainer.fit()
    tuned = Trainer(
        _resume_config(tmp_path / "b", f"checkpoint.init_from={tmp_path / 'a' / 'run'}"),
        backbone=tiny_backbone(1),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )
    assert torch.equal(flat_params(tuned.backbone), flat_params(trainer.backbone))
    assert tuned.num_classes == 10 and tuned.step == 0
    assert len(tuned.fit().losses) == 7  # 200 images / 20 per batch × 0.7 epochs
