"""The complementary margin term and the out-of-fold descriptors it trains against."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from partialfc.losses import ArcFaceMargin, MarginSoftmaxHead
from partialfc.tools.complementary import ComplementaryMarginTerm, out_of_fold_embeddings
from partialfc.train.extra_losses import StepContext


def _context(embeddings, labels, head, indices):
    return StepContext(None, embeddings, labels, head, 0, indices)


def _expected_loss(e, y, centers, d, all_labels, indices, w, m_rad, s):
    """The term's loss recomputed sample by sample in float64, from its definition."""
    total = 0.0
    num_classes = centers.shape[0]
    units = d / np.linalg.norm(d, axis=1, keepdims=True)
    for row, i in enumerate(indices):
        e_hat = e[row] / np.linalg.norm(e[row])
        logits = []
        for c in range(num_classes):
            members = [j for j in range(len(all_labels)) if all_labels[j] == c]
            if c == y[row]:
                members = [j for j in members if j != i]  # the sample's own class without it
            center = units[members].sum(0) if members else np.zeros(d.shape[1])
            norm = np.linalg.norm(center)
            cos_d = units[i] @ center / norm if norm > 0 else 0.0
            cos_net = e_hat @ centers[c] / np.linalg.norm(centers[c])
            fused = (cos_net + w * cos_d) / (1 + w)
            if c == y[row]:
                fused = math.cos(math.acos(fused) + m_rad)
            logits.append(s * fused)
        logits = np.array(logits)
        top = logits.max()
        total += top + math.log(np.exp(logits - top).sum()) - logits[y[row]]
    return total / len(indices)


def test_loss_matches_a_sample_by_sample_recomputation():
    rng = np.random.default_rng(0)
    all_labels = np.array([0, 0, 1, 1, 1, 2, 3, 3])  # class 2 has one sample
    d = rng.normal(size=(8, 5))
    head = MarginSoftmaxHead(4, 6, ArcFaceMargin(0.4, 12.0), reuse_buffers=False)
    indices = np.array([1, 4, 5, 6])
    e = rng.normal(size=(4, 6))
    term = ComplementaryMarginTerm(d, all_labels, 4, descriptor_weight=2.0, weight=1.5)
    ctx = _context(
        torch.tensor(e, dtype=torch.float32),
        torch.tensor(all_labels[indices]),
        head,
        torch.tensor(indices),
    )
    out = term(ctx)
    centers = head.class_centers().double().numpy()
    expected = _expected_loss(e, all_labels[indices], centers, d, all_labels, indices, 2.0, 0.4, 12)
    assert out.loss.item() == pytest.approx(1.5 * expected, rel=1e-5)
    assert out.diagnostics["loss"] == pytest.approx(expected, rel=1e-5)


def test_own_class_center_leaves_the_sample_out():
    d = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    term = ComplementaryMarginTerm(d, np.array([0, 0, 1, 2]), 3)
    cos = term.descriptor_cosines(torch.tensor([0, 2, 3])).numpy()
    # sample 0: its class without it is sample 1 (cos 1); class 1 is (0, 1), class 2 (0.6, 0.8)
    np.testing.assert_allclose(cos[0], [1.0, 0.0, 0.6], atol=1e-6)
    # samples 2 and 3 are their classes' only members: 0 for their own class
    np.testing.assert_allclose(cos[1], [0.0, 0.0, 0.8], atol=1e-6)
    np.testing.assert_allclose(cos[2], [0.6, 0.8, 0.0], atol=1e-6)


def test_without_the_descriptor_it_is_the_heads_own_margin_loss():
    torch.manual_seed(1)
    head = MarginSoftmaxHead(5, 8, ArcFaceMargin(0.5, 16.0), reuse_buffers=False)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    e = torch.randn(6, 8)
    term = ComplementaryMarginTerm(torch.randn(6, 3), labels, 5, descriptor_weight=0.0)
    out = term(_context(e, labels, head, torch.arange(6)))
    assert out.loss.item() == pytest.approx(head(e, labels).item(), rel=1e-6)


