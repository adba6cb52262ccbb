"""Config schema: presets load, overrides are typed, typos are errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from partialfc.cli import main
from partialfc.train.config import ConfigError, load_config

PRESETS = (
    "omniglot_cpu",
    "omniglot_distill",
    "ms1mv3_r50_arcface",
    "webface42m_r100_pfc03",
    "glint360k_r100_pfc01",
    "webface42m_vit_t_pfc03",
)
CONFIGS = [Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml" for name in PRESETS]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_preset_loads_and_validates(path):
    cfg = load_config(path)
    assert cfg.train.epochs > 0 and cfg.data.batch_size > 0


def test_overrides_are_parsed_as_yaml_and_typed(tmp_path):
    cfg = load_config(
        None,
        [
            "data.source=omniglot",
            "train.epochs=3",
            "optim.lr=1e-3",
            "schedule.milestones=[8, 14]",
            "head.negative_cos_threshold=0.4",
            "checkpoint.resume=null",
            "model.kwargs={dropout: 0.1}",
        ],
    )
    assert cfg.train.epochs == 3.0 and isinstance(cfg.train.epochs, float)
    assert cfg.optim.lr == 1e-3
    assert cfg.schedule.milestones == [8.0, 14.0]
    assert cfg.head.negative_cos_threshold == 0.4
    assert cfg.model.kwargs == {"dropout": 0.1}


def test_typo_in_file_names_the_key_and_suggests(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epoch: 3\n")
    with pytest.raises(
        ConfigError, match=r"bad\.yaml.*'train\.epoch'.*did you mean 'train\.epochs'"
    ):
        load_config(path)


def test_typo_in_override_and_unknown_section():
    with pytest.raises(ConfigError, match=r"'optim\.learning_rate'"):
        load_config(None, ["optim.learning_rate=0.1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'.*did you mean 'train'"):
        load_config(None, ["trian.epochs=1"])


def test_wrong_type_and_choice_are_errors():
    with pytest.raises(ConfigError, match=r"train\.epochs: expected float, got 'many'"):
        load_config(None, ["train.epochs=many"])
    with pytest.raises(ConfigError, match=r"optim\.name='adam'.*sgd, adamw"):
        load_config(None, ["optim.name=adam"])
    with pytest.raises(ConfigError, match=r"head\.sample_rate=1\.5 is out of range"):
        load_config(None, ["head.sample_rate=1.5"])


def test_cli_reports_a_typo_and_exits_2(capsys):
    config = CONFIGS[0]
    code = main(["train", "--config", str(config), "--set", "train.epoch=3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'train.epoch'" in err and "did you mean 'train.epochs'" in err
