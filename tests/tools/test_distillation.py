"""Distillation objective: independent recomputation, zero at agreement, float64 gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from partialfc.losses import ArcFaceMargin, MarginSoftmaxHead
from partialfc.tools.distillation import DistillationLoss


def make(num_classes=6, dim=8, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    head = MarginSoftmaxHead(num_classes, dim, ArcFaceMargin(0.5, 16.0), reuse_buffers=False)
    head = head.to(dtype)
    teacher_centers = torch.randn(num_classes, dim, dtype=dtype)
    return DistillationLoss(head, teacher_centers, **kwargs), head, teacher_centers


def test_terms_match_an_independent_computation():
    loss, head, centers = make()
    s, t = torch.randn(5, 8) * 3, torch.randn(5, 8) * 0.5
    y = torch.tensor([0, 1, 2, 3, 5])
    with torch.no_grad():
        terms = loss.terms(s, t, y)
    cos_st = F.cosine_similarity(s, t)
    assert float(terms["feature"]) == pytest.approx(float((2 - 2 * cos_st).mean()), rel=1e-5)
    w_s = head.weight / head.weight.norm(dim=1, keepdim=True)
    w_t = centers / centers.norm(dim=1, keepdim=True)
    p_s = torch.softmax(16.0 * (s / s.norm(dim=1, keepdim=True)) @ w_s.T, dim=1)
    p_t = torch.softmax(16.0 * (t / t.norm(dim=1, keepdim=True)) @ w_t.T, dim=1)
    kl = (p_t * (p_t.log() - p_s.log())).sum(1).mean().detach()
    assert float(terms["kl"]) == pytest.approx(float(kl), rel=1e-4)
    assert float(terms["head"]) == pytest.approx(float(head(s, y).detach()), rel=1e-6)
    with torch.no_grad():
        total = float(loss(s, t, y))
    expected = float(terms["head"] + 1.0 * terms["feature"] + 0.1 * terms["kl"])
    assert total == pytest.approx(expected, rel=1e-6)


@torch.no_grad()
def test_regression_and_kl_vanish_when_student_equals_teacher():
    loss, head, _ = make()
    loss.teacher_centers.copy_(F.normalize(head.weight.detach(), dim=1))
    s = torch.randn(4, 8)
    terms = loss.terms(s, 2.0 * s, torch.tensor([0, 1, 2, 3]))  # same direction, other norm
    assert float(terms["feature"]) == pytest.approx(0.0, abs=1e-6)
    assert float(terms["kl"]) == pytest.approx(0.0, abs=1e-6)


@torch.no_grad()
def test_temperature_scales_the_kl_weight_by_t_squared():
    loss, _, _ = make(temperature=2.0)
    s, t, y = torch.randn(3, 8), torch.randn(3, 8), torch.tensor([0, 1, 2])
    terms = loss.terms(s, t, y)
    total = terms["head"] + terms["feature"] + 0.1 * 4.0 * terms["kl"]
    assert math.isclose(float(loss(s, t, y)), float(total), rel_tol=1e-6)


def test_gradcheck_float64_with_respect_to_student_embeddings():
    loss, _, _ = make(dtype=torch.float64)
    t = torch.randn(3, 8, dtype=torch.float64)
    y = torch.tensor([0, 2, 4])
    s = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(x, t, y), (s,))


def test_teacher_gets_no_gradient_and_mismatches_are_errors():
    loss, _, _ = make()
    s = torch.randn(2, 8, requires_grad=True)
    t = torch.randn(2, 8, requires_grad=True)
    loss(s, t, torch.tensor([0, 1])).backward()
    assert s.grad is not None and t.grad is None
    with pytest.raises(ValueError, match="feature regression needs the same size"):
        loss.terms(torch.randn(2, 8), torch.randn(2, 4), torch.tensor([0, 1]))
    other, _, _ = make(num_classes=6)
    other.teacher_centers = torch.randn(7, 8)
    with pytest.raises(ValueError, match="needs the same classes"):
        other.terms(torch.randn(2, 8), torch.randn(2, 8), torch.tensor([0, 1]))
