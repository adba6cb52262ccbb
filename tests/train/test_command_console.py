"""What ``partialfc train`` says and sets before it trains: the start banner, the one-line error
for a missing optional package, the OpenMP wait policy it asks for, and whether it keeps freed
memory (``train.keep_freed_memory``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from partialfc.cli import main
from partialfc.train.command import start_banner
from partialfc.train.engine import Trainer
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config

PRESET = Path(__file__).resolve().parents[2] / "configs" / "omniglot_cpu.yaml"


def test_start_banner_names_folder_device_threads_data_steps_precision_head(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.5", "head.sample_rate=0.5")
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )
    rows = {line[:11].strip(): line[12:] for line in start_banner(trainer).splitlines()}
    assert rows == {
        "run folder": str(tmp_path / "run"),
        "device": "cpu, 1 rank",
        "threads": "1 compute (train.num_threads=1) + 0 data workers",
        "data": "200 images, 10 classes",
        "steps": "5 (0.5 epochs of 10 steps, global batch 20)",
        "precision": "fp32",
        "model": "test_mlp, 16-d embedding",
        "head": "partial_fc (sample rate 0.5)",
    }
    cfg = tiny_config(
        tmp_path / "b",
        "data.batch_size=20",
        "train.epochs=0.5",
        "head.compute_dtype=bfloat16",
        "train.accumulate_steps=2",
        "train.ema_decay=0.99",
    )
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )
    rows = {line[:11].strip(): line[12:] for line in start_banner(trainer).splitlines()}
    assert rows["precision"] == "fp32, head GEMMs bfloat16"
    assert rows["steps"].endswith("global batch 20, 2 micro-batches per step)")
    assert rows["ema"] == "backbone weights, decay 0.99"


def test_missing_tensorboard_is_one_line_without_traceback(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails, find_spec -> None
    args = ["train", "--config", str(PRESET), "--set", "run.tensorboard=true", "--no-eval"]
    args += ["--set", "train.epochs=0.01", "--set", f"run.output_dir={tmp_path}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        "partialfc train: run.tensorboard=true needs the tensorboard package: pip install "
        "'partialfc[tensorboard]' (or --set run.tensorboard=false)\n"
    )


def test_train_asks_for_a_passive_openmp_wait_policy_unless_one_is_set(monkeypatch, tmp_path):
    from partialfc.train.threads import passive_wait_environment

    assert passive_wait_environment({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert passive_wait_environment({"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_train_keeps_freed_memory_only_when_the_config_asks(monkeypatch, tmp_path):
    import partialfc.train.allocator as allocator

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # stop right after the setting applies
    args = ["train", "--config", str(PRESET), "--set", "run.tensorboard=true", "--no-eval"]
    args += ["--set", f"run.output_dir={tmp_path}"]
    assert main(args) == 2
    assert calls == [1]  # the preset's default: on
    assert main([*args, "--set", "train.keep_freed_memory=false"]) == 2
    assert calls == [1]
