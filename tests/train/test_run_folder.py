"""The run folder: a new run never writes into an earlier run's checkpoints. ``--resume``
continues it; otherwise ``run.on_exists`` stops with a message (default), picks ``name-2`` or
overwrites. A failed attempt without a checkpoint never blocks the next run, and a folder in use
by a running process is never cleared."""

from __future__ import annotations

import pytest
import yaml

from partialfc.train.engine import Trainer
from partialfc.train.run_folder import RunFolderExistsError, RunLock, prepare_run_dir
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config


def _trainer(cfg):
    return Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )


def _fake_run(folder, with_checkpoint: bool):
    (folder / "checkpoints").mkdir(parents=True)
    if with_checkpoint:
        (folder / "checkpoints" / "step-00000002").mkdir()
    (folder / "config.yaml").write_text("{}\n")
    (folder / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (folder / "notes.txt").write_text("mine")


def test_second_run_stops_with_the_ways_out_and_resume_auto_continues(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.2")
    first = _trainer(cfg)
    first.fit()
    assert first.run_dir == tmp_path / "run"
    saved = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    assert saved["data"]["batch_size"] == 20 and saved["train"]["epochs"] == 0.2
    with pytest.raises(RunFolderExistsError) as info:
        _trainer(cfg)
    message = str(info.value)
    assert f"{tmp_path / 'run'} already holds a run (newest checkpoint step-00000002)" in message
    for way_out in ("--resume", "--set run.name=", "--set run.on_exists=new", "--overwrite"):
        assert way_out in message
    longer = tiny_config(
        tmp_path, "data.batch_size=20", "train.epochs=0.4", "checkpoint.resume=auto"
    )
    resumed = _trainer(longer)
    assert resumed.run_dir == tmp_path / "run" and resumed.step == 2
    assert resumed.fit().steps == 4
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step-00000002", "step-00000004"]


def test_on_exists_new_takes_the_next_free_name_and_says_so(tmp_path):
    _fake_run(tmp_path / "run", with_checkpoint=True)
    _fake_run(tmp_path / "run-2", with_checkpoint=True)
    path, note = prepare_run_dir(tmp_path / "run", "new")
    assert path == tmp_path / "run-3"
    assert note == f"{tmp_path / 'run'} is taken: writing to {tmp_path / 'run-3'}"
    cfg = tiny_config(tmp_path, "data.batch_size=20", "run.on_exists=new")
    trainer = _trainer(cfg)
    assert trainer.run_dir == tmp_path / "run-3" and "writing to" in trainer.run_note


def test_overwrite_deletes_only_the_run_files(tmp_path):
    _fake_run(tmp_path / "run", with_checkpoint=True)
    path, note = prepare_run_dir(tmp_path / "run", "overwrite")
    assert path == tmp_path / "run" and "deleted the earlier run (up to step-00000002)" in note
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]


def test_failed_attempt_without_a_checkpoint_is_replaced(tmp_path):
    _fake_run(tmp_path / "run", with_checkpoint=False)
    path, note = prepare_run_dir(tmp_path / "run")
    assert path == tmp_path / "run"
    assert note == f"{path}: replacing the files of an earlier attempt that saved no checkpoint"
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    assert prepare_run_dir(tmp_path / "empty") == (tmp_path / "empty", "")


def test_folder_in_use_is_never_cleared(tmp_path):
    _fake_run(tmp_path / "run", with_checkpoint=False)
    lock = RunLock(tmp_path / "run").acquire()
    try:
        for on_exists in ("error", "overwrite"):
            with pytest.raises(RunFolderExistsError, match="in use by another training process"):
                prepare_run_dir(tmp_path / "run", on_exists)
        assert (tmp_path / "run" / "metrics.jsonl").is_file()
        assert prepare_run_dir(tmp_path / "run", "new")[0] == tmp_path / "run-2"
    finally:
        lock.release()
    assert prepare_run_dir(tmp_path / "run")[0] == tmp_path / "run"  # free again


def test_resume_continues_in_place_only_for_this_runs_checkpoints(tmp_path):
    from partialfc.train.run_folder import continues_in

    base = tmp_path / "run"
    assert continues_in(base, "auto")
    assert continues_in(base, str(base / "checkpoints" / "step-00000002"))
    assert not continues_in(base, str(tmp_path / "other" / "checkpoints" / "step-00000002"))
    assert not continues_in(base, None)
