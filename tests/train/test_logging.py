"""Where the numbers go: every record's numbers (evaluation summaries included, flattened to
``eval/<set>/<metric>``) reach TensorBoard and MLflow, and MLflow gets the config once."""

from __future__ import annotations

import json
import sys
import types

import pytest

from partialfc.train.engine import Trainer
from partialfc.train.metrics_log import flat_config, scalars
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config


def test_scalars_flatten_nested_summaries_and_skip_non_numbers():
    values = {
        "omniglot_open_set": {"auc": 0.9, "tar@far=0.001": 0.5, "k@far=0.001": 13},
        "flag": True,
        "name": "x",
        "ids": [1, 2],
        "loss": 1.5,
    }
    assert scalars("eval", values) == {
        "eval/omniglot_open_set/auc": 0.9,
        "eval/omniglot_open_set/tar@far=0.001": 0.5,
        "eval/omniglot_open_set/k@far=0.001": 13.0,
        "eval/loss": 1.5,
    }
    assert flat_config({"train": {"epochs": 3.0, "seed": 0}, "eval": {"protocols": ["a"]}}) == {
        "train.epochs": "3.0",
        "train.seed": "0",
        "eval.protocols": '["a"]',
    }


class _Probe:
    """A stand-in evaluator: one number that depends on the weights."""

    def __call__(self, embed_fn, out_dir, title="", meta=None):
        value = float(abs(embed_fn(omniglot_subset(2).images[:8])).mean())
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.md").write_text(f"# {title}\n")
        return {"probe": {"auc": value, "tar@far=0.01": value / 2}}


def _run(tmp_path, *extra):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.3", *extra)
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
        evaluator=_Probe(),
    )
    trainer.fit()
    summary = trainer.evaluate(final=True)
    trainer.log.close()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
    return trainer, summary, records


class _FakeWriter:
    """Records what a SummaryWriter is given (the tensorboard package is an optional extra)."""

    instances: list = []

    def __init__(self, log_dir):
        self.log_dir, self.scalars, self.texts, self.closed = log_dir, [], [], False
        _FakeWriter.instances.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def add_text(self, tag, text):
        self.texts.append((tag, text))

    def close(self):
        self.closed = True


def test_evaluation_scalars_reach_tensorboard(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.instances.clear()
    trainer, summary, records = _run(tmp_path, "run.tensorboard=true", "train.ema_decay=0.5")
    (writer,) = _FakeWriter.instances
    logged = {(tag, step): value for tag, value, step in writer.scalars}
    step = trainer.step
    assert logged[("eval/probe/auc", step)] == summary["probe"]["auc"]
    assert logged[("eval/probe/tar@far=0.01", step)] == summary["probe"]["tar@far=0.01"]
    ema = trainer.last_ema_summary["probe"]["auc"]
    assert logged[("eval_ema/probe/auc", step)] == ema
    for record in (r for r in records if r["kind"] == "train"):
        assert logged[("train/loss", record["step"])] == record["loss"]
    assert [tag for tag, _ in writer.texts] == ["config"] and writer.closed


def test_mlflow_local_store_receives_the_config_once_and_the_same_scalars(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow is optional: pip install 'partialfc[mlflow]'")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    trainer, summary, records = _run(
        tmp_path, "run.mlflow=true", f"run.mlflow_tracking_uri={uri}", "run.name=first"
    )
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("partialfc")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "first" and run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "0.3"
    assert run.data.params["data.batch_size"] == "20"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    train = [r for r in records if r["kind"] == "train"]
    assert [(m.step, m.value) for m in history] == [(r["step"], r["loss"]) for r in train]
    (auc,) = client.get_metric_history(run.info.run_id, "eval/probe/auc")
    assert (auc.step, auc.value) == (trainer.step, summary["probe"]["auc"])
    (tar,) = client.get_metric_history(run.info.run_id, "eval/probe/tar_far_0.01")
    assert tar.value == summary["probe"]["tar@far=0.01"]
