"""APCS / AMNCS / MICS against a brute-force recomputation from the full center table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partialfc.classifier import PartialFC, gather_full_centers
from partialfc.losses.heads import MarginSoftmaxHead
from partialfc.losses.margins import ArcFaceMargin


@pytest.mark.parametrize("num_subcenters", [1, 3])
def test_diagnostics_equal_brute_force(num_subcenters):
    torch.manual_seed(0)
    c, d, k = 40, 8, num_subcenters
    head = PartialFC(c, d, ArcFaceMargin(0.5, 16.0), sample_rate=1.0, num_subcenters=k, seed=3)
    x = torch.randn(12, d)
    y = torch.randint(0, c, (12,))
    head(x.requires_grad_(), y).backward()  # the forward records the active rows
    diag = head.diagnostics(x.detach(), y)  # mics_classes=512 >= c: every class

    w = F.normalize(gather_full_centers(head), dim=1)  # (C*K, d)
    cos = (F.normalize(x.detach(), dim=1) @ w.t()).view(12, c, k).amax(dim=2)  # per class
    positive = cos[torch.arange(12), y]
    negative = cos.masked_fill(F.one_hot(y, c).bool(), -2).amax(dim=1)
    assert diag["apcs"] == pytest.approx(positive.mean().item(), abs=1e-6)
    assert diag["amncs"] == pytest.approx(negative.mean().item(), abs=1e-6)
    gram = w @ w.t()
    same_class = torch.arange(c * k).unsqueeze(0) // k == torch.arange(c * k).unsqueeze(1) // k
    assert diag["mics"] == pytest.approx(gram.masked_fill(same_class, -2).max().item(), abs=1e-6)
    assert diag["mics_classes"] == c


@pytest.mark.parametrize("num_subcenters", [1, 3])
def test_a_dense_head_with_the_same_centers_reports_the_same_diagnostics(num_subcenters):
    torch.manual_seed(0)
    c, d, k = 40, 8, num_subcenters
    pfc = PartialFC(c, d, ArcFaceMargin(0.5, 16.0), sample_rate=1.0, num_subcenters=k, seed=3)
    dense = MarginSoftmaxHead(c, d, ArcFaceMargin(0.5, 16.0), num_subcenters=k)
    with torch.no_grad():
        dense.weight.copy_(gather_full_centers(pfc))
    x = torch.randn(12, d)
    y = torch.randint(0, c, (12,))
    pfc(x.requires_grad_(), y).backward()
    sharded, full = pfc.diagnostics(x.detach(), y), dense.diagnostics(x.detach(), y)
    assert sharded.keys() == full.keys()
    for key in ("apcs", "amncs", "mics"):
        assert full[key] == pytest.approx(sharded[key], abs=1e-6), key
    assert full["mics_classes"] == c
