"""arcface_torch's MobileFaceNet layout (``arcface_mbf``, ``arcface_mbf_large``)."""

from __future__ import annotations

import torch

from partialfc.models import build_model
from partialfc.models.arcface_mbf import ConvUnit, DepthwiseBottleneck


def test_parameter_counts_match_arcface_torch():
    # InsightFace arcface_torch get_model("mbf") / ("mbf_large"), 512-d: counted from its modules
    assert sum(p.numel() for p in build_model("arcface_mbf").parameters()) == 2_059_520
    assert sum(p.numel() for p in build_model("arcface_mbf_large").parameters()) == 6_314_880


def test_layout_of_the_stem_and_the_global_depthwise_conv():
    model = build_model("arcface_mbf")
    stem2 = model.layers[1].layers[0]
    assert (stem2.in_channels, stem2.out_channels, stem2.groups) == (128, 128, 64)
    assert model.feature_map_size == (7, 7)
    gdc = model.features.layers[0].layers[0]
    assert (gdc.kernel_size, gdc.groups) == ((7, 7), 512)
    assert model.features.layers[2].bias is None
    assert len(model.layers[3].layers) == 4 and len(model.layers[5].layers) == 6


def test_a_bottleneck_is_expand_depthwise_project_plus_identity():
    torch.manual_seed(0)
    block = DepthwiseBottleneck(4, 4, hidden=6, stride=1, residual=True).eval()
    x = torch.randn(2, 4, 5, 5)
    expand, depthwise, project = block.layers
    expected = x + project(depthwise(expand(x)))
    torch.testing.assert_close(block(x), expected)
    assert isinstance(project, ConvUnit) and len(project.layers) == 2  # linear: no PReLU
    assert depthwise.layers[0].groups == 6


def test_other_input_sizes_shape_the_final_kernel_and_train():
    model = build_model("arcface_mbf", embedding_dim=32, input_size=64, in_channels=1).train()
    assert model.features.layers[0].layers[0].kernel_size == (4, 4)
    model(torch.randn(3, 1, 64, 64)).square().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
