"""EMA of the backbone weights (``train.ema_decay``).

* The trainer's average is the bias-corrected ``Σ (1 − d) d^(t−s) θ_s / (1 − d^t)`` of the iterates
  (checked against a float64 recomputation from the recorded weights); buffers are copies.
* A run resumed from a checkpoint has the same EMA, bit for bit, as the uninterrupted run.
* ``partialfc export`` writes the EMA weights by default (``--weights raw``: the trained ones).
* Evaluation reports the trained and the EMA weights side by side.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from partialfc.train.engine import Trainer
from tests.train.helpers import omniglot_subset, tiny_cnn, tiny_config

CNN_CONFIG = {"name": "test_cnn", "kwargs": {"embedding_dim": 32, "input_size": 28,
                                             "in_channels": 1}}  # fmt: skip
DECAY = 0.8


def _config(run_dir, *extra):
    # 200 images, batch 20: 10 steps per epoch; 4 steps
    return tiny_config(
        run_dir,
        "model.embedding_dim=32",
        "data.batch_size=20",
        "train.epochs=0.4",
        f"train.ema_decay={DECAY}",
        "optim.lr=0.2",
        *extra,
    )


class _Recording(Trainer):
    """Keeps the backbone's state after every optimizer step (float64 copies)."""

    def accumulated_step(self, batches, diagnostics=False):
        loss = super().accumulated_step(batches, diagnostics)
        self.history.append(
            {k: v.detach().double().clone() for k, v in self.backbone.state_dict().items()}
        )
        return loss


def _trainer(cfg, cls=Trainer, evaluator=None):
    trainer = cls(
        cfg,
        backbone=tiny_cnn(0),
        model_config=CNN_CONFIG,
        train_set=omniglot_subset(10),
        evaluator=evaluator,
    )
    trainer.history = []
    return trainer


def test_ema_follows_the_recurrence(tmp_path):
    trainer = _trainer(_config(tmp_path), _Recording)
    initial = {k: v.double().clone() for k, v in trainer.backbone.state_dict().items()}
    trainer.fit()
    assert len(trainer.history) == 4
    params = {name for name, _ in trainer.backbone.named_parameters()}
    # the bias-corrected average, summed directly: sum_s (1-d) d^(t-s) theta_s / (1 - d^t)
    t = len(trainer.history)
    expected = {}
    for key in initial:
        if key in params:
            total = sum(
                (1 - DECAY) * DECAY ** (t - s) * state[key]
                for s, state in enumerate(trainer.history, start=1)
            )
            expected[key] = total / (1 - DECAY**t)
        else:
            expected[key] = trainer.history[-1][key]
    assert trainer.ema.updates == t
    ema = trainer.ema.module.state_dict()
    for key, value in expected.items():
        torch.testing.assert_close(ema[key].double(), value, rtol=1e-6, atol=1e-7)

    # the average is neither the initial nor the final weights
    # (all parameters as one vector: the order of a set of names is not fixed between processes)
    def flat(state):
        return torch.cat([state[k].double().flatten() for k in sorted(params)])

    averaged, last, first = flat(ema), flat(trainer.history[-1]), flat(initial)
    moved = (last - first).norm()
    assert moved > 1e-3
    assert (averaged - last).norm() > 0.05 * moved
    assert (averaged - first).norm() > 0.05 * moved
    # buffers (batch-norm statistics) are the trained backbone's
    for key, value in trainer.backbone.state_dict().items():
        if key not in params:
            assert torch.equal(ema[key], value)


def test_resume_with_ema_is_bit_identical_and_export_picks_the_ema(tmp_path):
    from partialfc.backbone.io import (
        WEIGHTS_FILENAME,
        load_backbone_from_checkpoint,
        save_backbone,
    )
    from partialfc.deploy.export import export_checkpoint

    every = "checkpoint.every_steps=2"
    full = _trainer(_config(tmp_path / "full", every))
    full_result = full.fit()
    ckpt = tmp_path / "full" / "run" / "checkpoints" / "step-00000002"
    assert (ckpt / "ema" / WEIGHTS_FILENAME).is_file()
    resumed = _trainer(_config(tmp_path / "resumed", every, f"checkpoint.resume={ckpt}"))
    resumed_result = resumed.fit()
    assert resumed_result.losses == full_result.losses[2:]
    for key, value in full.ema.module.state_dict().items():
        assert torch.equal(resumed.ema.module.state_dict()[key], value), key

    run = tmp_path / "full" / "run"
    export_checkpoint(run, tmp_path / "auto", check=False)
    raw_model, _ = load_backbone_from_checkpoint(run, weights="raw")  # what --weights raw exports
    ema_state, raw_state = full.ema.module.state_dict(), full.backbone.state_dict()
    exported = load_file(str(tmp_path / "auto" / WEIGHTS_FILENAME))
    exported_raw = raw_model.state_dict()
    weight = "net.0.weight"
    assert not torch.equal(ema_state[weight], raw_state[weight])
    assert torch.equal(exported[weight], ema_state[weight])
    assert torch.equal(exported_raw[weight], raw_state[weight])

    plain = tmp_path / "plain"
    save_backbone(full.backbone, CNN_CONFIG, plain)
    with pytest.raises(FileNotFoundError, match="no EMA weights"):
        export_checkpoint(plain, tmp_path / "none", weights="ema", check=False)


class _MeanNorm:
    """A stand-in evaluator: one number that depends on the weights, and a report file."""

    def __call__(self, embed_fn, out_dir, title="", meta=None):
        images = omniglot_subset(2).images[:8]
        value = float(abs(embed_fn(images)).mean())
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.md").write_text(f"# {title}\n")
        return {"probe": {"auc": value, "eer": 1 - value}}


def test_evaluation_reports_trained_and_ema_weights(tmp_path):
    trainer = _trainer(_config(tmp_path), evaluator=_MeanNorm())
    trainer.fit()
    raw = trainer.evaluate(final=True)
    ema = trainer.last_ema_summary
    assert ema is not None and ema["probe"]["auc"] != raw["probe"]["auc"]
    expected_ema = _MeanNorm()(trainer.embed_fn(ema=True), tmp_path / "check")
    assert ema == expected_ema
    trainer.log.close()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
    kinds = {r["kind"]: r for r in records}
    assert kinds["eval"]["probe"]["auc"] == raw["probe"]["auc"]
    assert kinds["eval_ema"]["probe"]["auc"] == ema["probe"]["auc"]
    report = (trainer.run_dir / "report" / "report.md").read_text()
    assert f"| probe | auc | {raw['probe']['auc']:.4f} | {ema['probe']['auc']:.4f} |" in report
    assert (trainer.run_dir / "report" / "ema" / "report.md").is_file()
