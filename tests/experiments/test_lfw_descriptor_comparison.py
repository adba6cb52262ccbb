"""The one-network / side-file comparison's assembly (synthetic scores) and its argument errors."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import lfw_descriptor_comparison as comparison
from partialfc.eval import compare_kfold_accuracy, kfold_accuracy
from tests.train.test_lfw_recipe import REPO


def test_compare_pools_the_runs_and_reports_each():
    rng = np.random.default_rng(0)
    same = np.tile(np.repeat([True, False], 60), 2)
    fold = np.repeat([4, 5], 120)
    signal = np.where(same, 1.0, -1.0)

    def scored():
        return {
            source: {
                name: signal + rng.standard_normal(signal.size)
                for name in ("in_graph", "side_file")
            }
            for source in ("grey", "colour")
        }

    scores = [scored(), scored()]
    out = comparison.compare(
        scores, {"grey": same, "colour": same}, {"grey": fold, "colour": fold}, 30, 1
    )
    for source in ("grey", "colour"):
        for i, run in enumerate(out[source]["per_run"]):
            for name in ("in_graph", "side_file"):
                expected = kfold_accuracy(scores[i][source][name], same, folds=fold).mean
                assert run[name] == pytest.approx(expected, abs=1e-15)
            alone = compare_kfold_accuracy(
                scores[i][source]["in_graph"],
                scores[i][source]["side_file"],
                same,
                fold,
                resamples=1,
            )
            assert (run["only_in_graph_right"], run["only_side_file_right"], run["mcnemar_p"]) == (
                alone.only_a_right,
                alone.only_b_right,
                alone.mcnemar_p,
            )
        expected = compare_kfold_accuracy(
            np.stack([s[source]["in_graph"] for s in scores]),
            np.stack([s[source]["side_file"] for s in scores]),
            same,
            fold,
            resamples=30,
            seed=1,
        ).to_dict()
        assert out[source]["in_graph_minus_side_file"] == expected
        assert expected["n_repeats"] == 2


def test_arguments_are_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        comparison.main(["--runs", str(tmp_path / "missing")])
    assert "missing is not a run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        comparison.main(["--runs", str(tmp_path)])
    assert f"{tmp_path} holds no checkpoint" in capsys.readouterr().err
    checkpoint = tmp_path / "checkpoints" / "step-00000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.json").write_text("{}")
    with pytest.raises(SystemExit):
        comparison.main(["--runs", str(tmp_path), "--resamples", "0"])
    assert "--resamples and --threads must be >= 1, got 0, 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        comparison.main(
            ["--runs", str(tmp_path), "--config", str(REPO / "configs" / "lfw_dev_val_fused.yaml")]
        )
    assert "must set recipe.ltp_in_graph" in capsys.readouterr().err
