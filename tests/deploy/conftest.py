"""A small backbone with realistic BatchNorm statistics, on real Omniglot images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.data import load_omniglot
from partialfc.deploy import PreprocessingSpec
from partialfc.models import build_model

MODEL_CONFIG = {
    "name": "iresnet_small",
    "kwargs": {"embedding_dim": 64, "input_size": 28, "in_channels": 1},
}


@pytest.fixture(scope="session")
def omniglot_images() -> tuple[np.ndarray, np.ndarray]:
    """The first 100 background classes: uint8 (2000, 28, 28), labels (2000,)."""
    data = load_omniglot("background")
    keep = data.labels < 100
    return data.images[keep], data.labels[keep]


@pytest.fixture(scope="session")
def small_model(omniglot_images):
    """iresnet_small whose BN running statistics come from real images (outputs of unit scale)."""
    torch.manual_seed(0)
    model = build_model(MODEL_CONFIG["name"], **MODEL_CONFIG["kwargs"])
    spec = PreprocessingSpec.from_model_config(MODEL_CONFIG)
    images = omniglot_images[0]
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = None  # cumulative average of the batches below
    model.train()
    with torch.no_grad():
        for start in range(0, 1000, 250):
            model(torch.from_numpy(spec.preprocess(images[start : start + 250])))
    return model.eval(), spec


@pytest.fixture(scope="session")
def checkpoint(small_model, tmp_path_factory):
    """A training-checkpoint directory (backbone.safetensors + model.json) of small_model."""
    from partialfc.backbone.io import save_backbone

    path = tmp_path_factory.mktemp("ckpt")
    save_backbone(small_model[0], MODEL_CONFIG, path)
    return path


@pytest.fixture(scope="session")
def exported(checkpoint, tmp_path_factory):
    """``partialfc export`` of the checkpoint (the one ONNX export of the suite): (report, dir)."""
    import contextlib
    import io
    import json

    from partialfc.cli import main

    out = tmp_path_factory.mktemp("export")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["export", str(checkpoint), str(out)]) == 0
    return json.loads(stdout.getvalue()), out
