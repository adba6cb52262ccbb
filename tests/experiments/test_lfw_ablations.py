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


def test_all_people_at_equal_steps_matches_the_preset_schedule(shared_data):
    """``all_people_eq`` trains on 4,709 images instead of 2,561: the same optimiser steps and
    warm-ups as the preset, within a step of each (1 % for the whole run)."""

    from partialfc.train.engine import steps_per_epoch
    from partialfc.train.lr_schedule import warmup_steps

    def schedule(overrides):
        fast = [f"recipe.data_root={shared_data / 'lfw_dev'}", "recipe.align=false"]
        recipe, config = recipe_mod.load_recipe(PRESET, [*fast, *overrides])
        images = len(recipe_mod.build_split(recipe).train_labels)
        per_epoch = steps_per_epoch(images, config.data.batch_size, config.data.drop_last)
        total = round(config.train.epochs * per_epoch)  # as the engine counts them
        sch = config.schedule
        return per_epoch, {
            "total": total,
            "lr warm-up": warmup_steps(sch.warmup_epochs, sch.warmup_fraction, per_epoch, total),
            # as build_trainer turns the recipe's epochs into the margin's steps
            "margin warm-up": round(recipe.margin_warmup_epochs * per_epoch),
            "margin ramp": round(recipe.margin_ramp_epochs * per_epoch),
        }

    preset_per_epoch, preset = schedule([])
    per_epoch, steps = schedule(lfw_ablations.ABLATIONS["all_people_eq"][1])
    assert (preset_per_epoch, per_epoch) == (2561 // 32, 4709 // 32)
    assert abs(steps.pop("total") / preset.pop("total") - 1) < 0.01
    assert all(abs(steps[k] - preset[k]) <= 1 for k in preset), (steps, preset)
