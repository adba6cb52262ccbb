"""Cross-validation of the in-graph descriptor's size inside the training folds (small fits)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from experiments import lfw_face_recipe, lfw_ltp_inner_cv
from experiments.lfw_face_recipe import load_recipe
from partialfc.data.loaders import load_lfw_gray
from tests.train.test_lfw_recipe import REPO

# 12-px cells every 6 px: 14 a row at side 96 and 6 at side 48, two radii, upper and lower codes;
# the left half of each row is kept (the other half mirrors it)
CELLS = (14 * 7 * 2 + 6 * 3 * 2) * 2


def _small_recipe(shared_data):
    recipe, _ = load_recipe(
        REPO / "configs" / "lfw_dev_val_onefile.yaml",
        [
            f"recipe.data_root={shared_data / 'lfw_dev'}",
            "recipe.align=false",
            "recipe.train_colour_views=false",
            "recipe.max_train_images=150",
            "recipe.train_folds=[1,2]",
        ],
    )
    return recipe


def _record_selected_folds(monkeypatch) -> list[int]:
    """Every fold whose people the recipe selects from now on (folds 4-5 must never be)."""
    requested = []
    select = lfw_face_recipe._select_people

    def recording(faces, folds):
        requested.extend(folds)
        return select(faces, folds)

    monkeypatch.setattr(lfw_face_recipe, "_select_people", recording)
    return requested


def test_rows_score_the_held_out_fold_and_never_read_the_validation_folds(shared_data, monkeypatch):
    recipe = _small_recipe(shared_data)
    select = lfw_face_recipe._select_people
    requested = _record_selected_folds(monkeypatch)
    result = lfw_ltp_inner_cv.run(recipe, [lfw_ltp_inner_cv.Setting(4, 8)])
    assert not set(requested) & {4, 5}
    assert [(r["held_out_fold"], r["projection_bytes"]) for r in result["rows"]] == [
        (1, CELLS * 4 * (8 + 59)),  # int8 projection and cell bases
        (2, CELLS * 4 * (8 + 59)),
    ]
    assert result["folds"]["1"]["train_folds"] == [2]
    assert result["folds"]["2"]["train_folds"] == [1]

    # the fold-1 row, recomputed: the same fit, scored by scikit-learn over every pair
    from sklearn.metrics import roc_auc_score

    split = lfw_face_recipe.build_split(replace(recipe, train_folds=[2], val_folds=[]))
    model = lfw_ltp_inner_cv.fit_setting(lfw_ltp_inner_cv.Setting(4, 8), split, recipe)
    images, labels = lfw_ltp_inner_cv.held_out_fold(recipe, 1)
    dev = load_lfw_gray(lfw_face_recipe.lfw_root(recipe), part="dev")
    held_out_people = select(dev, [1])[2]
    assert len(held_out_people) == len(np.unique(labels))
    assert not set(split.train_identities) & set(held_out_people)
    e = lfw_ltp_inner_cv.texture_embeddings(model, images)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    i, j = np.triu_indices(len(e), k=1)
    expected = roc_auc_score(labels[i] == labels[j], np.sum(e[i] * e[j], axis=1))
    assert result["rows"][0]["auc"] == pytest.approx(expected, abs=1e-9)
    mean = result["means"][0]
    assert mean["mean_auc"] == pytest.approx(np.mean([r["auc"] for r in result["rows"]]))


def test_the_side_file_row_is_the_fused_presets_descriptor_on_the_same_folds(shared_data):
    recipe = _small_recipe(shared_data)
    side = replace(
        lfw_ltp_inner_cv.side_file_recipe(recipe, REPO / "configs" / "lfw_dev_val_fused.yaml"),
        lbp_components=6,
    )
    assert (side.lbp_regularization, side.lbp_ternary_threshold) == (0.3, 8.0)
    result = lfw_ltp_inner_cv.run(recipe, [lfw_ltp_inner_cv.Setting(4, 8)], side)
    rows = [r for r in result["rows"] if r["descriptor"] == "side_file"]
    # three sides (96, 64, 48), two radii, two codes, 59 bins: 73,868 numbers, float32
    assert [(r["held_out_fold"], r["projection_bytes"]) for r in rows] == [
        (1, 73_868 * 6 * 4),
        (2, 73_868 * 6 * 4),
    ]

    # fold 2 recomputed: the descriptor of partialfc.models.lbp fitted on fold 1's people
    from sklearn.metrics import roc_auc_score

    from partialfc.models.lbp import LbpGrid, LbpWccnEmbedder

    split = lfw_face_recipe.build_split(replace(recipe, train_folds=[1], val_folds=[]))
    fitted = LbpWccnEmbedder(LbpGrid(ternary_threshold=8.0), num_components=6, regularization=0.3)
    fitted.fit(split.train_images, split.train_labels)
    images, labels = lfw_ltp_inner_cv.held_out_fold(recipe, 2)
    e = np.asarray(fitted(images), dtype=np.float64)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    i, j = np.triu_indices(len(e), k=1)
    expected = roc_auc_score(labels[i] == labels[j], np.sum(e[i] * e[j], axis=1))
    assert rows[1]["auc"] == pytest.approx(expected, abs=1e-9)
    means = {m["descriptor"]: m for m in result["means"]}
    assert means["side_file"]["mean_auc"] == pytest.approx(np.mean([r["auc"] for r in rows]))
    assert means["in_graph"]["auc_per_fold"] == [
        r["auc"] for r in result["rows"] if r["descriptor"] == "in_graph"
    ]


def test_a_side_file_config_must_be_a_side_file_preset(shared_data):
    recipe = _small_recipe(shared_data)
    with pytest.raises(ValueError, match="lfw_dev_val_onefile.yaml: not a side-file preset"):
        lfw_ltp_inner_cv.side_file_recipe(recipe, REPO / "configs" / "lfw_dev_val_onefile.yaml")


def test_side_file_components_beyond_the_training_images_are_refused_before_any_fit(
    shared_data, monkeypatch
):
    recipe = _small_recipe(shared_data)
    side = replace(
        lfw_ltp_inner_cv.side_file_recipe(recipe, REPO / "configs" / "lfw_dev_val_fused.yaml"),
        lbp_components=150,
    )

    def no_fit(*args):
        raise AssertionError("a descriptor was fitted before the check")

    monkeypatch.setattr(lfw_ltp_inner_cv, "fit_setting", no_fit)
    with pytest.raises(ValueError) as error:
        lfw_ltp_inner_cv.run(recipe, [lfw_ltp_inner_cv.Setting(4, 8)], side)
    assert str(error.value) == (
        "the side file's recipe.lbp_components (150) must be below the 150 training images of "
        "folds [2]"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--settings", "0:5"], "CELL in 1..59"),
        (["--settings", "60:5"], "CELL in 1..59"),
        (["--settings", "16"], "CELL:COMPONENTS"),
        (["--settings", "16:0"], "COMPONENTS >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--set", "recipe.train_folds=[1]"], "two training folds or more"),
        (["--set", "recipe.no_such_key=1"], "unknown recipe key(s) ['no_such_key']"),
        (["--out", "/no/such/folder/cv.json"], "--out: the folder of /no/such/folder/cv.json"),
        (["--side-file-config", "no_such.yaml"], "config file not found: no_such.yaml"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        lfw_ltp_inner_cv.main(
            ["--config", str(REPO / "configs" / "lfw_dev_val_onefile.yaml"), *argv]
        )
    assert message in capsys.readouterr().err


def test_a_missing_config_is_named(capsys):
    with pytest.raises(SystemExit):
        lfw_ltp_inner_cv.main(["--config", "no_such_preset.yaml"])
    assert "config file not found: no_such_preset.yaml" in capsys.readouterr().err


def _brute_force_kfold_accuracy(scores, same, folds):
    """Each fold at the threshold that is best on the other, counted pair by pair: candidates
    halfway between neighbouring scores (and beyond both ends), accept ``score >= t``, the
    middle one of equally good candidates (the rule of ``partialfc.eval.best_threshold``)."""
    rates = []
    for fold in np.unique(folds):
        test = folds == fold
        values = np.unique(scores[~test])
        candidates = [values[0] - 1, *((values[:-1] + values[1:]) / 2), values[-1] + 1]
        right = np.array([np.sum((scores[~test] >= t) == same[~test]) for t in candidates])
        best = np.flatnonzero(right == right.max())
        threshold = candidates[best[len(best) // 2]]
        rates.append(np.mean((scores[test] >= threshold) == same[test]))
    return float(np.mean(rates))


def test_pairs_mode_scores_two_held_out_folds_and_never_reads_the_validation_folds(
    shared_data, monkeypatch
):
    recipe = replace(_small_recipe(shared_data), train_folds=[1, 2, 3], max_train_images=120)
    assert lfw_ltp_inner_cv.pair_splits(recipe) == [([3], [1, 2]), ([2], [1, 3]), ([1], [2, 3])]
    requested = _record_selected_folds(monkeypatch)
    result = lfw_ltp_inner_cv.run_pairs(recipe, [lfw_ltp_inner_cv.Setting(4, 8)])
    assert not set(requested) & {4, 5}
    assert [(r["fitted_on"], r["held_out"]) for r in result["rows"]] == [
        ([3], [1, 2]),
        ([2], [1, 3]),
        ([1], [2, 3]),
    ]

    # the last row recomputed: the same fit on fold 1, its pairs of folds 2 and 3 scored by
    # scikit-learn (AUC) and a brute-force threshold search (accuracy)
    from sklearn.metrics import roc_auc_score

    split = lfw_face_recipe.build_split(replace(recipe, train_folds=[1], val_folds=[2, 3]))
    model = lfw_ltp_inner_cv.fit_setting(lfw_ltp_inner_cv.Setting(4, 8), split, recipe)
    row = result["rows"][-1]
    for source in ("grey", "colour"):
        pairs = lfw_face_recipe.pair_images(recipe, split, source)
        e = lfw_ltp_inner_cv.texture_embeddings(model, pairs.images)
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        scores = np.sum(e[pairs.first] * e[pairs.second], axis=1)
        same, folds = split.pairs.issame[pairs.keep], split.pairs.fold[pairs.keep]
        assert set(folds) == {2, 3}
        assert row[source]["n_pairs"] == scores.size
        assert row[source]["auc"] == pytest.approx(roc_auc_score(same, scores), abs=1e-9)
        expected = _brute_force_kfold_accuracy(scores, same, folds)
        assert row[source]["accuracy"] == pytest.approx(expected, abs=1e-12)
        assert row[source]["accuracy_at_own_threshold"] >= row[source]["accuracy"]
    mean = result["means"][0]
    assert mean["grey"]["auc"] == pytest.approx(np.mean([r["grey"]["auc"] for r in result["rows"]]))


def test_pairs_mode_needs_three_folds_with_pairs(shared_data):
    recipe = replace(_small_recipe(shared_data), train_folds=[0, 1, 2])
    with pytest.raises(ValueError, match=r"three or more of folds 1-5 .* got \[0, 1, 2\]"):
        lfw_ltp_inner_cv.pair_splits(recipe)
