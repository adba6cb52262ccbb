"""Backbones: published sizes, output shapes at several input sizes, channels-last, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from partialfc.models import (
    MODELS,
    build_model,
    complexity,
    count_parameters,
    iresnet50,
    iresnet_small,
    mobilefacenet,
)

# ArcFace / InsightFace model-zoo "GFLOPs" at 112×112; these tables count MACs.
PUBLISHED_GMACS = {"iresnet18": 2.6, "iresnet50": 6.3, "iresnet100": 12.1, "iresnet200": 23.5}


def on_meta(name: str, **kwargs) -> nn.Module:
    with torch.device("meta"):
        return build_model(name, **kwargs)


def hook_macs(model: nn.Module, x: torch.Tensor) -> int:
    """Independent count: MACs of every Conv2d and Linear from their output shapes."""
    total = 0

    def conv_hook(m, inp, out):
        nonlocal total
        k = m.kernel_size[0] * m.kernel_size[1] * (m.in_channels // m.groups)
        total += out.numel() * k

    def linear_hook(m, inp, out):
        nonlocal total
        total += out.numel() * m.in_features

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    with torch.no_grad():
        model.eval()(x)
    for h in handles:
        h.remove()
    return total


@pytest.mark.parametrize("name", sorted(PUBLISHED_GMACS))
def test_iresnet_macs_match_published(name):
    c = complexity(on_meta(name))
    # published values are rounded to 0.1 GMAC and also count BN/PReLU: 2% tolerance
    assert c.gmacs == pytest.approx(PUBLISHED_GMACS[name], rel=0.02)
    assert c.gflops == pytest.approx(2 * c.gmacs)


def test_flop_counter_agrees_with_hook_count():
    for name in ("iresnet50", "mobilefacenet"):
        model = on_meta(name)
        expected = hook_macs(model, torch.empty(1, 3, 112, 112, device="meta"))
        assert complexity(model).macs == expected


def test_iresnet50_parameter_count():
    # 43.6M with a 512-d embedding at 112×112 (ArcFace R50); the FC alone is 512·7·7·512 + 512
    model = on_meta("iresnet50")
    assert count_parameters(model) == pytest.approx(43.6e6, rel=0.005)
    assert model.head.fc.weight.shape == (512, 512 * 7 * 7)
    # the final BN1d scale is frozen at 1: one 512-vector is not trainable
    assert count_parameters(model) - count_parameters(model, trainable_only=True) == 512


def test_mobilefacenet_parameter_count_and_macs():
    # Chen et al. 2018: 0.99M parameters, 221M MAdds for the 128-d model at 112×112
    c = complexity(on_meta("mobilefacenet", embedding_dim=128))
    assert c.params == pytest.approx(0.99e6, rel=0.02)
    assert c.gmacs == pytest.approx(0.221, rel=0.02)


def test_iresnet18_half_adds_one_identity_block_per_stage_to_iresnet_small():
    # an IR block with cin = cout = w and stride 1: three BNs (2w each), two 3×3 convs (9w² each)
    # and a PReLU (w): 18w² + 7w parameters, no shortcut
    deep, small = on_meta("iresnet18_half"), on_meta("iresnet_small")
    assert [len(stage) for stage in deep.stages] == [2, 2, 2, 2]
    assert [len(stage) for stage in small.stages] == [1, 1, 1, 1]
    added = sum(18 * w * w + 7 * w for w in (32, 64, 128, 256))
    assert count_parameters(deep) - count_parameters(small) == added == 1_570_080
    assert complexity(deep).gmacs == pytest.approx(0.661, rel=0.002)


@pytest.mark.parametrize(
    "name,widths",
    [("iresnet_small_narrow", (24, 48, 96, 192)), ("iresnet_tiny", (16, 32, 64, 128))],
)
def test_narrower_compact_models_have_their_stated_widths(name, widths):
    model = build_model(name, embedding_dim=256, input_size=64, in_channels=1)
    stage_out = [stage[-1].residual[4].out_channels for stage in model.stages]
    assert tuple(stage_out) == widths
    assert model.head.fc.in_features == widths[-1] * 4 * 4  # 64 / 2⁴
    assert complexity(model).macs == hook_macs(model, torch.empty(1, 1, 64, 64))


@pytest.mark.parametrize(
    "name,input_size,feature_map",
    [("iresnet50", 112, (7, 7)), ("iresnet50", 96, (6, 6)), ("iresnet50", 28, (2, 2))],
)
def test_final_feature_map_follows_input_size(name, input_size, feature_map):
    model = on_meta(name, input_size=input_size)
    assert model.feature_map_size == feature_map


SMALL_MODELS = [
    "iresnet18",
    "iresnet18_half",
    "iresnet_small",
    "iresnet_small_narrow",
    "iresnet_tiny",
    "mobilefacenet",
    "vit_t",
]


@pytest.mark.parametrize("name", SMALL_MODELS)
@pytest.mark.parametrize("input_size,in_channels", [(28, 1), ((112, 96), 3)])
def test_output_shape(name, input_size, in_channels):
    model = build_model(name, embedding_dim=64, input_size=input_size, in_channels=in_channels)
    h, w = (input_size, input_size) if isinstance(input_size, int) else input_size
    out = model.eval()(torch.randn(2, in_channels, h, w))
    assert out.shape == (2, 64)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_shares_the_signature_and_records_its_input(name):
    # the iresnet_tiny_ltp models embed their 256-d network's and their descriptor's components
    dim = 256 + 128 if name.startswith("iresnet_tiny_ltp") else 128
    model = on_meta(name, embedding_dim=dim, input_size=96, in_channels=1, dropout=0.1)
    assert model.input_size == (96, 96)
    assert model.in_channels == 1
    assert model.embedding_dim == dim
    out = model.eval()(torch.empty(3, 1, 96, 96, device="meta"))
    assert out.shape == (3, dim)


def test_channels_last_matches_contiguous():
    model = iresnet_small(input_size=28, in_channels=1).eval()
    x = torch.randn(4, 1, 28, 28)
    ref = model(x)
    model_cl = model.to(memory_format=torch.channels_last)
    out = model_cl(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_training_step_reaches_every_trainable_parameter():
    model = mobilefacenet(embedding_dim=32, input_size=28, in_channels=1, dropout=0.2).train()
    model(torch.randn(4, 1, 28, 28)).square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown model 'resnet50'"):
        build_model("resnet50")
    with pytest.raises(ValueError, match="in_channels"):
        iresnet50(in_channels=2)
    with pytest.raises(ValueError, match="input_size"):
        build_model("vit_t", input_size=0)


def test_fold_linear_map_gives_the_mapped_embedding():
    from partialfc.models.common import fold_linear_map

    torch.manual_seed(0)
    model = build_model("iresnet_small", embedding_dim=8, input_size=32, in_channels=1)
    x = torch.randn(6, 1, 32, 32)
    model.train()
    for _ in range(3):  # non-trivial running statistics in every batch norm
        model(x + torch.randn_like(x))
    with torch.no_grad():
        model.head.features.bias.normal_()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    matrix = np.random.default_rng(1).normal(size=(8, 8))
    folded = fold_linear_map(model, matrix)
    with torch.no_grad():
        expected = model(x).double() @ torch.from_numpy(matrix).T
        got = folded(x).double()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not folded.training
    for k, v in model.state_dict().items():  # the original is untouched
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match=r"\(8, 8\)"):
        fold_linear_map(model, np.eye(7))
    with pytest.raises(ValueError, match="EmbeddingLayer"):
        fold_linear_map(build_model("vit_t", embedding_dim=8, input_size=32), np.eye(8))
