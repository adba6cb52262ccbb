"""experiments/lfw_ablations.py: every ablation is a valid change of the validation preset."""

from __future__ import annotations

import pytest

from experiments import lfw_ablations
from experiments import lfw_face_recipe as recipe_mod
from tests.train.test_lfw_recipe import REPO

PRESET = REPO / "configs" / "lfw_dev_val.yaml"


def _resolved(overrides):
    recipe, config = recipe_mod.load_recipe(PRESET, overrides)
    return repr(recipe), repr(config)


@pytest.mark.parametrize("name", sorted(set(lfw_ablations.ABLATIONS) - {"preset"}))
def test_each_ablation_changes_the_preset(name):
    _, overrides = lfw_ablations.ABLATIONS[name]
    # a key the schema does not know raises; a value equal to the preset's is no ablation
    assert _resolved(overrides) != _resolved([]), f"{name} leaves {PRESET.name} unchanged"


def test_the_epoch_ablations_bracket_the_preset():
    _, config = recipe_mod.load_recipe(PRESET, [])
    epochs = {
        name: int(overrides[0].split("=")[1])
        for name, (_, overrides) in lfw_ablations.ABLATIONS.items()
        if name.startswith("ep")
    }
    assert epochs == {"ep40": 40, "ep80": 80}
    assert 40 < config.train.epochs < 80
