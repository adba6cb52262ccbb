"""The gradient-orientation part: hand-worked histograms, the mirror, the fused score."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments import lfw_gradient_part as gp
from tests.experiments.test_lfw_ltp_inner_cv import _small_recipe
from tests.train.test_lfw_recipe import _saved_model


def test_a_horizontal_ramp_votes_by_the_cosine_power_of_each_bin():
    # x = 0.01 · column: every pixel's central difference is gx = 0.02, gy = 0 (θ = 0), except
    # the replicated edge columns (gx = 0.01); at side 48 the area-resampled ramp has slope 0.02
    ramp = (0.01 * torch.arange(96.0)).expand(1, 1, 96, 96).clone()
    got = gp.gradient_orientation_histograms(ramp, cell_px=12, stride_px=12, power=2)
    per_side_96, per_side_48 = 8 * 8 * 9, 4 * 4 * 9
    assert got.shape == (1, per_side_96 + per_side_48)
    cells = got[0, :per_side_96].view(9, 8, 8)  # (bins, rows, columns)
    for k in range(9):
        vote = 0.02 * max(0.0, math.cos(2 * math.pi * k / 9)) ** 2
        # an inner cell: every pixel votes alike; the first cell has one edge column in 12
        np.testing.assert_allclose(cells[k, 3, 3].item(), math.sqrt(vote), rtol=1e-5, atol=1e-7)
        edge = (11 * vote + 0.5 * vote) / 12
        np.testing.assert_allclose(cells[k, 3, 0].item(), math.sqrt(edge), rtol=1e-5, atol=1e-7)
    half = got[0, per_side_96:].view(9, 4, 4)
    np.testing.assert_allclose(half[0, 1, 1].item(), math.sqrt(0.04), rtol=1e-5)


def test_a_mirrored_face_reflects_the_cells_and_the_orientations():
    faces = torch.rand(2, 1, 96, 96, generator=torch.Generator().manual_seed(0))
    kwargs = {"cell_px": 12, "stride_px": 6, "power": 4}
    h = gp.gradient_orientation_histograms(faces, **kwargs)
    m = gp.gradient_orientation_histograms(torch.flip(faces, dims=[3]), **kwargs)
    offset = 0
    for cells in (15, 7):  # 12-px cells every 6 px at sides 96 and 48
        size = 9 * cells * cells
        a = h[:, offset : offset + size].view(2, 9, cells, cells)
        b = m[:, offset : offset + size].view(2, 9, cells, cells)
        # θ → π − θ: bin k (doubled angle 2πk/9) → bin −k mod 9; columns reversed
        mirrored = a[:, [(-k) % 9 for k in range(9)]].flip(3)
        np.testing.assert_allclose(b.numpy(), mirrored.numpy(), rtol=1e-4, atol=1e-6)
        offset += size
    assert offset == h.shape[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("12:6:4:600:0.1", "CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT"),
        ("12:6:4:six:0.1:1", "invalid literal"),
        ("12:6:4:600:0.1:0", "every field must be positive"),
    ],
)
def test_bad_settings_are_refused_by_name(text, message):
    with pytest.raises(ValueError, match=message):
        gp.GradientSetting.parse(text)
    setting = gp.GradientSetting.parse("12:6:4:600:0.1:1.5")
    assert setting == gp.GradientSetting(12, 6, 4.0, 600, 0.1, 1.5)
    assert str(setting) == "12:6:4:600:0.1:1.5"


def test_the_third_part_enters_the_score_with_its_weight(shared_data, tmp_path):
    from sklearn.metrics import roc_auc_score

    from experiments import lfw_face_recipe as recipe_mod
    from partialfc.eval import l2_normalize

    # the inner-CV tests' small recipe (150 training crops, not aligned), grey pairs only
    recipe = replace(_small_recipe(shared_data), pair_sources=["grey"], lbp_components=20)
    model = _saved_model(tmp_path / "m", 0, size=64)
    settings = [gp.GradientSetting(16, 16, 4.0, 20, 0.3, 2.0)]
    got = gp.run(recipe, [str(model)], settings)
    # independently: the one-network model's output and the gradient part, weighed by hand
    split = recipe_mod.build_split(recipe)
    fused = recipe_mod.whitened_run(model, split, recipe)
    with torch.no_grad():
        out = fused(recipe_mod.normalised_faces(split.val_images)).numpy()
    net, ltp = l2_normalize(out[:, : fused.embedding_dim - 20]), l2_normalize(out[:, -20:])
    grad = l2_normalize(gp.fit_gradient_part(split, settings[0])(split.val_images))
    pairs = recipe_mod.pair_images(recipe, split, "grey")
    same = split.pairs.issame[pairs.keep]

    def cosine(e):
        return np.sum(e[pairs.first] * e[pairs.second], axis=1)

    base = cosine(net) + 3 * cosine(ltp)
    row = got["runs"][0]
    assert row["network_and_ltp"]["grey"]["auc"] == pytest.approx(
        roc_auc_score(same, base), abs=1e-4
    )
    assert row["with_gradient_part"][0]["grey"]["auc"] == pytest.approx(
        roc_auc_score(same, base + 2 * cosine(grad)), abs=1e-4
    )
    assert got["gradient_part_alone"][0]["grey"]["auc"] == pytest.approx(
        roc_auc_score(same, cosine(grad)), abs=1e-4
    )
    assert row["with_gradient_part"][0]["grey"]["auc"] != pytest.approx(
        row["network_and_ltp"]["grey"]["auc"], abs=1e-4
    )


def test_a_setting_the_training_images_cannot_fill_is_named():
    split = SimpleNamespace(
        train_images=np.random.default_rng(0).integers(0, 256, (6, 96, 96), dtype=np.uint8),
        train_labels=np.repeat(np.arange(3), 2),
    )
    with pytest.raises(
        ValueError, match=r"gradient setting 12:6:4:50:0.1:1: num_components \(50\)"
    ):
        gp.fit_gradient_part(split, gp.GradientSetting(12, 6, 4.0, 50, 0.1, 1.0))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("short setting", "CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT"),
        ("absent run", "is not a run folder"),
        ("empty run", "holds no checkpoint"),
        ("absent out folder", "the folder of"),
        ("side-file preset", "recipe.ltp_in_graph: true"),
    ],
)
def test_flags_refuse_bad_use(case, message, tmp_path, capsys):
    run = _saved_model(tmp_path / "m", 0, size=64)
    args = {
        "--config": "configs/lfw_dev_val_onefile.yaml",
        "--out": str(tmp_path / "o.json"),
        "--runs": str(run),
        "--settings": "12:6:4:600:0.1:1",
    }
    args |= {
        "short setting": {"--settings": "12:6:4"},
        "absent run": {"--runs": str(tmp_path / "absent")},
        "empty run": {"--runs": str(tmp_path)},
        "absent out folder": {"--out": str(tmp_path / "absent" / "o.json")},
        "side-file preset": {"--config": "configs/lfw_dev_val_fused.yaml"},
    }[case]
    with pytest.raises(SystemExit):
        gp.main([item for pair in args.items() for item in pair])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()  # nothing written
