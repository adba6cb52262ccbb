"""Triplet loss (FaceNet, Schroff et al., CVPR 2015): a hand-worked triplet, brute-force
references for every mining mode, the semi-hard band, chunking, float64 gradcheck and bad input."""

from __future__ import annotations

import math

import pytest
import torch

import partialfc.losses.triplet as triplet_module
from partialfc.losses.margins import angle_from_cos
from partialfc.losses.triplet import TripletLoss, squared_distances

A, P, N2 = (0.6, 0.8), (0.8, 0.6), (0.28, 0.96)  # worked by hand; n2 sits 20.61 deg from a


def test_worked_triplet_distances_and_angle():
    x = torch.tensor([A, P, N2], dtype=torch.float64)
    d = squared_distances(x)
    assert d[0, 1].item() == pytest.approx(0.08, abs=1e-12)
    assert math.degrees(angle_from_cos(x[0] @ x[1]).item()) == pytest.approx(16.26, abs=5e-3)
    assert math.degrees(angle_from_cos(x[0] @ x[2]).item()) == pytest.approx(20.61, abs=5e-3)
    assert d[0, 2].item() == pytest.approx(0.128, abs=1e-12)


@pytest.mark.parametrize("mining", ["all", "semihard", "batch_hard"])
def test_worked_triplet_loss_and_one_step(mining):
    labels = torch.tensor([0, 0, 1])
    loss_fn = TripletLoss(margin=0.2, mining=mining)
    x = torch.tensor([A, P, N2], dtype=torch.float64)
    # (a, p, n2): 0.08 - 0.128 + 0.2 = 0.152 is semi-hard; (p, a, n2): 0.08 - 0.4 + 0.2 < 0
    assert loss_fn(x, labels).item() == pytest.approx(0.152, abs=1e-12)
    assert loss_fn.last_stats.num_triplets == 2 and loss_fn.last_stats.num_active == 1
    assert loss_fn.last_stats.active_fraction == 0.5
    # one step by hand (eta = 0.05 on the plain quadratic): a -> 49.51, p -> 38.49,
    # n -> 75.75 deg; the loss falls by 80%
    a, p, n = (torch.tensor(v, dtype=torch.float64) for v in (A, P, N2))
    a2, p2, n2 = a - 0.1 * (n - p), p - 0.1 * (p - a), n - 0.1 * (a - n)
    degrees = [math.degrees(math.atan2(v[1], v[0])) for v in (a2, p2, n2)]
    assert degrees == pytest.approx([49.51, 38.49, 75.75], abs=0.02)
    after = loss_fn(torch.stack([a2, p2, n2]), labels).item()
    assert 1 - after / 0.152 == pytest.approx(0.80, abs=0.01)


def _batch(seed=0, num_classes=4, per_class=4, dim=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    centers = torch.randn(num_classes, dim, generator=g, dtype=dtype)
    x = centers[labels] + 0.9 * torch.randn(len(labels), dim, generator=g, dtype=dtype)
    return x, labels


def _brute_force_all(x, labels, margin, soft):
    """Every (a, p, n) by three nested loops: returns (sum of losses, #triplets, #active)."""
    d = squared_distances(x)
    total, count, active = x.new_zeros(()), 0, 0
    for a in range(len(labels)):
        for p in range(len(labels)):
            if p == a or labels[p] != labels[a]:
                continue
            for n in range(len(labels)):
                if labels[n] == labels[a]:
                    continue
                z = d[a, p] - d[a, n]
                loss = torch.nn.functional.softplus(z) if soft else torch.relu(z + margin)
                total = total + loss
                count += 1
                active += int((z > 0) if soft else (z + margin > 0))
    return total, count, active


@pytest.mark.parametrize("soft", [False, True])
def test_all_mining_equals_brute_force_value_and_gradient(soft):
    x, labels = _batch()
    x_ref = x.clone().requires_grad_(True)
    total, count, active = _brute_force_all(x_ref, labels, 0.2, soft)
    expected = total / (count if soft else active)
    expected.backward()
    x = x.requires_grad_(True)
    loss_fn = TripletLoss(0.2, "all", soft_margin=soft)
    loss = loss_fn(x, labels)
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    assert (loss_fn.last_stats.num_triplets, loss_fn.last_stats.num_active) == (count, active)


def test_all_mining_chunking_does_not_change_the_result(monkeypatch):
    x, labels = _batch(seed=5, num_classes=5, per_class=5)
    x.requires_grad_(True)
    whole = TripletLoss(0.2, "all")(x, labels)
    (grad_whole,) = torch.autograd.grad(whole, x)
    monkeypatch.setattr(triplet_module, "_CHUNK_ELEMENTS", 7 * 25)  # 7 pairs per chunk
    chunked = TripletLoss(0.2, "all")(x, labels)
    (grad_chunked,) = torch.autograd.grad(chunked, x)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_chunked, grad_whole, rtol=1e-12, atol=1e-14)


