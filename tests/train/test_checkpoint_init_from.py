"""``checkpoint.init_from``: fine-tuning from a model directory (no trainer state) as well as
from a training checkpoint, with errors that name ``checkpoint.init_from``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from partialfc.backbone.io import load_backbone_state, save_backbone, save_weights
from partialfc.backbone.spec import PreprocessingSpec
from partialfc.data.datasets import ArrayDataset
from partialfc.models import build_model
from partialfc.tools.arcface_torch.weights import NETWORKS, arcface_key, import_weights
from partialfc.train import checkpoint as ckpt
from partialfc.train.engine import Trainer
from tests.train.helpers import tiny_config

EMBEDDING = 32


@pytest.fixture(scope="module")
def imported_r18(tmp_path_factory):
    """A random arcface_torch r18 (32-d, arcface_torch's names) imported as a model dir."""
    root = tmp_path_factory.mktemp("r18")
    torch.manual_seed(0)
    model = build_model("iresnet18", embedding_dim=EMBEDDING)
    state = {arcface_key("r18", k): v for k, v in model.state_dict().items()}
    state["bn2.running_mean"] = torch.randn(512) * 0.1  # imported statistics, not defaults
    torch.save(state, root / "backbone.pth")
    import_weights(root / "backbone.pth", "r18", root / "model")
    return root / "model"


def faces(num_classes=4, per_class=2):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (num_classes * per_class, 112, 112, 3), dtype=np.uint8)
    return ArrayDataset(images, np.repeat(np.arange(num_classes), per_class))


def r18_config(run_dir, init_from, *extra):
    return tiny_config(
        run_dir,
        "data.input_size=112",
        "data.batch_size=4",
        f"model.name={NETWORKS['r18']}",
        f"model.embedding_dim={EMBEDDING}",
        "train.epochs=1",  # 8 images / 4 per batch: 2 steps
        "schedule.warmup_epochs=0",
        f"checkpoint.init_from={init_from}",
        *extra,
    )


def test_fine_tune_two_steps_from_an_imported_model_directory(imported_r18, tmp_path):
    trainer = Trainer(r18_config(tmp_path, imported_r18), train_set=faces())
    imported = load_backbone_state(imported_r18)
    state = trainer.backbone.state_dict()
    assert sorted(state) == sorted(imported)
    for key, value in imported.items():  # step 0: exactly the imported weights
        assert torch.equal(state[key], value), key
    assert trainer.step == 0 and trainer.num_classes == 4
    result = trainer.fit()
    assert len(result.losses) == 2 and np.isfinite(result.losses).all()
    moved = trainer.backbone.state_dict()["stem.0.weight"]
    assert not torch.equal(moved, imported["stem.0.weight"])  # and training moved them


def test_errors_name_checkpoint_init_from(imported_r18, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint.init_from='.*nowhere': no such"):
        Trainer(r18_config(tmp_path / "a", tmp_path / "nowhere"), train_set=faces())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"checkpoint.init_from='.*empty': no model there"):
        Trainer(r18_config(tmp_path / "b", tmp_path / "empty"), train_set=faces())
    with pytest.raises(ValueError, match=r"init_from=.* holds a iresnet18, this config builds a "):
        Trainer(r18_config(tmp_path / "c", imported_r18, "model.name=iresnet34"), train_set=faces())
    with pytest.raises(ValueError, match=r"init_from=.* with embedding_dim=32, this config .*=64"):
        Trainer(
            r18_config(tmp_path / "d", imported_r18, "model.embedding_dim=64"), train_set=faces()
        )


def test_a_directory_of_an_export_is_accepted(tmp_path):
    model = build_model("iresnet_tiny", embedding_dim=8, input_size=28, in_channels=1)
    spec = PreprocessingSpec.from_model_config(
        {"name": "iresnet_tiny", "kwargs": {"embedding_dim": 8, "input_size": 28, "in_channels": 1}}
    )
    save_weights(model, tmp_path / "backbone.safetensors", spec)
    spec.save(tmp_path / "preprocessing.json")
    found, model_config = ckpt.resolve_init_from(str(tmp_path))
    assert found == tmp_path
    assert model_config == {"name": "iresnet_tiny", "kwargs": spec.model_kwargs}


def test_a_training_checkpoint_and_a_run_folder_still_resolve(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step-00000007"
    model = build_model("iresnet_tiny", embedding_dim=8, input_size=28, in_channels=1)
    save_backbone(model, {"name": "iresnet_tiny", "kwargs": {"embedding_dim": 8}}, step)
    (step / "meta.json").write_text(json.dumps({"step": 7}))
    for spec in (step, tmp_path / "run"):
        found, config = ckpt.resolve_init_from(str(spec))
        assert found == step and config["name"] == "iresnet_tiny"
    (step / "backbone.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="checkpoint.init_from=.*no backbone.safetensors"):
        ckpt.resolve_init_from(str(step))


def test_resume_from_a_model_directory_points_to_init_from(imported_r18, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint.resume=.*meta.json.*init_from"):
        ckpt.resolve_checkpoint(str(imported_r18), tmp_path)
