"""Export round trip (onnxruntime vs PyTorch), Embedder loading paths, flip test, spec checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from partialfc.backbone.io import METADATA_KEY
from partialfc.deploy import Embedder, PreprocessingSpec
from partialfc.deploy.export import read_onnx_spec

from .conftest import MODEL_CONFIG


def reference_embeddings(model, images: np.ndarray) -> np.ndarray:
    """Independent path: normalise by hand, run the module, L2-normalise."""
    x = (images.astype(np.float32)[:, None] / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        e = model(torch.from_numpy(x)).numpy()
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_export_writes_three_files_and_reports_ort_difference(exported, small_model):
    report, out = exported
    assert sorted(p.name for p in out.iterdir()) == [
        "backbone.onnx",
        "backbone.safetensors",
        "preprocessing.json",
    ]
    assert report["max_abs_diff"] is not None and report["max_abs_diff"] < 1e-4
    assert report["max_abs_output"] > 0.5  # outputs of real scale, so the check means something
    spec = small_model[1]
    assert PreprocessingSpec.load(out / "preprocessing.json") == spec
    assert read_onnx_spec(out / "backbone.onnx") == spec
    with safe_open(str(out / "backbone.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()[METADATA_KEY])["model_name"] == "iresnet_small"


def test_onnx_and_torch_embedders_agree_at_another_batch_size(
    exported, small_model, omniglot_images
):
    _, out = exported
    images = omniglot_images[0][:7]  # exported with batch 2, checked with 3: dynamic axis
    expected = reference_embeddings(small_model[0], images)
    from_dir = Embedder.load(out).embed(images)
    from_onnx = Embedder.load(out / "backbone.onnx").embed(images)
    from_dir_onnx = Embedder.load(out, backend="onnx").embed(images, batch_size=4)
    np.testing.assert_allclose(from_dir, expected, atol=1e-6)
    np.testing.assert_allclose(from_onnx, expected, atol=1e-5)
    np.testing.assert_allclose(from_dir_onnx, expected, atol=1e-5)
    assert from_dir.dtype == np.float32 and from_dir.shape == (7, 64)


def test_flip_test_sums_raw_embeddings_before_normalising(small_model, omniglot_images):
    model, spec = small_model
    images = omniglot_images[0][20:25]
    x = (images.astype(np.float32)[:, None] / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        raw = model(torch.from_numpy(x)) + model(torch.from_numpy(x[..., ::-1].copy()))
    expected = torch.nn.functional.normalize(raw, dim=1).numpy()
    got = Embedder.from_module(model, spec).embed(images, flip=True, batch_size=2)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert not np.allclose(got, Embedder.from_module(model, spec).embed(images), atol=1e-3)


def test_training_checkpoint_loads_directly(small_model, omniglot_images, tmp_path):
    from partialfc.backbone.io import save_backbone

    model, _ = small_model
    save_backbone(model, MODEL_CONFIG, tmp_path)
    images = omniglot_images[0][:4]
    got = Embedder.load(tmp_path).embed(images)
    np.testing.assert_allclose(got, reference_embeddings(model, images), atol=1e-6)


def test_preprocessing_converts_channels_and_rejects_wrong_sizes():
    rgb = PreprocessingSpec.from_model_config({"name": "iresnet18", "kwargs": {"input_size": 4}})
    grey = np.full((2, 4, 4), 255, dtype=np.uint8)
    x = rgb.preprocess(grey)
    assert x.shape == (2, 3, 4, 4) and np.all(x == 1.0)
    spec1 = PreprocessingSpec.from_model_config(
        {"name": "iresnet18", "kwargs": {"input_size": 4, "in_channels": 1}}
    )
    colour = np.zeros((1, 4, 4, 3), dtype=np.uint8)
    colour[..., 1] = 255  # pure green -> luma 0.587
    np.testing.assert_allclose(spec1.preprocess(colour), (0.587 - 0.5) / 0.5, atol=1e-6)
    with pytest.raises(ValueError, match="expects 4×4"):
        rgb.preprocess(np.zeros((1, 5, 5, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        rgb.preprocess(np.zeros((1, 4, 4, 3), dtype=np.float32))


def test_bad_model_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model"):
        Embedder.load(tmp_path / "missing")
    (tmp_path / "preprocessing.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="preprocessing.json: not a partialfc.preprocessing"):
        Embedder.load(tmp_path)
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(ValueError, match="model.onnx: cannot load ONNX"):
        Embedder.load(bad)
