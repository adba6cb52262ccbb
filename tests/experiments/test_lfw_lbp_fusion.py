"""The LBP grid and fusion table on the LFW recipe's split (small grid, few images)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from experiments import lfw_lbp_fusion
from experiments.lfw_face_recipe import evaluate_models, load_recipe
from tests.train.test_lfw_recipe import REPO, _saved_model


def test_table_rows_and_a_zero_weight_fusion_is_the_model(shared_data, tmp_path):
    from partialfc.models.lbp import LbpGrid

    recipe, _ = load_recipe(
        REPO / "configs" / "lfw_dev_val_fused.yaml",
        [
            f"recipe.data_root={shared_data / 'lfw_dev'}",
            "recipe.align=false",
            "recipe.whiten=false",
            "recipe.pair_sources=[grey]",
            "recipe.max_train_images=120",
            "recipe.lbp_components=12",
        ],
    )
    model = str(_saved_model(tmp_path / "m", 0))
    grid = LbpGrid((24,), (1,), 8, 8)
    result = lfw_lbp_fusion.run(recipe, [6, 12], [0.3, 1.0], [model], [2.0], grid=grid)
    assert [(r["components"], r["regularization"]) for r in result["lbp"]] == [
        (6, 0.3),
        (6, 1.0),
        (12, 0.3),
        (12, 1.0),
    ]
    rows = result["fusion"]["models"][model]
    assert [r["lbp_weight"] for r in rows] == [0.0, 2.0]
    alone = evaluate_models(replace(recipe, lbp_weight=0.0), [model])["model"]["pairs_grey"]
    assert rows[0]["pairs_grey"]["auc"] == pytest.approx(alone["auc"])
    assert rows[0]["pairs_grey"]["accuracy"] == pytest.approx(alone["accuracy"]["mean"])
    # the fused row is neither part alone: the LBP row at the recipe's 12 components, ridge 0.3
    lbp_row = result["lbp"][2]["pairs_grey"]["auc"]
    assert rows[1]["pairs_grey"]["auc"] not in (pytest.approx(alone["auc"]), pytest.approx(lbp_row))
    assert result["fusion"]["lbp_components"] == 12


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--components", "0"], "integers >= 1"),
        (["--components", "many"], "integers >= 1"),
        (["--regularization", "-1"], "numbers >= 0"),
        (["--weights", "nan"], "numbers >= 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        lfw_lbp_fusion.main(["--config", str(REPO / "configs" / "lfw_dev_val.yaml"), *argv])
    assert message in capsys.readouterr().err


def test_a_preset_without_validation_folds_is_refused(capsys):
    with pytest.raises(SystemExit):
        lfw_lbp_fusion.main(["--config", str(REPO / "configs" / "lfw_dev_final_fused.yaml")])
    assert "needs validation folds" in capsys.readouterr().err
