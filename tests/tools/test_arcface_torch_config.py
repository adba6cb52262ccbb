"""arcface_torch config files (Python, never run) converted to partialfc's YAML config: the base
followed as arcface_torch's get_config does, every mapped value, the reasons of dropped keys,
the refusals with file and line, and the written file loading through the real loader."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import yaml

from partialfc.cli import main
from partialfc.tools.arcface_torch.config import (
    DROPPED,
    POSITIVES_ONLY_RATE,
    ArcfaceConfigError,
    convert_config,
    resolve_settings,
    write_converted,
)
from partialfc.train.config import load_config

BASE = """\
from easydict import EasyDict as edict

config = edict()
config.margin_list = (1.0, 0.5, 0.0)
config.network = "r50"
config.resume = False
config.save_all_states = False
config.output = "ms1mv3_arcface_r50"
config.embedding_size = 512
config.sample_rate = 1
config.interclass_filtering_threshold = 0
config.fp16 = False
config.batch_size = 128
config.optimizer = "sgd"
config.lr = 0.1
config.momentum = 0.9
config.weight_decay = 5e-4
config.verbose = 2000
config.frequent = 10
config.dali = False
config.gradient_acc = 1
config.seed = 2048
config.num_workers = 2
config.using_wandb = False
config.wandb_key = "XXXX"
"""

JOB = """\
from easydict import EasyDict as edict

