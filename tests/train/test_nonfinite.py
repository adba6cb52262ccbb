"""A non-finite loss skips the step (nothing moves, batch ids logged); N in a row stop training."""

from __future__ import annotations

import json
import math

import pytest
import torch

from partialfc.train.engine import NonFiniteLossError, Trainer
from tests.train.helpers import (
    TINY_MODEL_CONFIG,
    NaNOnCalls,
    flat_params,
    omniglot_subset,
    tiny_backbone,
    tiny_config,
)


class _AllCalls:
    def __contains__(self, call):
        return True


def _trainer(tmp_path, backbone, *extra):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.4", *extra)
    return Trainer(
        cfg, backbone=backbone, model_config=TINY_MODEL_CONFIG, train_set=omniglot_subset(10)
    )


def test_one_nonfinite_loss_is_skipped_and_logged(tmp_path):
    trainer = _trainer(tmp_path, NaNOnCalls(tiny_backbone(0), bad_calls={1}))
    before = flat_params(trainer.backbone)
    centers_before = trainer.head.local_centers_float32()
    # step 0 is poisoned: nothing may move; then training goes on
    images, labels, indices = next(iter(trainer._loader()))
    assert trainer.train_step(images, labels, indices) is None
    assert torch.equal(flat_params(trainer.backbone), before)
    assert torch.equal(trainer.head.local_centers_float32(), centers_before)
    assert trainer.train_step(images, labels, indices) is not None
    assert not torch.equal(flat_params(trainer.backbone), before)

    trainer = _trainer(tmp_path / "fit", NaNOnCalls(tiny_backbone(0), bad_calls={2}))
    result = trainer.fit()
    assert result.steps == 4 and result.skipped_steps == 1
    assert math.isnan(result.losses[1]) and all(math.isfinite(v) for v in result.losses[2:])
    records = [json.loads(x) for x in (tmp_path / "fit" / "run" / "metrics.jsonl").open()]
    bad = [r for r in records if r["kind"] == "nonfinite"]
    assert len(bad) == 1 and bad[0]["step"] == 1
    # the logged ids are the batch's sample indices: the sampler's second batch of epoch 0
    order = trainer.sampler.epoch_order().tolist()
    assert bad[0]["sample_indices"] == order[20:40]


def test_consecutive_nonfinite_losses_stop_with_a_clear_message(tmp_path):
    trainer = _trainer(
        tmp_path, NaNOnCalls(tiny_backbone(0), _AllCalls()), "train.max_nonfinite_steps=3"
    )
    with pytest.raises(NonFiniteLossError, match=r"3 non-finite losses in a row.*metrics\.jsonl"):
        trainer.fit()
