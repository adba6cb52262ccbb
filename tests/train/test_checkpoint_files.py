"""Checkpoint folders after interruptions: pruning never leaves a half-deleted checkpoint under
its real name, leftovers are cleared at start, and metrics.jsonl has each step once after a
resume."""

from __future__ import annotations

import json
import shutil

import pytest

from partialfc.train import checkpoint as ckpt
from partialfc.train.engine import Trainer
from partialfc.train.metrics_log import drop_records_after
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config

FILES = ("meta.json", "trainer.pt", "backbone.safetensors")


def fake_checkpoints(folder, steps):
    for step in steps:
        path = folder / ckpt.checkpoint_name(step)
        path.mkdir(parents=True)
        for name in FILES:
            (path / name).write_text(f"{name} of step {step}")


def test_pruning_killed_mid_delete_leaves_no_half_checkpoint_under_a_real_name(
    tmp_path, monkeypatch
):
    fake_checkpoints(tmp_path, [1, 2, 3, 4])
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, ignore_errors=False):
        (path / FILES[0]).unlink()  # one file gone, then the process is killed
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        ckpt.prune_checkpoints(tmp_path, keep_last=2)
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    listed = ckpt.list_checkpoints(tmp_path)
    assert [p.name for p in listed] == ["step-00000002", "step-00000003", "step-00000004"]
    for path in listed:  # every checkpoint under a real name is complete
        assert sorted(p.name for p in path.iterdir()) == sorted(FILES)
    trash = [p for p in tmp_path.iterdir() if p.name.startswith(".trash-step-00000001.")]
    assert len(trash) == 1 and sorted(p.name for p in trash[0].iterdir()) == sorted(FILES[1:])
    assert ckpt.remove_leftovers(tmp_path) == [trash[0].name]
    ckpt.prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def _trainer(cfg):
    return Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )


def _records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["kind"], r["step"]) for r in map(json.loads, lines)]


def test_leftovers_are_removed_at_start_and_never_loaded(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.2")
    run_dir = _trainer(cfg).fit().run_dir
    checkpoints = run_dir / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(checkpoints)] == ["step-00000002"]
    # a complete-looking checkpoint caught mid-deletion, and an unfinished save
    shutil.copytree(checkpoints / "step-00000002", checkpoints / ".trash-step-00000009.ab12cd34")
    meta = checkpoints / ".trash-step-00000009.ab12cd34" / "meta.json"
    meta.write_text(meta.read_text().replace('"step": 2', '"step": 9'))
    (checkpoints / ".step-00000010.tmp").mkdir()
    assert ckpt.resolve_checkpoint("auto", run_dir) == checkpoints / "step-00000002"
    assert [p.name for p in ckpt.list_checkpoints(checkpoints)] == ["step-00000002"]
    longer = tiny_config(
        tmp_path, "data.batch_size=20", "train.epochs=0.4", "checkpoint.resume=auto"
    )
    resumed = _trainer(longer)
    assert resumed.step == 2
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002"]
    assert resumed.fit().steps == 4


def test_metrics_have_each_step_once_after_a_resume(tmp_path):
    """A run killed after step 4 whose newest checkpoint is step 2, with half a record at the
    end of metrics.jsonl: resuming trains steps 3-4 again and records them once."""
    cfg = tiny_config(
        tmp_path, "data.batch_size=20", "train.epochs=0.4", "checkpoint.every_steps=2"
    )
    run_dir = _trainer(cfg).fit().run_dir
    before = _records(run_dir)
    assert before == [("train", 1), ("train", 2), ("train", 3), ("train", 4), ("done", 4)]
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 5, "lo')
    resumed = _trainer(tiny_config(tmp_path, *cfg_overrides(cfg), "checkpoint.resume=auto"))
    assert resumed.step == 2 and resumed.run_dir == run_dir
    resumed.fit()
    assert _records(run_dir) == before


def test_a_checkpoint_of_the_test_backbone_reloads_by_name(tmp_path):
    """TINY_MODEL_CONFIG names a registered model; importing the helpers again is no error."""
    import importlib

    import torch

    import tests.train.helpers as helpers
    from partialfc.backbone.io import load_backbone_from_checkpoint

    trainer = _trainer(tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.1"))
    run_dir = trainer.fit().run_dir
    importlib.reload(helpers)
    loaded, model_config = load_backbone_from_checkpoint(run_dir)
    assert model_config == TINY_MODEL_CONFIG
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(images), trainer.backbone.eval()(images))


def cfg_overrides(cfg):
    return (
        f"data.batch_size={cfg.data.batch_size}",
        f"train.epochs={cfg.train.epochs}",
        f"checkpoint.every_steps={cfg.checkpoint.every_steps}",
    )


def test_drop_records_after_keeps_earlier_steps_and_foreign_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"kind": "train", "step": 1},
        {"kind": "eval", "step": 2},
        {"kind": "train", "step": 3},
        {"kind": "done", "step": 2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "not json\n")
    assert drop_records_after(path, 2) == 2
    assert path.read_text().splitlines() == [json.dumps(r) for r in lines[:2]] + ["not json"]
    assert drop_records_after(path, 2) == 0 and drop_records_after(tmp_path / "none", 0) == 0
