"""The run folder: a new run never writes into an earlier run's folder; --resume continues it."""

from __future__ import annotations

import yaml

from partialfc.train.engine import Trainer
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config


def _trainer(cfg):
    return Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )


def test_second_run_gets_a_new_folder_and_resume_auto_continues(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.2")
    first = _trainer(cfg)
    first.fit()
    assert first.run_dir == tmp_path / "run"
    saved = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    assert saved["data"]["batch_size"] == 20 and saved["train"]["epochs"] == 0.2
    assert _trainer(cfg).run_dir == tmp_path / "run-2"
    longer = tiny_config(
        tmp_path, "data.batch_size=20", "train.epochs=0.4", "checkpoint.resume=auto"
    )
    resumed = _trainer(longer)
    assert resumed.run_dir == tmp_path / "run" and resumed.step == 2
    assert resumed.fit().steps == 4
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step-00000002", "step-00000004"]
