"""What a cluster user reads from ``partialfc train``: plain periodic lines without a progress
bar, each ``.bin`` check's 10-fold accuracy (mean ± std, with flip) on its own line, the same
number an independent computation gives, and every console line copied to training.log (a
resumed run appends)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from partialfc.cli import main
from partialfc.data.verification_bin import decode_images, load_verification_bin
from partialfc.models import build_model
from tests.tools.arcface_folder import write_arcface_folder

STEP_LINE = re.compile(
    r"^step (\d+)/(\d+) \(epoch (\d+\.\d\d)\): loss \d+\.\d{4}, lr \d\.\d{3}e[-+]\d\d, "
    r"[\d,]+ samples/s, ETA \d+:\d\d:\d\d$"
)
BIN_LINE = re.compile(
    r"^(lfw|cfp_fp): 10-fold accuracy (\d+\.\d\d) ± (\d+\.\d\d)% \(40 pairs, flip\), "
    r"AUC \d\.\d{4}, EER \d+\.\d\d%"
)
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def write_config(tmp_path: Path, folder: Path) -> Path:
    config = {
        "model": {"name": "iresnet_tiny", "embedding_dim": 32},
        "data": {"source": "recordio", "path": str(folder / "train.rec"), "batch_size": 8},
        "train": {"epochs": 0.5, "precision": "fp32", "log_every": 1, "num_threads": 1},
        "eval": {"protocols": [f"bin:{folder / 'lfw.bin'}", f"bin:{folder / 'cfp_fp.bin'}"]},
        "checkpoint": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "job"},
    }
    config["data"]["num_workers"] = 0
    config["train"]["diagnostics_every"] = 0
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def flip_embeddings(checkpoint: Path, images: np.ndarray) -> np.ndarray:
    """``normalize(e(x) + e(mirror x))`` with the checkpoint's backbone, straight from torch."""
    model = build_model("iresnet_tiny", embedding_dim=32)
    model.load_state_dict(load_file(str(checkpoint / "backbone.safetensors")))
    model.eval()
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - 0.5) / 0.5
    with torch.no_grad():
        e = model(x) + model(torch.flip(x, dims=[3]))
    e = e.numpy().astype(np.float64)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def tenfold_accuracy(scores: np.ndarray, same: np.ndarray) -> tuple[list, list, list]:
    """Per contiguous fold, by brute force over every cut point of the other nine folds: the
    test accuracy at the middle one of their best thresholds (the rule of the published
    protocol's exact form), and the lowest and highest over all their best thresholds."""
    folds = np.array_split(np.arange(len(scores)), 10)
    middle, lows, highs = [], [], []
    for test in folds:
        train = np.setdiff1d(np.arange(len(scores)), test)
        cuts = np.sort(np.unique(scores[train]))
        candidates = np.concatenate([[cuts[0] - 1], (cuts[:-1] + cuts[1:]) / 2, [cuts[-1] + 1]])
        train_acc = np.array([np.mean((scores[train] >= t) == same[train]) for t in candidates])
        best = candidates[train_acc == train_acc.max()]
        test_acc = [np.mean((scores[test] >= t) == same[test]) for t in best]
        middle.append(test_acc[len(best) // 2])
        lows.append(min(test_acc))
        highs.append(max(test_acc))
    return middle, lows, highs


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_arcface_folder(tmp_path_factory.mktemp("arcface") / "data", pair_noise=250.0)


def test_training_prints_plain_lines_and_bin_accuracy_and_copies_them_to_the_log(
    tmp_path, folder, capsys
):
    config = write_config(tmp_path, folder)
    # run.progress is on, but stderr is not a terminal here (as under nohup): plain lines
    assert main(["train", "--config", str(config)]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    steps = [STEP_LINE.match(line) for line in out if line.startswith("step ")]
    assert [(m.group(1), m.group(2), m.group(3)) for m in steps] == [
        ("1", "2", "0.25"),
        ("2", "2", "0.50"),
    ]
    assert "it/s" not in captured.err and "\r" not in captured.err  # no bar
    # the final check: one line per set, after the "N steps ..." line
    final = out[[i for i, line in enumerate(out) if line.startswith("2 steps")][0] + 1 :]
    printed = {m.group(1): m for m in map(BIN_LINE.match, final[:2])}
    assert set(printed) == {"lfw", "cfp_fp"}

    run = tmp_path / "runs" / "job"
    checkpoint = run / "checkpoints" / "step-00000002"
    for name, match in printed.items():
        encoded, same = load_verification_bin(folder / f"{name}.bin")
        e = flip_embeddings(checkpoint, decode_images(encoded))
        scores = np.sum(e[0::2] * e[1::2], axis=1)
        middle, lows, highs = tenfold_accuracy(scores, same)
        mean = float(match.group(2))
        assert 100 * np.mean(lows) - 0.005 <= mean <= 100 * np.mean(highs) + 0.005, name
        assert match.group(2) == f"{100 * np.mean(middle):.2f}", name
        assert match.group(3) == f"{100 * np.std(middle):.2f}", name  # population std

    # every console line, stdout and stderr, is in training.log with the time
    logged = (run / "training.log").read_text().splitlines()
    assert all(STAMP.match(line) for line in logged)
    logged = [STAMP.sub("", line) for line in logged]
    assert [line for line in logged if line in out] == out
    assert set(logged) == set(out) | set(captured.err.splitlines())

    # resumed: the log grows, the earlier lines kept
    args = ["train", "--config", str(config), "--resume", "--set", "train.epochs=0.75"]
    assert main([*args, "--set", "run.progress=false"]) == 0
    resumed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("step 3/3 (epoch 0.75): loss ") for line in resumed)
    again = [STAMP.sub("", line) for line in (run / "training.log").read_text().splitlines()]
    assert again[: len(logged)] == logged and again[len(logged) :] == [
        line for line in again[len(logged) :] if line in resumed or line not in out
    ]
    assert [line for line in again[len(logged) :] if line in resumed] == resumed
