"""docs/arcface_torch.md's commands on a synthetic arcface_torch folder: an arcface_torch config
pointing at it is converted, trains two steps with its .bin checks, and the run is evaluated on
lfw.bin."""

from __future__ import annotations

import json
import re

from partialfc.cli import main
from tests.tools.arcface_folder import write_arcface_folder

CONFIG = """\
from easydict import EasyDict as edict

config = edict()
config.margin_list = (1.0, 0.5, 0.0)
config.network = "r50"
config.resume = False
config.output = {output!r}
config.embedding_size = 32
config.sample_rate = 0.5
config.fp16 = False
config.momentum = 0.9
config.weight_decay = 5e-4
config.batch_size = 8
config.lr = 0.1
config.verbose = 2
config.frequent = 1
config.dali = False
config.num_workers = 0
config.rec = "/train_tmp/ms1m-retinaface-t1"
config.num_classes = 6
config.num_image = 36
config.num_epoch = 20
config.warmup_epoch = 0
config.val_targets = ["lfw", "cfp_fp"]
"""


def test_an_arcface_torch_folder_converts_trains_and_evaluates(tmp_path, capsys):
    folder = write_arcface_folder(tmp_path / "ms1m")
    configs = tmp_path / "arcface_torch" / "configs"
    configs.mkdir(parents=True)
    (configs / "base.py").write_text("from easydict import EasyDict as edict\nconfig = edict()\n")
    (configs / "tiny.py").write_text(CONFIG.format(output=str(tmp_path / "work_dirs" / "tiny")))
    yaml_path = tmp_path / "tiny.yaml"

    args = ["import-config", str(configs / "tiny.py"), "--rec", str(folder)]
    assert main([*args, "--output", str(yaml_path), "--network", "iresnet_tiny"]) == 0
    assert f"wrote {yaml_path}" in capsys.readouterr().out

    train = ["train", "--config", str(yaml_path), "--set", "train.epochs=0.5"]
    assert main([*train, "--set", "train.num_threads=1"]) == 0
    out = capsys.readouterr().out.splitlines()
    run = tmp_path / "work_dirs" / "tiny"
    assert any(line.startswith("step 2/2 (epoch 0.50): loss ") for line in out)
    checks = [line for line in out if re.match(r"^(lfw|cfp_fp): 10-fold accuracy ", line)]
    assert len(checks) == 4  # at step 2 (config.verbose) and at the end, for both sets
    assert (run / "training.log").is_file() and (run / "report" / "report.md").is_file()

    report = tmp_path / "report"
    assert main(["eval", str(run), "--bin", str(folder / "lfw.bin"), "--out", str(report)]) == 0
    evaluated = capsys.readouterr().out.splitlines()
    # the same weights on the same set: the line of the training's final check, number for number
    assert evaluated[0] == [line for line in checks if line.startswith("lfw:")][-1]
    (result,) = json.loads((report / "results.json").read_text())["results"]
    accuracy = result["kfold_accuracy"]
    assert len(accuracy["fold_accuracy"]) == 10
    assert (
        f"10-fold accuracy {100 * accuracy['mean']:.2f} ± {100 * accuracy['std']:.2f}%"
        in (evaluated[0])
    )
