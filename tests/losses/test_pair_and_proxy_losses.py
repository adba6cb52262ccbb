"""Contrastive loss, ProxyNCA and the ArcFace-paper angular penalties: independent loops over
pairs/classes, float64 gradcheck, finite gradients at coincident vectors, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from partialfc.losses.contrastive import ContrastiveLoss
from partialfc.losses.penalties import inter_angular_penalty, intra_angular_penalty
from partialfc.losses.proxy_nca import ProxyNCALoss


def _batch(seed=0, n=9, dim=5, num_classes=3):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, dim, generator=g, dtype=torch.float64),
        torch.arange(n) % num_classes,
    )


def test_contrastive_equals_pair_loop():
    x, labels = _batch()
    u = F.normalize(x, dim=1)
    pulls, pushes = [], []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            dist = torch.linalg.vector_norm(u[i] - u[j])
            if labels[i] == labels[j]:
                pulls.append(0.5 * dist**2)
            else:
                pushes.append(0.5 * torch.clamp(1.2 - dist, min=0) ** 2)
    expected = torch.stack(pulls).mean() + torch.stack(pushes).mean()
    loss_fn = ContrastiveLoss(margin=1.2)
    torch.testing.assert_close(loss_fn(x, labels), expected)
    stats = loss_fn.last_stats
    assert (stats.num_positive_pairs, stats.num_negative_pairs) == (len(pulls), len(pushes))
    assert stats.num_active_negatives == sum(int(p > 0) for p in pushes)


def test_contrastive_hand_numbers_on_the_seed_vectors():
    # a = (0.6, 0.8), p = (0.8, 0.6): D^2 = 0.08 -> pull 0.04; a vs n = (0.28, 0.96): D^2 = 0.128
    x = torch.tensor([[0.6, 0.8], [0.8, 0.6], [0.28, 0.96]], dtype=torch.float64)
    loss = ContrastiveLoss(margin=1.0)(x, torch.tensor([0, 0, 1]))
    push_an = 0.5 * (1 - math.sqrt(0.128)) ** 2
    push_pn = 0.5 * (1 - math.sqrt(0.4)) ** 2
    assert loss.item() == pytest.approx(0.04 + (push_an + push_pn) / 2, abs=1e-12)


def test_gradcheck_contrastive_and_proxy_nca():
    x, labels = _batch(seed=1)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: ContrastiveLoss(1.0)(x, labels), (x,))
    head = ProxyNCALoss(3, 5, scale=2.0).double()
    proxies = head.proxies.detach().clone().requires_grad_(True)

    def loss_of(x, proxies):
        return torch.func.functional_call(head, {"proxies": proxies}, (x, labels))

    assert torch.autograd.gradcheck(loss_of, (x, proxies))


def test_coincident_vectors_give_finite_gradients():
    x = torch.ones(4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1])
    (grad,) = torch.autograd.grad(ContrastiveLoss(1.0)(x, labels), x)
    assert torch.isfinite(grad).all()
    proxy = ProxyNCALoss(2, 3).double()
    with torch.no_grad():
        proxy.proxies.copy_(torch.ones(2, 3))
    loss = proxy(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(proxy.proxies.grad).all()


def test_proxy_nca_equals_class_loop():
    x, labels = _batch(seed=2, num_classes=4)
    loss_fn = ProxyNCALoss(4, 5, scale=3.0).double()
    u = F.normalize(x, dim=1)
    p = F.normalize(loss_fn.proxies.detach(), dim=1)
    losses = []
    for i, y in enumerate(labels.tolist()):
        d = [torch.sum((u[i] - p[z]) ** 2) for z in range(4)]
        numerator = torch.exp(-3.0 * d[y])
        denominator = sum(torch.exp(-3.0 * d[z]) for z in range(4) if z != y)
        losses.append(-torch.log(numerator / denominator))
    torch.testing.assert_close(loss_fn(x, labels), torch.stack(losses).mean())
    nearest = sum(int(torch.argmax(u[i] @ p.T) == labels[i]) for i in range(len(labels)))
    assert loss_fn.last_stats.num_nearest_own_proxy == nearest


def test_angular_penalties_by_hand_and_gradcheck():
    # intra: mean angle / pi; angles 0 and 90 deg -> (0 + pi/2) / 2 / pi = 0.25
    target_cos = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert intra_angular_penalty(target_cos).item() == pytest.approx(0.25, abs=1e-7)
    # inter: 3 centers at 0, 90, 180 deg in a plane; class 0 sees 90 and 180 deg
    centers = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    rows = torch.tensor([0, 0, 1])
    # class 0: -(pi/2 + pi) / (2 pi) = -0.75 ; class 1: -(pi/2 + pi/2) / (2 pi) = -0.5
    expected = -(2 * 0.75 + 0.5) / 3
    assert inter_angular_penalty(centers, rows).item() == pytest.approx(expected, abs=1e-7)
    centers = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([0, 3, 3, 1])
    assert torch.autograd.gradcheck(lambda c: inter_angular_penalty(c, rows), (centers,))
    cos = torch.tensor([0.3, -0.99, 0.999], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(intra_angular_penalty, (cos,))


def test_angular_penalties_finite_when_centers_coincide():
    centers = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    penalty = inter_angular_penalty(centers, torch.tensor([0, 1]))
    (grad,) = torch.autograd.grad(penalty, centers)
    assert torch.isfinite(penalty) and torch.isfinite(grad).all()


def test_bad_input():
    with pytest.raises(ValueError, match="margin"):
        ContrastiveLoss(margin=0.0)
    with pytest.raises(ValueError, match="margin"):
        ContrastiveLoss(margin=2.5)
    with pytest.raises(ValueError, match="num_classes"):
        ProxyNCALoss(1, 4)
    with pytest.raises(ValueError, match="scale"):
        ProxyNCALoss(3, 4, scale=0.0)
    with pytest.raises(ValueError, match="labels"):
        ProxyNCALoss(3, 4)(torch.randn(2, 4), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="embeddings"):
        ProxyNCALoss(3, 4)(torch.randn(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="target_rows"):
        inter_angular_penalty(torch.randn(3, 2), torch.tensor([3]))
