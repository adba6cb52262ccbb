"""Gradient accumulation in the trainer (``train.accumulate_steps``).

* k micro-batches of b give the losses, backbone and centers of one batch of k·b, with all
  classes active (r = 1) and with sampled negatives (r = 0.5: the sample is drawn once per
  optimizer step from the union of the micro-batches' positives), grad clipping and warm-up on.
* 2 gloo ranks × k = 2 × b equal 1 process × 4b (DDP synchronises on the last micro-batch).
* A run resumed from a checkpoint written between accumulated steps continues bit-identically.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.classifier import gather_full_centers
from partialfc.train.engine import Trainer
from tests.distributed import run_ranks
from tests.train.helpers import (
    TINY_MODEL_CONFIG,
    flat_params,
    omniglot_subset,
    tiny_backbone,
    tiny_config,
)

NUM_CLASSES = 50  # 1,000 images; 32 samples per optimizer step -> 31 steps per epoch
STEPS = 5


def _config(run_dir, batch, k, *extra):
    return tiny_config(
        run_dir,
        f"data.batch_size={batch}",
        f"train.accumulate_steps={k}",
        f"train.epochs={STEPS / 31}",
        f"schedule.warmup_epochs={2 / 31}",
        "optim.grad_clip_norm=1.0",
        *extra,
    )


def _train(cfg):
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(NUM_CLASSES),
    )
    result = trainer.fit()
    return trainer, result


def _close(actual, expected):
    """Equal to float32 rounding (sums over the micro-batches run in another order)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
def test_micro_batches_equal_one_large_batch(tmp_path, sample_rate):
    rate = f"head.sample_rate={sample_rate}"
    big, big_result = _train(_config(tmp_path / "big", 32, 1, rate))
    acc, acc_result = _train(_config(tmp_path / "acc", 8, 4, rate))
    assert acc.steps_per_epoch == big.steps_per_epoch == 31
    assert acc_result.steps == big_result.steps == STEPS  # one schedule step per optimizer step
    _close(acc_result.losses, big_result.losses)
    start = flat_params(tiny_backbone(0))
    assert (flat_params(big.backbone) - start).abs().max() > 1e-3  # training moved the weights
    _close(flat_params(acc.backbone), flat_params(big.backbone))
    _close(gather_full_centers(acc.head), gather_full_centers(big.head))
    assert acc.optimizer.param_groups[0]["lr"] == big.optimizer.param_groups[0]["lr"]
    assert acc.head.sampling_step == big.head.sampling_step == STEPS


def test_without_the_shared_sample_micro_batches_differ(tmp_path):
    """The test above can fail: a step of 4 plain steps of 8 is not a step of 32."""
    big, _ = _train(_config(tmp_path / "big", 32, 1, "head.sample_rate=0.5"))
    small, _ = _train(_config(tmp_path / "small", 8, 1, "head.sample_rate=0.5",
                              f"train.epochs={4 * STEPS / 125}"))  # fmt: skip
    assert not torch.allclose(flat_params(small.backbone), flat_params(big.backbone), atol=1e-4)


def test_resume_between_accumulated_steps_is_bit_identical(tmp_path):
    extra = ("head.sample_rate=0.5", "checkpoint.every_steps=2")
    full, full_result = _train(_config(tmp_path / "full", 8, 2, *extra))
    ckpt = tmp_path / "full" / "run" / "checkpoints" / "step-00000002"
    resumed, resumed_result = _train(
        _config(tmp_path / "resumed", 8, 2, *extra, f"checkpoint.resume={ckpt}")
    )
    assert resumed.batches_in_epoch == 2 * resumed_result.steps  # micro-batches consumed
    assert resumed_result.losses == full_result.losses[2:]
    assert torch.equal(flat_params(resumed.backbone), flat_params(full.backbone))
    assert torch.equal(gather_full_centers(resumed.head), gather_full_centers(full.head))
    with pytest.raises(ValueError, match="train.accumulate_steps=2"):
        Trainer(
            _config(tmp_path / "other", 8, 4, *extra, f"checkpoint.resume={ckpt}"),
            backbone=tiny_backbone(0),
            model_config=TINY_MODEL_CONFIG,
            train_set=omniglot_subset(NUM_CLASSES),
        )


def test_too_many_micro_batches_for_an_epoch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="train.accumulate_steps=200"):
        Trainer(
            _config(tmp_path / "x", 8, 200),
            backbone=tiny_backbone(0),
            model_config=TINY_MODEL_CONFIG,
            train_set=omniglot_subset(NUM_CLASSES),
        )


def _two_rank_body(rank, world_size, run_dir):
    trainer, result = _train(_config(run_dir / "two", 8, 2, "head.sample_rate=1.0"))
    return result.losses, flat_params(trainer.backbone).numpy().copy()


def test_two_ranks_accumulating_equal_one_process_with_the_whole_batch(tmp_path):
    one, one_result = _train(_config(tmp_path / "one", 32, 1, "head.sample_rate=1.0"))
    results = run_ranks(_two_rank_body, world_size=2, args=(tmp_path,), timeout_s=150)
    for losses, params in results:
        _close(losses, one_result.losses)
        _close(params, flat_params(one.backbone))
    np.testing.assert_array_equal(results[0][1], results[1][1])
