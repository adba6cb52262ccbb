"""Extra loss terms: triplet training on P×K batches, custom terms, config rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from partialfc.losses.triplet import TripletLoss
from partialfc.train.config import ConfigError
from partialfc.train.data import ResumablePKBatchSampler
from partialfc.train.engine import Trainer
from partialfc.train.extra_losses import LossTerm
from tests.train.helpers import (
    TINY_CNN_CONFIG,
    TINY_MODEL_CONFIG,
    omniglot_subset,
    tiny_backbone,
    tiny_cnn,
    tiny_config,
)


def _records(run_dir, kind="train"):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if r["kind"] == kind]


@torch.no_grad()
def _all_triplet_loss(backbone, images, labels) -> float:
    """Mean hinge over *all* valid triplets of a fixed batch (independent of mining)."""
    backbone.eval()
    x = (torch.from_numpy(images).float().unsqueeze(1) / 255 - 0.5) / 0.5
    loss = TripletLoss(margin=0.2, mining="all", average_over_active=False)
    value = float(loss(backbone(x), torch.from_numpy(labels).long()))
    backbone.train()
    return value


def test_pure_triplet_training_reduces_the_triplet_loss_on_omniglot(tmp_path):
    cfg = tiny_config(
        tmp_path,
        "loss.classifier_weight=0",
        "loss.triplet_weight=1.0",
        "loss.triplet_mining=semihard",
        "data.pk_identities=8",
        "data.pk_images=4",
        "data.batch_size=32",
        "model.embedding_dim=32",
        "optim.lr=0.05",
        "train.epochs=2",
        "train.log_every=5",
        "train.diagnostics_every=5",
    )
    data = omniglot_subset(30)  # 600 real drawings, 18 P×K batches per epoch
    trainer = Trainer(cfg, backbone=tiny_cnn(0), model_config=TINY_CNN_CONFIG, train_set=data)
    # held-out check: the first 10 classes' drawings, all triplets, the same before and after
    keep = data.labels < 10
    images, labels = data.images[keep], data.labels[keep]
    centers_before = trainer.head.local_centers_float32()
    before = _all_triplet_loss(trainer.backbone, images, labels)
    result = trainer.fit()
    after = _all_triplet_loss(trainer.backbone, images, labels)
    assert result.steps == 36
    # measured: 0.182 -> 0.098
    assert after < 0.75 * before
    train = _records(tmp_path / "run")
    fractions = [r["terms"]["triplet"]["active_fraction"] for r in train]
    assert len(fractions) == 36 // 5 + 1 and all(0.0 <= f <= 1.0 for f in fractions)
    # fewer mined triplets violate the margin as training goes (measured 0.85 -> 0.69)
    assert np.mean(fractions[-3:]) < fractions[0] - 0.05
    assert "classifier" not in train[0]["terms"]
    # no classifier: the head is neither run nor stepped, and no head diagnostics are written
    assert torch.equal(trainer.head.local_centers_float32(), centers_before)
    assert not _records(tmp_path / "run", "diagnostics")


class _HalfSquaredNorm:
    """A custom term: 0.5 · mean ‖e‖² with the images' mean as a diagnostic."""

    name = "norm"

    def __call__(self, ctx):
        loss = 0.5 * ctx.embeddings.square().sum(1).mean()
        return LossTerm(loss, {"value": float(loss.detach()), "pixels": float(ctx.images.mean())})


def test_a_custom_term_adds_to_the_loss_and_is_logged(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=50", "train.epochs=0.2", "optim.lr=0.01")
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(50),
        extra_losses=[_HalfSquaredNorm()],
    )
    result = trainer.fit()
    train = _records(tmp_path / "run")
    assert len(train) == result.steps == 4
    for record, loss in zip(train, result.losses, strict=True):
        terms = record["terms"]
        assert loss == pytest.approx(terms["classifier"]["loss"] + terms["norm"]["value"])
        assert -1.0 <= terms["norm"]["pixels"] <= 1.0  # normalised images reach the term


def test_pk_batches_cover_p_identities_and_resume_mid_epoch():
    labels = np.repeat(np.arange(12), 5)  # 60 samples, 12 identities
    full = ResumablePKBatchSampler(labels, 3, 2, num_replicas=2, rank=1, seed=4)
    assert len(full) == 5 and full.num_samples == 30
    batches = list(full)
    for batch in batches:
        ids, counts = np.unique(labels[batch], return_counts=True)
        assert len(ids) == 3 and (counts == 2).all()
    other = list(ResumablePKBatchSampler(labels, 3, 2, num_replicas=2, rank=0, seed=4))
    # the ranks draw different batches
    assert all(a != b for a, b in zip(batches, other, strict=True))
    resumed = ResumablePKBatchSampler(labels, 3, 2, num_replicas=2, rank=1, seed=4)
    resumed.load_state_dict({"epoch": 0, "consumed_samples": 2 * 2 * 6})
    assert list(resumed) == batches[2:]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.triplet_weight=1"], "needs P×K batches"),
        (["data.pk_identities=8", "data.pk_images=4"], "must equal data.pk_identities"),
        (["data.pk_identities=8", "data.pk_images=1", "data.batch_size=8"], "at least 2"),
        (["loss.classifier_weight=0"], "nothing to train"),
        (["loss.triplet_mining=hardest"], "choose one of semihard, batch_hard, all"),
        (
            ["loss.triplet_margin=-0.1"],
            "loss.triplet_margin must be a finite number >= 0, got -0.1",
        ),
    ],
)
def test_bad_loss_and_batch_combinations_are_named_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, "data.batch_size=64", *overrides)


class _IndexRecorder:
    name = "indices"

    def __init__(self):
        self.batches = []

    def __call__(self, ctx):
        self.batches.append((ctx.indices.clone(), ctx.labels.clone(), ctx.images.clone()))
        return LossTerm(ctx.embeddings.sum() * 0.0)


def test_terms_receive_the_dataset_indices_of_the_batch(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=25", "train.epochs=1")
    data = omniglot_subset(5)  # 100 drawings: 4 steps
    recorder = _IndexRecorder()
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=data,
        extra_losses=[recorder],
    )
    trainer.fit()
    assert len(recorder.batches) == 4
    seen = torch.cat([indices for indices, _, _ in recorder.batches])
    assert sorted(seen.tolist()) == list(range(100))  # one epoch: every drawing once
    for indices, labels, images in recorder.batches:
        assert torch.equal(labels, torch.from_numpy(data.labels[indices.numpy()]))
        pixels = torch.from_numpy(data.images[indices.numpy()]).float()
        assert torch.allclose(images[:, 0], (pixels / 255 - 0.5) / 0.5)  # no augmentation here
