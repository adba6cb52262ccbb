"""``train.channels_last``: the backbone trains in NHWC memory and saves in the plain layout.

Channels-last changes only the memory order of the weights and activations: in float64 the
IResNet's loss gradients are the plain layout's to rounding (in float32 both layouts are about
5e-4 away from the float64 gradients on Omniglot drawings, whose near-constant background makes
batch norm ill-conditioned, so float32 runs are compared by format, not by value). The checkpoint
stores plain contiguous tensors that reload into a freshly built model, and a resume continues
in NHWC bit for bit.
"""

from __future__ import annotations

import torch

from partialfc.backbone.io import load_backbone_from_checkpoint
from partialfc.models.iresnet import iresnet_small
from partialfc.train.engine import Trainer
from tests.train.helpers import TINY_CNN_CONFIG, omniglot_subset, tiny_cnn, tiny_config

CONV_WEIGHT = "net.4.weight"  # 32 input channels: NHWC differs from NCHW


def _trainer(run_dir, *extra):
    cfg = tiny_config(run_dir, "model.embedding_dim=32", "data.batch_size=20",
                      "train.epochs=0.3", "optim.lr=0.2", *extra)  # fmt: skip
    return Trainer(cfg, backbone=tiny_cnn(0), model_config=TINY_CNN_CONFIG,
                   train_set=omniglot_subset(10))  # fmt: skip


def _nhwc(tensor):
    return tensor.is_contiguous(memory_format=torch.channels_last) and not tensor.is_contiguous()


def test_iresnet_gradients_do_not_depend_on_the_layout_in_float64():
    images = omniglot_subset(2).images[:8]
    x = torch.as_tensor(images, dtype=torch.float64).reshape(8, 1, 28, 28) / 127.5 - 1.0
    weights = torch.randn(8, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for channels_last in (False, True):
        torch.manual_seed(0)
        model = iresnet_small(embedding_dim=64, input_size=28, in_channels=1).double()
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        (model(x) * weights).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert _nhwc(dict(model.named_parameters())["stages.1.0.residual.1.weight"])
    assert len(grads[0]) == len(grads[1]) > 20
    for name, grad in grads[0].items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        assert (grads[1][name] - grad).abs().max().item() <= 1e-10 * max(scale, 1.0), name


def test_channels_last_trains_in_nhwc_and_saves_plain_tensors(tmp_path):
    plain = _trainer(tmp_path / "plain")
    nhwc = _trainer(tmp_path / "nhwc", "train.channels_last=true")
    assert not _nhwc(plain.backbone.state_dict()[CONV_WEIGHT])
    assert _nhwc(nhwc.backbone.state_dict()[CONV_WEIGHT])
    start = nhwc.backbone.state_dict()[CONV_WEIGHT].clone()
    result = nhwc.fit()
    trained = nhwc.backbone.state_dict()
    assert _nhwc(trained[CONV_WEIGHT])  # still NHWC after the optimizer steps
    assert (trained[CONV_WEIGHT] - start).abs().max() > 1e-3  # the weights moved

    reloaded, _ = load_backbone_from_checkpoint(result.last_checkpoint)
    state = reloaded.state_dict()
    assert not _nhwc(state[CONV_WEIGHT])
    for key, value in trained.items():
        assert torch.equal(state[key], value), key


def test_resume_keeps_channels_last_and_matches_the_uninterrupted_run(tmp_path):
    whole = _trainer(tmp_path / "whole", "train.channels_last=true")
    whole.fit()
    first = _trainer(tmp_path / "parts", "train.channels_last=true", "train.epochs=0.1")
    checkpoint = first.fit().last_checkpoint
    second = _trainer(tmp_path / "parts2", "train.channels_last=true",
                      f"checkpoint.resume={checkpoint}")  # fmt: skip
    assert _nhwc(second.backbone.state_dict()[CONV_WEIGHT])
    second.fit()
    for key, value in whole.backbone.state_dict().items():
        assert torch.equal(second.backbone.state_dict()[key], value), key
