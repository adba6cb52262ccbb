"""benchmarks/aligned_vs_centre_crop.py end to end on a few LFW pairs with a random model (the
plumbing: crops, embeddings, pair scores and metrics recomputed independently)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from partialfc.backbone.io import save_backbone
from partialfc.data.lfw import LfwImageArchive, read_lfw_pairs
from partialfc.deploy import Embedder
from partialfc.detect import detect_and_align
from partialfc.eval.accuracy import kfold_accuracy
from partialfc.eval.roc import roc_auc
from partialfc.models import build_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "aligned_vs_centre_crop.py"
MODEL_CONFIG = {
    "name": "iresnet_small",
    "kwargs": {"embedding_dim": 16, "input_size": 48, "in_channels": 1},
}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("aligned_vs_centre_crop", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIG["name"], **MODEL_CONFIG["kwargs"]).eval()
    path = tmp_path_factory.mktemp("random_model")
    save_backbone(model, MODEL_CONFIG, path)
    return path


@pytest.fixture(scope="module")
def lfw_root():
    from tests.conftest import SHARED_DATA

    root = SHARED_DATA / "lfw_dev"
    if not (root / "lfw_color150_dev.zip").is_file():
        pytest.skip(f"LFW colour photos not found in {root}")
    return root


def test_scores_and_metrics_of_both_pipelines(script, random_model, lfw_root, detector, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--model", str(random_model), "--pairs-per-fold", "4", "--scores", "--out", str(out)]
    assert script.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["folds"] == [4, 5] and result["pairs"] == 8 and result["genuine_pairs"] == 4
    assert result["model_sha256"] == Embedder.load(random_model).model_sha256
    assert result["model_input"] == {"side": 48, "channels": 1}

    # the same pairs, crops and scores, recomputed here with the public API
    pairs = read_lfw_pairs(lfw_root / "pairs_dev.txt")
    rows = np.asarray(result["pair_indices"])
    assert set(pairs.fold[rows]) == {4, 5} and pairs.issame[rows].sum() == 4
    archive = LfwImageArchive(lfw_root / "lfw_color150_dev.zip")
    embedder = Embedder.load(random_model)

    def crops(name: str, number: int) -> tuple[np.ndarray, np.ndarray]:
        rgb = archive.read(name, number)
        centre = cv2.resize(rgb[17:133, 17:133], (48, 48), interpolation=cv2.INTER_AREA)
        (face,) = detect_and_align(rgb, detector, size=112)
        aligned = cv2.resize(face.crop, (48, 48), interpolation=cv2.INTER_AREA)
        grey = [cv2.cvtColor(c, cv2.COLOR_RGB2GRAY) for c in (aligned, centre)]
        return embedder.embed(np.stack(grey), flip=True)

    expected = {"aligned": [], "centre": []}
    for i in rows:
        a = crops(pairs.name1[i], int(pairs.number1[i]))
        b = crops(pairs.name2[i], int(pairs.number2[i]))
        expected["aligned"].append(float(a[0] @ b[0]))
        expected["centre"].append(float(a[1] @ b[1]))
    genuine = pairs.issame[rows]
    for name, scores in expected.items():
        scores = np.asarray(scores)
        np.testing.assert_allclose(result["pair_scores"][name], scores, atol=2e-6)
        acc = kfold_accuracy(scores, genuine, folds=pairs.fold[rows])
        got = result["pipelines"][name]
        assert got["accuracy"] == pytest.approx(acc.mean, abs=1e-4)
        assert got["roc_auc"] == pytest.approx(roc_auc(scores[genuine], scores[~genuine]), abs=1e-4)
    assert not np.allclose(expected["aligned"], expected["centre"])  # the crops differ
    assert result["aligned_fallback_to_centre"] == []


def test_bad_options_are_errors(script, random_model, capsys):
    argv = ["--model", str(random_model), "--centre-side", "400", "--pairs-per-fold", "2"]
    if not (Path(script.shared_data_root()) / "lfw_dev" / "pairs_dev.txt").is_file():
        pytest.skip("LFW pairs not found")
    assert script.main(argv) == 2
    assert "--centre-side 400 is larger than the 150x150 photos" in capsys.readouterr().err
    assert script.main(["--model", str(random_model), "--folds", "9"]) == 2
    assert "--folds: fold 9 has no pairs" in capsys.readouterr().err
