"""arcface_torch's ViT layout (``arcface_vit_*``)."""

from __future__ import annotations

import pytest
import torch

from partialfc.models import build_model
from partialfc.models.arcface_vit import Attention


def _on_meta(name, **kwargs):
    with torch.device("meta"):
        return build_model(name, **kwargs)


@pytest.mark.parametrize(
    "name,dim,depth,rate",
    [
        ("arcface_vit_t", 256, 12, 0.1),
        ("arcface_vit_t_dp005", 256, 12, 0.05),
        ("arcface_vit_s", 512, 12, 0.1),
        ("arcface_vit_b_dp005", 512, 24, 0.05),
        ("arcface_vit_l_dp005", 768, 24, 0.05),
        ("arcface_vit_h", 1024, 48, 0.1),
    ],
)
def test_sizes_and_stochastic_depth(name, dim, depth, rate):
    model = _on_meta(name)
    assert model.pos_embed.shape == (1, 144, dim)  # 12 × 12 patches of 9 px at 112
    assert len(model.blocks) == depth
    assert model.blocks[0].drop_path.p == 0.0
    assert model.blocks[-1].drop_path.p == pytest.approx(rate)
    assert model.feature[0].weight.shape == (dim, 144 * dim)
    assert model.feature[1].eps == 2e-5 and model.feature[3].eps == 2e-5


def test_vit_t_parameter_count_matches_arcface_torch():
    # InsightFace arcface_torch get_model("vit_t"), 512-d, less its training-only mask_token
    assert sum(p.numel() for p in build_model("arcface_vit_t").parameters()) == 19_137_792 - 256


def test_attention_is_the_softmax_formula_without_qkv_bias():
    torch.manual_seed(0)
    attn = Attention(16, 4).eval()
    assert attn.qkv.bias is None
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).reshape(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # √(16 / 4) = 2
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_mlp_is_relu6_and_a_training_step_reaches_every_parameter():
    model = build_model("arcface_vit_t", embedding_dim=16, input_size=36, in_channels=1).train()
    assert isinstance(model.blocks[0].mlp.act, torch.nn.ReLU6)
    model(torch.randn(3, 1, 36, 36)).square().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="smaller than the 9-pixel patch"):
        build_model("arcface_vit_t", input_size=8)