# a job config: arcface_torch's get_config updates the base with it
config = edict()
config.margin_list = (1.0, 0.0, 0.4)
config.network = "mbf"
config.output = None
config.embedding_size = 256
config.sample_rate = 0.2
config.interclass_filtering_threshold = 0.4
config.fp16 = True
config.batch_size = 64
config.optimizer = "adamw"
config.lr = 0.001
config.weight_decay = 0.1
config.verbose = 1200
config.frequent = 30
config.gradient_acc = 3
config.rec = "/data/webface"
config.num_classes = 30 * 10000
config.num_image = 1000000
config.num_epoch = 40
config.warmup_epoch = config.num_epoch // 8
config.val_targets = ["lfw", "cfp_fp"]
"""


def write_configs(folder: Path, job: str = JOB, base: str | None = BASE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if base is not None:
        (folder / "base.py").write_text(base)
    path = folder / "job.py"
    path.write_text(textwrap.dedent(job))
    return path


def test_the_file_overrides_its_base_key_by_key_and_keeps_where_each_was_set(tmp_path):
    path = write_configs(tmp_path / "configs")
    settings, base = resolve_settings(path)
    assert base == tmp_path / "configs" / "base.py"
    assert settings["network"].value == "mbf"  # the job's
    assert settings["network"].line == 6 and settings["network"].file == path
    assert settings["seed"].value == 2048  # only in the base
    assert settings["seed"].file == base and settings["seed"].line == 22
    assert settings["num_classes"].value == 300_000  # 30 * 10000
    assert settings["warmup_epoch"].value == 5  # config.num_epoch // 8
    # `from configs.base import config` starts from the base's object, as in Python
    inherit = "from configs.base import config\nconfig.lr = config.lr * 5\n"
    settings, _ = resolve_settings(write_configs(tmp_path / "inherit", inherit))
    assert settings["lr"].value == 0.5 and settings["network"].value == "r50"


def test_every_mapped_key_has_the_value_arcface_torch_trains_with(tmp_path):
    converted = convert_config(write_configs(tmp_path / "configs"))
    d = converted.data
    # margin_list (1.0, 0.0, 0.4): CosFace m3 = 0.4, same order and units
    assert d["head"]["margin"] == {"scale": 64.0, "m1": 1.0, "m2_rad": 0.0, "m3": 0.4}
    assert d["model"] == {"name": "mobilefacenet", "embedding_dim": 256}
    assert d["head"]["sample_rate"] == 0.2
    assert d["head"]["negative_cos_threshold"] == 0.4
    assert d["head"]["num_classes"] == 300_000
    assert d["train"]["precision"] == "auto"
    assert d["data"]["batch_size"] == 64 and d["data"]["num_workers"] == 2
    assert d["data"]["source"] == "recordio" and d["data"]["path"] == "/data/webface/train.rec"
    assert d["optim"]["name"] == "adamw" and d["optim"]["lr"] == 0.001
    assert d["optim"]["weight_decay"] == 0.1 and d["optim"]["grad_clip_norm"] == 5.0
    # verbose / frequent count micro-batches in arcface_torch: 1200 / 3 and 30 / 3 steps here
    assert d["eval"]["every_steps"] == 400 and d["train"]["log_every"] == 10
    assert d["train"]["accumulate_steps"] == 3 and d["train"]["seed"] == 2048
    assert d["train"]["epochs"] == 40.0 and d["schedule"]["warmup_epochs"] == 5.0
    assert d["schedule"]["kind"] == "poly" and d["schedule"]["power"] == 1.0
    assert d["eval"]["protocols"] == ["bin:/data/webface/lfw.bin", "bin:/data/webface/cfp_fp.bin"]
    assert d["eval"]["flip_test"] is True
    # output = None: arcface_torch's work_dirs/<config name>
    assert d["run"] == {"output_dir": "work_dirs", "name": "job"}
    mapped = {o.key for o in converted.mapped}
    assert "margin_list" in mapped and "val_targets" in mapped


def test_the_base_values_map_arcface_margin_half_a_radian_and_exact_softmax(tmp_path):
    path = write_configs(tmp_path / "configs", "from configs.base import config\n")
    d = convert_config(path, rec=str(tmp_path / "data")).data
    assert d["head"]["margin"] == {"scale": 64.0, "m1": 1.0, "m2_rad": 0.5, "m3": 0.0}
    assert d["model"]["name"] == "iresnet50"
    assert d["head"]["sample_rate"] == 1.0 and d["head"]["negative_cos_threshold"] is None
    assert d["train"]["precision"] == "fp32"
    assert d["optim"]["momentum"] == 0.9 and d["optim"]["weight_decay"] == 5e-4
    assert d["run"] == {"output_dir": ".", "name": "ms1mv3_arcface_r50"}
    assert d["data"]["path"] == str(tmp_path / "data" / "train.rec")  # --rec, no config.rec
    assert d["eval"]["every_steps"] == 2000 and d["train"]["log_every"] == 10


def test_sample_rate_zero_keeps_only_the_positive_classes(tmp_path):
    job = JOB.replace("config.sample_rate = 0.2", "config.sample_rate = 0")
    d = convert_config(write_configs(tmp_path / "configs", job)).data
    assert d["head"]["sample_rate"] == POSITIVES_ONLY_RATE
    assert math.ceil(POSITIVES_ONLY_RATE * 999_999_999) == 1


def test_dropped_keys_come_with_their_reasons(tmp_path):
    job = JOB + "config.dali_aug = True\nconfig.my_own_key = 3\n"
    converted = convert_config(write_configs(tmp_path / "configs", job))
    dropped = {o.key: o.note for o in converted.dropped}
    assert dropped["num_image"] == DROPPED["num_image"]
    assert "train.idx" in dropped["num_image"]
    assert "--resume" in dropped["resume"]
    assert "DALI" in dropped["dali"] and "data.augment" in dropped["dali_aug"]
    assert "Weights & Biases" in dropped["using_wandb"] == dropped["wandb_key"]
    assert dropped["my_own_key"] == "not a key arcface_torch's train_v2.py reads"
    assert all(note for note in dropped.values())
    # every key of both files is accounted for once
    settings, _ = resolve_settings(converted.source)
    assert sorted(o.key for o in converted.outcomes) == sorted(settings)


def test_the_written_yaml_loads_with_the_real_loader_and_heads_with_the_report(tmp_path):
    converted = convert_config(write_configs(tmp_path / "configs"))
    out = write_converted(converted, tmp_path / "out" / "job.yaml")
    cfg = load_config(out)
    assert cfg.model.name == "mobilefacenet" and cfg.head.margin.m3 == 0.4
    assert cfg.eval.every_steps == 400 and cfg.train.accumulate_steps == 3
    text = out.read_text()
    assert text.startswith("# Converted by `partialfc import-config`")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any(line.startswith("#   num_image = 1000000: dropped: ") for line in header)
    assert any("margin_list = (1.0, 0.0, 0.4) -> head.margin.m1" in line for line in header)
    assert yaml.safe_load(text)["head"]["margin"]["m3"] == 0.4


@pytest.mark.parametrize(
    ("job", "line", "message"),
    [
        ("config = edict()\nconfig.lr = float('0.1')\n", 4, "calls a function (`float(...)`)"),
        ("import os\nconfig = edict()\n", 3, "imports os"),
        ("config = edict()\nother = edict()\n", 4, "assigns to `other`"),
        ("config = edict()\nos.environ = 1\n", 4, "sets an attribute of `os`"),
        ("config = edict()\nconfig.lr = rate\n", 4, "refers to the name `rate`"),
        ("config = edict()\nconfig.a = config.b\n", 4, "reads config.b before it is set"),
        ("config = edict()\nfor i in []:\n    pass\n", 4, "a For statement is not read"),
        ("config = edict()\nconfig.x = 'a' * 3\n", 4, "with something other than numbers"),
        ("config = dict()\n", 3, "`config` must be `edict()`"),
        ("config = edict()\nconfig.lr = (0.1\n", 4, "not valid Python"),
    ],
)
def test_anything_but_literal_settings_is_refused_naming_file_and_line(
    tmp_path, job, line, message
):
    path = write_configs(tmp_path / "configs", "from easydict import EasyDict as edict\n\n" + job)
    with pytest.raises(ArcfaceConfigError) as err:
        convert_config(path)
    assert f"{path}:{line}: " in str(err.value)
    assert message in str(err.value)


def test_values_of_the_wrong_kind_and_unknown_networks_are_errors(tmp_path):
    job = "from configs.base import config\nconfig.margin_list = (1.0, 0.5)\n"
    with pytest.raises(ArcfaceConfigError, match=r"job.py:2: config.margin_list must be three"):
        convert_config(write_configs(tmp_path / "a", job), rec="/r")
    job = "from configs.base import config\nconfig.network = 'r2060'\n"
    path = write_configs(tmp_path / "b", job)
    with pytest.raises(ArcfaceConfigError, match=r"'r2060' has no partialfc equivalent"):
        convert_config(path, rec="/r")
    with pytest.raises(ArcfaceConfigError, match=r"job.py: sets no config.rec .* --rec"):
        convert_config(path, network="iresnet200")
    converted = convert_config(path, rec="/r", network="iresnet200")
    assert converted.data["model"]["name"] == "iresnet200"
    job = "from configs.base import config\nconfig.margin_list = (1.0, 0.5, 1.5)\n"
    with pytest.raises(ArcfaceConfigError, match=r"does not load: head.margin.m3"):
        convert_config(write_configs(tmp_path / "c", job), rec="/r")


def test_the_command_writes_nothing_on_error_and_reports_every_key(tmp_path, capsys):
    bad = write_configs(tmp_path / "bad", "config = edict()\nconfig.lr = eval('1')\n")
    out = tmp_path / "out.yaml"
    assert main(["import-config", str(bad), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("partialfc import-config: ") and f"{bad}:" in err
    assert not out.exists()
    good = write_configs(tmp_path / "good")
    assert main(["import-config", str(good), "--output", str(out), "--rec", "/r"]) == 0
    printed = capsys.readouterr().out
    assert "mapped (22 keys):" in printed and "dropped (6 keys):" in printed
    assert load_config(out).data.path == "/r/train.rec"
