"""The backbone's one weight format, pixel normalisation and embedding loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.backbone.embedding import as_nchw, embed_array, l2_normalize, run_backbone
from partialfc.backbone.io import (
    load_backbone_from_checkpoint,
    newest_checkpoint,
    save_backbone,
)
from partialfc.backbone.pixels import normalize_batch
from partialfc.backbone.spec import LUMA_WEIGHTS, PreprocessingSpec
from partialfc.models import MODELS, build_model, register_model

CONFIG = {
    "name": "iresnet_small",
    "kwargs": {"embedding_dim": 8, "input_size": 28, "in_channels": 1},
}


def test_normalize_batch_values():
    x = torch.tensor([0, 255, 51], dtype=torch.uint8).view(1, 1, 1, 3)
    np.testing.assert_allclose(normalize_batch(x).flatten().numpy(), [-1.0, 1.0, -0.6], atol=1e-6)
    assert normalize_batch(x).dtype == torch.float32


@pytest.mark.parametrize("channels, given", [(3, 3), (3, 1), (1, 1), (1, 3)])
def test_the_spec_normalises_exactly_as_training_does(channels, given):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 6, 5, given), dtype=np.uint8)
    spec = PreprocessingSpec("m", embedding_dim=8, input_size=(6, 5), in_channels=channels,
                             colour_order="RGB" if channels == 3 else "GREY",
                             mean=(0.5,) * channels, std=(0.5,) * channels)  # fmt: skip
    x = spec.preprocess(images)
    # NumPy reference: / 255, channel conversion, (x - mean) / std, channels first
    ref = images.astype(np.float32) / 255.0
    if channels == 3 and given == 1:
        ref = np.repeat(ref, 3, axis=-1)
    elif channels == 1 and given == 3:
        ref = (ref @ LUMA_WEIGHTS)[..., None]
    ref = ((ref - np.float32(0.5)) / np.float32(0.5)).transpose(0, 3, 1, 2)
    assert x.dtype == np.float32 and x.shape == (4, channels, 6, 5)
    assert np.array_equal(x, ref)
    if channels == given:  # the training normalisation of the same pixels, bit for bit
        batch = torch.from_numpy(images).permute(0, 3, 1, 2)
        assert np.array_equal(x, normalize_batch(batch).numpy())


def test_the_embedding_loop_restores_the_mode_and_the_callers_grad_mode():
    torch.manual_seed(0)
    model = build_model("iresnet_small", embedding_dim=8, input_size=28, in_channels=1).train()
    images = np.random.default_rng(1).integers(0, 256, (10, 28, 28), dtype=np.uint8)
    batches = run_backbone(model, [torch.from_numpy(images[:, None])])
    first = next(batches)
    assert torch.is_grad_enabled() and not model.training  # suspended inside the loop
    with pytest.raises(StopIteration):
        next(batches)
    assert model.training
    out = embed_array(model, images, batch_size=3)
    assert out.shape == (10, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, first.numpy(), rtol=1e-5, atol=1e-6)  # batching aside
    with torch.no_grad():
        direct = model.eval()(normalize_batch(as_nchw(images))).numpy()
    assert np.array_equal(embed_array(model, images, batch_size=10), direct)
    norms = np.linalg.norm(l2_normalize(out), axis=1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    assert np.array_equal(l2_normalize(np.zeros((2, 3))), np.zeros((2, 3), np.float32))


def test_as_nchw_reads_every_layout():
    grey = np.zeros((2, 5, 6), np.uint8)
    rgb = np.zeros((2, 5, 6, 3), np.uint8)
    chw = np.zeros((2, 3, 5, 6), np.uint8)
    shapes = [tuple(as_nchw(a).shape) for a in (grey, rgb, chw)]
    assert shapes == [(2, 1, 5, 6), (2, 3, 5, 6), (2, 3, 5, 6)]


def test_a_saved_backbone_reloads_from_its_checkpoint_or_run_folder(tmp_path):
    torch.manual_seed(0)
    model = build_model(CONFIG["name"], **CONFIG["kwargs"])
    for step in (3, 12):
        save_backbone(model, CONFIG, tmp_path / "run" / "checkpoints" / f"step-{step:08d}")
    (tmp_path / "run" / "checkpoints" / "step-99").mkdir()  # not a checkpoint name
    newest = tmp_path / "run" / "checkpoints" / "step-00000012"
    assert newest_checkpoint(tmp_path / "run") == newest
    assert newest_checkpoint(tmp_path / "run" / "checkpoints") == newest
    assert newest_checkpoint(newest) == newest
    assert newest_checkpoint(tmp_path) is None
    loaded, config = load_backbone_from_checkpoint(tmp_path / "run")
    assert config == CONFIG and not loaded.training
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_backbone_from_checkpoint(tmp_path / "empty")


def test_register_model_adds_a_name_that_build_model_knows():
    @register_model("test_linear_8")
    def build(embedding_dim=8, input_size=4, in_channels=1, dropout=0.0):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, embedding_dim))

    try:
        assert isinstance(build_model("test_linear_8", embedding_dim=8), torch.nn.Sequential)
        assert register_model("test_linear_8")(build) is build  # the same builder again: fine
        with pytest.raises(ValueError, match="already registered"):
            register_model("test_linear_8")(lambda **kwargs: None)
    finally:
        del MODELS["test_linear_8"]


def test_one_flip_loop_serves_the_embedder_and_evaluation():
    from partialfc.backbone.embedder import Embedder
    from partialfc.backbone.embedding import embed_in_batches
    from partialfc.eval.embedding import embed_images

    torch.manual_seed(0)
    model = build_model(CONFIG["name"], **CONFIG["kwargs"])
    embedder = Embedder.from_module(model, PreprocessingSpec.from_model_config(CONFIG))
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    # independently: one image at a time, the mirror taken by hand
    expected = np.stack(
        [
            embed_array(model, images[i : i + 1]) + embed_array(model, images[i : i + 1, :, ::-1])
            for i in range(5)
        ]
    )[:, 0]
    raw = embedder.embed_raw(images, flip=True, batch_size=2)
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-5)
    evaluated = embed_images(embedder._raw, images, flip=True, batch_size=2, normalize=False)
    np.testing.assert_array_equal(evaluated, raw)
    assert embed_in_batches(embedder._raw, images, batch_size=3).shape == (5, 8)
    with pytest.raises(ValueError, match="returned shape"):
        embed_in_batches(lambda b: np.zeros((1, 8)), images, batch_size=2)


def test_the_spec_records_the_alignment_landmarks(tmp_path):
    points = [[20.8, 25.6], [43.9, 25.0], [32.4, 38.8], [22.7, 50.8], [42.8, 50.4]]
    spec = PreprocessingSpec("m", embedding_dim=8, input_size=(64, 64), in_channels=1,
                             colour_order="GREY", mean=(0.5,), std=(0.5,),
                             alignment_landmarks=points)  # fmt: skip
    spec.save(tmp_path / "preprocessing.json")
    back = PreprocessingSpec.load(tmp_path / "preprocessing.json")
    assert back == spec and np.array_equal(np.asarray(back.alignment_landmarks), points)
    plain = PreprocessingSpec.from_model_config(CONFIG)  # not stated: None, and no key written
    assert plain.alignment_landmarks is None and "alignment_landmarks" not in plain.to_dict()
    assert PreprocessingSpec.from_dict(plain.to_dict()) == plain
    outside = [*points[:4], [70.0, 50.0]]
    for bad in (points[:4], outside, [[1, 2], [3]], "five points", [[np.nan, 1.0]] * 5):
        with pytest.raises(ValueError, match="alignment_landmarks"):
            PreprocessingSpec("m", embedding_dim=8, input_size=(64, 64), in_channels=1,
                              colour_order="GREY", mean=(0.5,), std=(0.5,),
                              alignment_landmarks=bad)  # fmt: skip
