"""Config schema: presets load, overrides are typed, typos are errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from partialfc.cli import main
from partialfc.train.config import ConfigError, load_config

PRESETS = (
    "omniglot_cpu",
    "omniglot_best",
    "omniglot_distill",
    "omniglot_select",
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
    with pytest.raises(
        ConfigError, match=r"head\.sample_rate must be a finite number in \(0, 1\], got 1\.5"
    ):
        load_config(None, ["head.sample_rate=1.5"])


def test_cli_reports_a_typo_and_exits_2(capsys):
    config = CONFIGS[0]
    code = main(["train", "--config", str(config), "--set", "train.epoch=3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'train.epoch'" in err and "did you mean 'train.epochs'" in err


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.augment.max_rotation_deg=1e308",
            "data.augment.max_rotation_deg must be a finite number in [0, 180], got 1e+308",
        ),
        ("data.augment.max_rotation_deg=.nan", "in [0, 180], got nan"),
        ("data.augment.max_shift_frac=-0.1", "max_shift_frac must be a finite number in [0, 1]"),
        ("data.augment.max_scale_delta=1", "max_scale_delta must be a finite number in [0, 1)"),
        ("data.augment.color_jitter=5", "color_jitter must be a finite number in [0, 1], got 5.0"),
        ("data.augment.erase_prob=-0.1", "erase_prob must be a finite number in [0, 1], got -0.1"),
        ("data.augment.crop_padding=200", "crop_padding must be at most data.input_size=112"),
        ("data.augment.crop_padding=-1", "crop_padding must be an integer >= 0, got -1"),
        ("data.input_size=100000", "data.input_size must be an integer in [1, 4096]"),
        ("optim.lr=.inf", "optim.lr must be a finite number > 0, got inf"),
        ("optim.head_lr=0", "optim.head_lr must be null or a finite number > 0, got 0.0"),
        ("optim.momentum=1", "optim.momentum must be a finite number in [0, 1), got 1.0"),
        ("optim.weight_decay=-1", "optim.weight_decay must be a finite number >= 0"),
        ("optim.eps=0", "optim.eps must be a finite number > 0, got 0.0"),
        ("optim.grad_clip_norm=.inf", "optim.grad_clip_norm must be null or a finite number > 0"),
        ("optim.betas=[0.9]", "optim.betas must be two numbers, got [0.9]"),
        ("optim.betas=[0.9, 1.5]", "optim.betas[1] must be a finite number in [0, 1), got 1.5"),
        ("schedule.milestones=[-1]", "schedule.milestones[0] must be a finite number >= 0"),
        ("schedule.gamma=0", "schedule.gamma must be a finite number > 0, got 0.0"),
        ("schedule.power=.nan", "schedule.power must be a finite number >= 0, got nan"),
        ("schedule.warmup_epochs=30", "schedule.warmup_epochs=30 must be below train.epochs=20"),
        ("head.margin.scale=0", "head.margin.scale must be a finite number > 0, got 0.0"),
        ("head.margin.m2_rad=4", "head.margin.m2_rad must be a finite number in [0, 3.14159)"),
        ("head.margin.m3=1", "head.margin.m3 must be a finite number in [0, 1), got 1.0"),
        ("head.margin.m1=-1", "head.margin.m1 must be a finite number > 0, got -1.0"),
        ("head.margin.ramp_steps=-5", "head.margin.ramp_steps must be an integer >= 0"),
        ("head.negative_cos_threshold=2", "negative_cos_threshold must be null or a finite"),
        ("head.num_classes=-1", "head.num_classes must be an integer >= 0, got -1"),
        ("train.epochs=.inf", "train.epochs must be a finite number > 0, got inf"),
        ("train.seed=-1", "train.seed must be an integer in [0, 4294967295], got -1"),
        ("train.num_threads=-2", 'train.num_threads must be an integer >= 0 or "auto", got -2'),
        ("train.num_threads=fast", 'train.num_threads must be an integer >= 0 or "auto"'),
        (
            "schedule.warmup_fraction=1",
            "schedule.warmup_fraction must be a finite number in [0, 1)",
        ),
        ("run.on_exists=keep", "run.on_exists='keep': choose one of error, new, overwrite"),
        ("eval.batch_size=0", "eval.batch_size must be null or an integer >= 1, got 0"),
        ("loss.classifier_weight=.inf", "loss.classifier_weight must be a finite number >= 0"),
        (
            "model.kwargs={bogus: 1}",
            "model.kwargs.bogus: not an argument of model 'iresnet50'; "
            "model.kwargs may set dropout",
        ),
        (
            "model.kwargs={embedding_dim: 3}",
            "model.kwargs.embedding_dim: set by model.embedding_dim, not in model.kwargs",
        ),
        ("model.kwargs={dropout: 2}", "model.kwargs.dropout must be a finite number in [0, 1)"),
        ("model.name=resnet", "model.name='resnet': choose one of iresnet18"),
    ],
)
def test_out_of_range_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["data.source=omniglot", override])
    assert message in str(info.value)


def test_train_command_reports_the_key_before_training(tmp_path, capsys):
    from partialfc.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("data:\n  source: omniglot\n")
    args = ["train", "--config", str(config), "--set", "data.augment.max_rotation_deg=1e308"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "data.augment.max_rotation_deg must be a finite number in [0, 180], got 1e+308" in err
    assert "math domain error" not in err and not (tmp_path / "runs").exists()


def test_head_compute_dtype_is_checked_and_built():
    import torch

    from partialfc.train.builders import build_head

    cfg = load_config(CONFIGS[0], ["head.compute_dtype=bfloat16"])
    head, _ = build_head(cfg.head, 16, 20, seed=0, device=torch.device("cpu"))
    assert head.precision.dtype == torch.bfloat16
    assert head.precision.path in ("native", "emulated")
    with pytest.raises(ConfigError, match=r"head\.compute_dtype='half'.*float32, bfloat16"):
        load_config(CONFIGS[0], ["head.compute_dtype=half"])
    with pytest.raises(ConfigError, match=r"head\.compute_dtype='bfloat16' needs head\.kind"):
        load_config(CONFIGS[0], ["head.compute_dtype=bfloat16", "head.kind=softmax"])
    cfg = load_config(CONFIGS[0], ["head.compute_dtype=float16", "head.kind=margin_softmax"])
    with pytest.raises(ValueError, match=r"head\.compute_dtype='float16' needs a GPU"):
        build_head(cfg.head, 16, 20, seed=0, device=torch.device("cpu"))


def test_a_choice_of_the_wrong_type_names_the_type():
    with pytest.raises(ConfigError, match=r"data\.source: expected str, got 5"):
        load_config(None, ["data.source=5"])
    with pytest.raises(ConfigError, match=r"data\.rotation_classes: expected int, got True"):
        load_config(None, ["data.source=omniglot", "data.rotation_classes=true"])
    with pytest.raises(ConfigError, match=r"data\.rotation_classes=3: choose one of 1, 2, 4"):
        load_config(None, ["data.source=omniglot", "data.rotation_classes=3"])


def test_the_config_offers_exactly_the_choices_the_library_takes():
    """Head kinds and storage dtypes: tests/train/test_head_kinds.py."""
    from typing import get_args, get_type_hints

    import torch

    from partialfc.losses.contract import OptimizerSettings
    from partialfc.losses.gemm_precision import COMPUTE_DTYPES
    from partialfc.losses.triplet import Mining
    from partialfc.train.config import allowed_values
    from partialfc.train.engine import resolve_precision

    assert allowed_values("head.compute_dtype") == tuple(COMPUTE_DTYPES)
    assert sorted(allowed_values("head.triplet_mining")) == sorted(get_args(Mining))
    assert allowed_values("loss.triplet_mining") == allowed_values("head.triplet_mining")
    optimizers = get_args(get_type_hints(OptimizerSettings)["name"])
    assert allowed_values("optim.name") == optimizers
    for precision in allowed_values("train.precision"):
        resolve_precision(precision, torch.device("cuda"))  # KeyError for one it does not know


def _laughs(levels: int) -> str:
    """A "billion laughs" list in ``eval.protocols``: 9 aliases of 9 aliases ... ``levels`` deep
    (9^(levels+1) strings once expanded)."""
    items = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "eval:\n  protocols: [[" + ", ".join(items) + "]]\n"


@pytest.mark.parametrize("levels", [8, 9])
def test_yaml_alias_bombs_are_refused_with_a_short_message(tmp_path, capsys, levels):
    """An 8-level bomb used to print a 226 MB message; a 9-level one died with MemoryError."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_laughs(levels))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: the YAML expands to more than 100000 values once its aliases (*name) are "
        "expanded; refused (an alias bomb?)"
    )
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    assert len(capsys.readouterr().err) < 300
    with pytest.raises(ConfigError, match=r"override 'eval.protocols=.*alias bomb"):
        load_config(overrides=["eval.protocols=" + _laughs(levels).split("protocols: ")[1]])


