"""Our ONNX export used as an insightface recognition model (skipped without insightface)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_export_loads_through_insightface_model_zoo(tmp_path):
    model_zoo = pytest.importorskip("insightface.model_zoo", reason="insightface not installed")
    from partialfc.deploy import Embedder, PreprocessingSpec
    from partialfc.deploy.export import export_backbone
    from partialfc.models import build_model

    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 64, "input_size": 112}}
    torch.manual_seed(0)
    model = build_model(config["name"], **config["kwargs"]).eval()
    spec = PreprocessingSpec.from_model_config(config)
    result = export_backbone(model, spec, tmp_path)
    recogniser = model_zoo.get_model(str(result.onnx_path), providers=["CPUExecutionProvider"])
    assert type(recogniser).__name__ == "ArcFaceONNX"
    assert recogniser.input_mean == 127.5 and recogniser.input_std == 127.5
    rgb = np.random.default_rng(0).integers(0, 256, (2, 112, 112, 3), dtype=np.uint8)
    theirs = recogniser.get_feat(list(rgb[..., ::-1]))  # insightface takes BGR images
    ours = Embedder.load(tmp_path).embed_raw(rgb)
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