def test_gradient_reaches_the_embeddings_in_float64():
    head = MarginSoftmaxHead(3, 4, ArcFaceMargin(0.3, 8.0), reuse_buffers=False)
    labels = torch.tensor([0, 1, 2, 1])
    term = ComplementaryMarginTerm(torch.randn(4, 3), labels, 3, descriptor_weight=3.0)
    e = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)

    def loss(x):
        return term(_context(x, labels, head, torch.arange(4))).loss

    assert torch.autograd.gradcheck(loss, (e,))


def test_samples_the_descriptor_separates_weigh_less():
    """The boosting effect: with the descriptor on the right class, the loss and its gradient
    on the network's embedding shrink; with it on a wrong class, they grow."""
    head = MarginSoftmaxHead(2, 2, ArcFaceMargin(0.5, 16.0), reuse_buffers=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    labels = torch.tensor([0, 0, 1, 1])
    agreeing = ComplementaryMarginTerm(
        np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), labels, 2
    )
    opposing = ComplementaryMarginTerm(  # sample 0 looks like class 1, not like sample 1
        np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), labels, 2
    )
    sizes = []
    for term in (agreeing, opposing):
        e = torch.tensor([[1.0, 1.0]], requires_grad=True)  # between the two classes
        term(_context(e, labels[:1], head, torch.tensor([0]))).loss.backward()
        sizes.append(e.grad.norm().item())
    assert sizes[0] < 0.1 * sizes[1]


def test_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="must be"):
        ComplementaryMarginTerm(np.zeros((3, 2)), np.zeros(4, int), 2)
    with pytest.raises(ValueError, match="labels must be in 0..1"):
        ComplementaryMarginTerm(np.ones((2, 2)), np.array([0, 2]), 2)
    with pytest.raises(ValueError, match="descriptor_weight"):
        ComplementaryMarginTerm(np.ones((2, 2)), np.array([0, 1]), 2, descriptor_weight=-1)
    term = ComplementaryMarginTerm(np.ones((2, 2)), np.array([0, 1]), 2)
    head = MarginSoftmaxHead(3, 2, ArcFaceMargin(0.5, 16.0), reuse_buffers=False)
    with pytest.raises(ValueError, match="one center a class"):
        term(_context(torch.ones(1, 2), torch.tensor([0]), head, torch.tensor([0])))
    with pytest.raises(ValueError, match="indices"):
        term(_context(torch.ones(1, 2), torch.tensor([0]), head, None))


def test_out_of_fold_never_embeds_a_person_with_a_fit_that_saw_them():
    labels = np.repeat(np.arange(10), 3)[np.random.default_rng(0).permutation(30)]
    calls = []

    def fit_and_embed(train_rows, embed_rows):
        calls.append((set(train_rows.tolist()), embed_rows))
        # a "model" that remembers its training people: 1 for a person it saw
        seen = set(labels[train_rows].tolist())
        return np.array([[float(labels[r] in seen), len(calls)] for r in embed_rows])

    out = out_of_fold_embeddings(fit_and_embed, labels, num_groups=3, seed=4)
    assert len(calls) == 3 and (out[:, 0] == 0).all()  # nobody embedded by a fit that saw them
    embedded = np.concatenate([rows for _, rows in calls])
    assert sorted(embedded.tolist()) == list(range(30))  # each row once
    for train, rows in calls:  # the fit saw every other person's rows
        assert train == set(range(30)) - set(rows.tolist())
        assert len(set(labels[rows].tolist()) & set(labels[list(train)].tolist())) == 0
    sizes = sorted(len(set(labels[rows].tolist())) for _, rows in calls)
    assert sizes == [3, 3, 4]  # people dealt evenly


def test_out_of_fold_refuses_bad_groups_and_outputs():
    labels = np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="num_groups must be in 2..2"):
        out_of_fold_embeddings(lambda t, e: np.zeros((len(e), 1)), labels, num_groups=3)
    with pytest.raises(ValueError, match="group 0"):
        out_of_fold_embeddings(lambda t, e: np.zeros((1, 1)), labels, num_groups=2)