def test_batch_hard_equals_brute_force():
    x, labels = _batch(seed=1, num_classes=5, per_class=3)
    d = squared_distances(x)
    z = []  # d_ap - d_an for each anchor's farthest positive and nearest negative
    for a in range(len(labels)):
        d_ap = max(d[a, p] for p in range(len(labels)) if p != a and labels[p] == labels[a])
        d_an = min(d[a, n] for n in range(len(labels)) if labels[n] != labels[a])
        z.append(d_ap - d_an)
    z = torch.stack(z)
    losses = torch.relu(z + 0.2)
    loss_fn = TripletLoss(0.2, "batch_hard")
    torch.testing.assert_close(loss_fn(x, labels), losses.sum() / (losses > 0).sum())
    loss_fn.average_over_active = False
    torch.testing.assert_close(loss_fn(x, labels), losses.mean())
    soft = TripletLoss(0.2, "batch_hard", soft_margin=True)
    torch.testing.assert_close(soft(x, labels), torch.log1p(torch.exp(z)).mean())


def test_semihard_picks_satisfy_the_band_or_fall_back_to_the_hardest_negative():
    x, labels = _batch(seed=2, num_classes=6, per_class=5, dim=4)
    loss_fn = TripletLoss(0.2, "semihard")
    mined = loss_fn.mine(x, labels)
    d = squared_distances(x)
    num_pairs = sum(int((labels == c).sum()) * (int((labels == c).sum()) - 1) for c in range(6))
    assert mined.anchors.numel() == num_pairs  # every anchor-positive pair, once
    assert 0 < int(mined.in_band.sum()) < num_pairs  # both branches are exercised here
    for a, p, n, in_band in zip(
        mined.anchors, mined.positives, mined.negatives, mined.in_band, strict=True
    ):
        assert labels[a] == labels[p] and a != p and labels[n] != labels[a]
        negatives = [m for m in range(len(labels)) if labels[m] != labels[a]]
        band = [m for m in negatives if d[a, p] < d[a, m] < d[a, p] + 0.2]
        if in_band:
            assert d[a, p] < d[a, n] < d[a, p] + 0.2
            assert d[a, n] == min(d[a, m] for m in band)  # the hardest inside the band
        else:
            assert band == []
            assert d[a, n] == min(d[a, m] for m in negatives)  # fallback: hardest negative
    stats_loss = loss_fn(x, labels)
    assert loss_fn.last_stats.num_semihard == int(mined.in_band.sum())
    d_ap = d[mined.anchors, mined.positives]
    d_an = d[mined.anchors, mined.negatives]
    losses = torch.relu(d_ap - d_an + 0.2)
    torch.testing.assert_close(stats_loss, losses.sum() / (losses > 0).sum())


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("mining", ["all", "semihard", "batch_hard"])
def test_gradcheck_float64(mining, soft):
    x, labels = _batch(seed=3, num_classes=3, per_class=3, dim=4)
    x.requires_grad_(True)
    loss_fn = TripletLoss(0.2, mining, soft_margin=soft)
    assert torch.autograd.gradcheck(lambda x: loss_fn(x, labels), (x,))


def test_identical_embeddings_give_finite_gradients():
    x = torch.ones(6, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    for mining in ("all", "semihard", "batch_hard"):
        loss = TripletLoss(0.2, mining)(x, labels)
        assert loss.item() == pytest.approx(0.2)  # a collapsed model sits at alpha (FaceNet)
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(grad).all()


def test_bad_input():
    with pytest.raises(ValueError, match="margin"):
        TripletLoss(margin=-0.1)
    with pytest.raises(ValueError, match="mining"):
        TripletLoss(mining="hardest")
    loss_fn = TripletLoss()
    with pytest.raises(ValueError, match="labels"):
        loss_fn(torch.randn(4, 3), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="embeddings"):
        loss_fn(torch.tensor([[0.0, float("inf")], [1.0, 0.0]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="mining='all'"):
        TripletLoss(mining="all").mine(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))
