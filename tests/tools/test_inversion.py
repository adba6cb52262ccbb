"""Model inversion on a small model trained here on real Omniglot classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.data import load_omniglot
from partialfc.losses import ArcFaceMargin, MarginSoftmaxHead
from partialfc.models import IResNet, build_model
from partialfc.tools.inversion import (
    BatchNormPrior,
    ClassCenterTarget,
    EmbeddingTarget,
    InversionConfig,
    invert,
    total_variation,
)

NUM_CLASSES = 10
# ArcFace's inversion (Deng et al., TPAMI 2022): Adam lr 0.25; 200 steps instead of its 20K
SHORT = InversionConfig(steps=200, lr=0.25)


@pytest.fixture(scope="module")
def trained():
    """A compact IResNet trained for 60 ArcFace steps on 10 Omniglot classes (~seconds)."""
    torch.manual_seed(0)
    data = load_omniglot("background")
    keep = data.labels < NUM_CLASSES
    x = (torch.from_numpy(data.images[keep]).float()[:, None] / 255 - 0.5) / 0.5
    y = torch.from_numpy(data.labels[keep])
    model = IResNet((1, 1, 1, 1), (16, 32, 64, 128), 16, 64, 28, 1)
    head = MarginSoftmaxHead(NUM_CLASSES, 64, ArcFaceMargin(margin_rad=0.3, scale=16.0))
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1, momentum=0.9)
    model.train()
    for _ in range(60):
        idx = torch.randint(0, len(y), (64,))
        loss = head(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().zero_grad(set_to_none=True)
    return model, head.weight.detach().clone(), x, y


def test_total_variation_by_hand():
    x = torch.tensor([[[[0.0, 1.0], [2.0, 4.0]]]])
    # vertical diffs 2, 3 -> mean 6.5; horizontal diffs 1, 2 -> mean 2.5
    assert float(total_variation(x)) == pytest.approx(9.0)


def test_bn_prior_is_zero_at_the_running_statistics():
    bn = torch.nn.BatchNorm2d(3).eval()
    bn.running_mean.copy_(torch.tensor([1.0, -2.0, 0.5]))
    bn.running_var.copy_(torch.tensor([4.0, 1.0, 0.25]))
    prior = BatchNormPrior(torch.nn.Sequential(bn))
    x = torch.randn(4096, 3, 4, 4) * (bn.running_var.sqrt()[:, None, None] ** 1)
    x = x + bn.running_mean[:, None, None]
    bn(x)
    assert float(prior.pop()) < 1e-2
    bn(torch.zeros(2, 3, 4, 4))  # mean 0, std sqrt(eps): sum of squared gaps, by hand
    std = torch.sqrt(bn.running_var + bn.eps)
    expected = bn.running_mean.square().sum() + (std - bn.eps**0.5).square().sum()
    assert float(prior.pop()) == pytest.approx(float(expected), rel=1e-5)
    prior.remove()


def test_open_set_inversion_raises_cosine_to_a_given_embedding(trained):
    model, _, x, _ = trained
    with torch.no_grad():
        target = model(x[[5, 25, 45]])  # embeddings of three real drawings
    result = invert(model, EmbeddingTarget(target), SHORT)
    assert result.images.shape == (3, 28, 28) and result.images.dtype == np.uint8
    assert np.all(result.cosine > result.cosine_start)
    assert result.cosine.mean() > result.cosine_start.mean() + 0.5, (
        result.cosine_start,
        result.cosine,
    )
    # the written images (after uint8 rounding) still carry the identity
    back = (torch.from_numpy(result.images).float()[:, None] / 255 - 0.5) / 0.5
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(model(back), target)
    np.testing.assert_allclose(cos.numpy(), result.cosine, atol=0.05)
    assert not model.training  # mode restored
    assert all(p.grad is None for p in model.parameters())  # no side effects on the weights


def test_close_set_inversion_moves_towards_the_class_center(trained):
    model, centers, _, _ = trained
    classes = [0, 3, 7]
    result = invert(model, ClassCenterTarget(centers, classes, scale=16.0), SHORT)
    assert np.all(result.cosine > result.cosine_start)
    assert result.cosine.mean() > result.cosine_start.mean() + 0.25, (
        result.cosine_start,
        result.cosine,
    )
    # the BN statistics prior was reduced by the optimisation
    assert result.history[-1]["bn_prior"] < 0.75 * result.history[0]["bn_prior"]


def test_bn_prior_weight_trades_identity_for_natural_statistics(trained):
    model, centers, _, _ = trained
    target = ClassCenterTarget(centers, [0, 3, 7], scale=16.0)
    config = InversionConfig(steps=100, lr=0.25)
    with_prior = invert(model, target, config)
    without = invert(model, target, InversionConfig(steps=100, lr=0.25, bn_weight=0.0))
    assert with_prior.history[-1]["bn_prior"] < 0.1 * without.history[-1]["bn_prior"]
    assert without.cosine.mean() > with_prior.cosine.mean()


def test_bad_targets_are_clear_errors():
    with pytest.raises(ValueError, match="labels must lie in"):
        ClassCenterTarget(torch.randn(4, 8), [4])
    with pytest.raises(ValueError, match="no BatchNorm2d"):
        BatchNormPrior(torch.nn.Linear(2, 2))


def test_invert_command_writes_images_and_cosines(tmp_path, capsys):
    import json

    import cv2

    from partialfc.backbone.io import save_backbone
    from partialfc.cli import main

    config = {
        "name": "iresnet_small",
        "kwargs": {"embedding_dim": 64, "input_size": 28, "in_channels": 1},
    }
    small = build_model(config["name"], **config["kwargs"])
    (tmp_path / "ckpt").mkdir()
    save_backbone(small.eval(), config, tmp_path / "ckpt")
    face = tmp_path / "face.png"
    cv2.imwrite(str(face), np.full((28, 28), 200, dtype=np.uint8))
    out = tmp_path / "out"
    args = ["invert", str(tmp_path / "ckpt"), "--target-image", str(face), "--out", str(out)]
    assert main([*args, "--steps", "3"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert len(result["cosine"]) == 1 and len(result["history"]) >= 1
    assert cv2.imread(str(out / "inverted_000.png"), cv2.IMREAD_GRAYSCALE).shape == (28, 28)
    assert "cosine to target" in capsys.readouterr().out
    np.save(tmp_path / "centers.npy", np.random.default_rng(0).normal(size=(5, 64)))
    close = ["invert", str(tmp_path / "ckpt"), "--centers", str(tmp_path / "centers.npy")]
    assert main([*close, "--classes", "9", "--out", str(out)]) == 2  # class out of range
    assert "labels must lie in [0, 5)" in capsys.readouterr().err
