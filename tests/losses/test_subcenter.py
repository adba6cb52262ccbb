"""Sub-center max: class-major layout, argmax, gradient routing, validation."""

from __future__ import annotations

import pytest
import torch

from partialfc.losses.subcenter import max_over_subcenters


def test_class_major_max_and_argmax():
    # 2 classes x 3 sub-centers: columns 0..2 are class 0, 3..5 are class 1
    cos = torch.tensor([[0.1, 0.9, 0.2, -0.5, -0.1, -0.3], [0.7, 0.0, 0.8, 0.4, 0.6, 0.5]])
    max_cos, argmax = max_over_subcenters(cos, 3)
    torch.testing.assert_close(max_cos, torch.tensor([[0.9, -0.1], [0.8, 0.6]]))
    assert argmax.tolist() == [[1, 1], [2, 1]]


def test_matches_loop_reference():
    cos = torch.randn(5, 7 * 4)
    max_cos, argmax = max_over_subcenters(cos, 4)
    for i in range(5):
        for c in range(7):
            block = cos[i, c * 4 : c * 4 + 4]
            assert max_cos[i, c] == block.max()
            assert argmax[i, c] == int(block.argmax())


def test_transposed_layout_gives_the_transposed_result():
    # Partial FC keeps scores as (N*K, B): class_dim=0 must equal the (B, N*K) result, transposed
    cos = torch.tensor([[0.1, 0.9, 0.2, -0.5, -0.1, -0.3], [0.7, 0.0, 0.8, 0.4, 0.6, 0.5]])
    max_t, argmax_t = max_over_subcenters(cos.t().contiguous(), 3, class_dim=0)
    torch.testing.assert_close(max_t, torch.tensor([[0.9, 0.8], [-0.1, 0.6]]))
    assert argmax_t.tolist() == [[1, 2], [1, 1]]
    with pytest.raises(ValueError, match="dim 0, not a multiple of num_subcenters=4"):
        max_over_subcenters(cos.t().contiguous(), 4, class_dim=0)
    with pytest.raises(ValueError, match="class_dim must be 0 or 1"):
        max_over_subcenters(cos, 3, class_dim=2)


def test_single_subcenter_is_identity():
    cos = torch.randn(3, 4)
    max_cos, argmax = max_over_subcenters(cos, 1)
    assert torch.equal(max_cos, cos)
    assert torch.equal(argmax, torch.zeros(3, 4, dtype=torch.long))


def test_gradient_goes_to_dominant_subcenter_only():
    cos = torch.tensor([[0.1, 0.9, 0.2, -0.5]], requires_grad=True)
    max_cos, _ = max_over_subcenters(cos, 2)
    max_cos.sum().backward()
    assert cos.grad.tolist() == [[0.0, 1.0, 1.0, 0.0]]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_subcenters"):
        max_over_subcenters(torch.zeros(2, 6), 4)
    with pytest.raises(ValueError, match="num_subcenters"):
        max_over_subcenters(torch.zeros(2, 6), 0)
    with pytest.raises(ValueError, match="cos"):
        max_over_subcenters(torch.zeros(6), 2)