def test_expansion_budget_counts_aliases_as_copies_and_refuses_self_reference(tmp_path):
    from partialfc.train.config import check_expanded_size

    shared = ["x"] * 9
    data = {"a": [shared] * 9}  # 1 + 1 key + 1 list + 9 x (1 list + 9 strings) = 93 values
    check_expanded_size(data, "s", budget=93)
    with pytest.raises(ConfigError, match="more than 92 values"):
        check_expanded_size(data, "s", budget=92)
    loop = tmp_path / "loop.yaml"
    loop.write_text("eval:\n  protocols: &p [lfw, *p]\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml: a YAML alias refers to its own anchor"):
        load_config(loop)
    ok = tmp_path / "ok.yaml"  # anchors used as intended still load
    ok.write_text("data:\n  source: omniglot\noptim:\n  lr: &n 0.01\n  weight_decay: *n\n")
    assert load_config(ok).optim.weight_decay == 0.01


def test_values_in_config_errors_are_cut_short(tmp_path):
    """A megabyte value is echoed as at most 120 characters (``ranges.shown``)."""
    long = "x" * 1_000_000
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"optim.name={long}"])
    assert len(str(err.value)) < 300 and "xxx..." in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"train.epochs=[{','.join(['[1,2,3]'] * 10000)}]"])
    assert len(str(err.value)) < 300 and "..." in str(err.value)


def test_head_chunk_rows_is_checked_and_reaches_the_layer():
    import torch

    from partialfc.train.builders import build_head

    cfg = load_config(CONFIGS[0], ["head.chunk_rows=7"])
    head, _ = build_head(cfg.head, 16, 20, seed=0, device=torch.device("cpu"))
    assert head.chunk_rows == 7 and head.centers.chunk_rows == 7
    default = load_config(CONFIGS[0])
    assert default.head.chunk_rows is None
    head, _ = build_head(default.head, 16, 20, seed=0, device=torch.device("cpu"))
    assert head.chunk_rows == 2048  # the CPU's default
    with pytest.raises(ConfigError, match=r"head\.chunk_rows must be null or an integer >= 1"):
        load_config(CONFIGS[0], ["head.chunk_rows=0"])
    with pytest.raises(ConfigError, match=r"head\.chunk_rows: expected int \| None, got 1\.5"):
        load_config(CONFIGS[0], ["head.chunk_rows=1.5"])
    with pytest.raises(ConfigError, match=r"head\.chunk_rows=8 is a Partial FC setting"):
        load_config(CONFIGS[0], ["head.chunk_rows=8", "head.kind=softmax"])
