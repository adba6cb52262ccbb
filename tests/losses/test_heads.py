"""Dense heads and the fused margin cross-entropy, checked against an independent composition
of torch ops (F.normalize, matmul, the margin, F.cross_entropy) and by float64 gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from partialfc.losses.heads import MarginSoftmaxHead, SoftmaxHead
from partialfc.losses.margin_softmax import margin_cross_entropy, normalized_margin_cross_entropy
from partialfc.losses.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
)

MARGINS = [
    ArcFaceMargin(0.5, 8.0),
    CosFaceMargin(0.35, 8.0),
    SphereFaceMargin(1.35, 8.0),
    CombinedMargin(1.2, 0.3, 0.2, 8.0),
    NormFaceMargin(8.0),
]
IDS = ["arcface", "cosface", "sphereface", "combined", "normface"]


def _reference_loss(embeddings, centers, labels, margin):
    cos = F.normalize(embeddings, dim=1) @ F.normalize(centers, dim=1).T
    return F.cross_entropy(margin(cos, labels), labels)


def _hard_batch(dtype=torch.float64):
    """Embeddings on, next to, opposite to and past pi - m from their centers."""
    torch.manual_seed(1)
    centers = torch.randn(7, 5, dtype=dtype)
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0])
    embeddings = torch.randn(8, 5, dtype=dtype)
    embeddings[0] = 3.0 * centers[0]  # |cos| = 1 exactly (up to rounding)
    embeddings[1] = centers[1] + 1e-3 * torch.randn(5, dtype=dtype)  # near |cos| = 1
    embeddings[2] = -centers[2] + 0.05 * torch.randn(5, dtype=dtype)  # near cos = -1
    embeddings[3] = -centers[3] + 0.4 * torch.randn(5, dtype=dtype)  # past pi - m
    return embeddings, centers, labels


@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_fused_paths_match_reference_values_and_gradients(margin):
    embeddings, centers, labels = _hard_batch()
    embeddings[0] = embeddings[0] + 1e-4  # keep the reference's autograd away from |cos| = 1
    x_ref = embeddings.clone().requires_grad_(True)
    w_ref = centers.clone().requires_grad_(True)
    reference = _reference_loss(x_ref, w_ref, labels, margin)
    reference.backward()

    x = embeddings.clone().requires_grad_(True)
    w = centers.clone().requires_grad_(True)
    loss = normalized_margin_cross_entropy(x, w, labels, margin)
    loss.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    # row 0 sits 1e-4 from its center, where d f / d cos ~ 1 / sin(theta) amplifies rounding
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-6, atol=1e-9)

    cos = (F.normalize(embeddings, dim=1) @ F.normalize(centers, dim=1).T).requires_grad_(True)
    cos_ref = cos.detach().clone().requires_grad_(True)
    F.cross_entropy(margin(cos_ref, labels), labels).backward()
    margin_cross_entropy(cos, labels, margin).backward()
    torch.testing.assert_close(cos.grad, cos_ref.grad, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_gradcheck_fused_losses_float64(margin):
    embeddings, centers, labels = _hard_batch()
    embeddings[0] = embeddings[0] + 1e-3  # finite differences need a differentiable point
    x = embeddings.requires_grad_(True)
    w = centers.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x, w: normalized_margin_cross_entropy(x, w, labels, margin, reuse_buffer=False),
        (x, w),
    )
    cos = F.normalize(x, dim=1) @ F.normalize(w, dim=1).T
    # finite differences of size 1e-6 must not cross |cos| = 1: stay within 2.6 deg of it
    cos = cos.detach().clamp(-0.999, 0.999).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda c: margin_cross_entropy(c, labels, margin, reuse_buffer=False), (cos,)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_embedding_on_or_opposite_its_center_gives_finite_loss_and_gradients(margin, dtype):
    centers = torch.randn(4, 6, dtype=dtype)
    embeddings = torch.stack([centers[0], -centers[1], 2 * centers[2]]).requires_grad_(True)
    centers.requires_grad_(True)
    labels = torch.tensor([0, 1, 2])
    loss = normalized_margin_cross_entropy(embeddings, centers, labels, margin)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(embeddings.grad).all() and torch.isfinite(centers.grad).all()


def test_bfloat16_cosines_are_widened_before_scaling():
    margin = ArcFaceMargin(0.5, 64.0)
    cos = (torch.rand(16, 40) * 2 - 1).to(torch.bfloat16).requires_grad_(True)
    labels = torch.arange(16) % 40
    loss = margin_cross_entropy(cos, labels, margin)
    reference = F.cross_entropy(margin(cos.detach().float(), labels), labels)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    loss.backward()
    assert cos.grad.dtype == torch.bfloat16


def test_reused_buffer_gives_identical_gradient_and_refuses_a_second_backward():
    margin = ArcFaceMargin(0.5, 16.0)
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    labels = torch.randint(0, 11, (6,))
    normalized_margin_cross_entropy(x, w, labels, margin, reuse_buffer=False).backward()
    grads = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    loss = normalized_margin_cross_entropy(x, w, labels, margin, reuse_buffer=True)
    loss.backward(retain_graph=True)
    assert torch.equal(x.grad, grads[0]) and torch.equal(w.grad, grads[1])
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


def test_fused_loss_rejects_missing_target():
    with pytest.raises(ValueError, match="target_col"):
        margin_cross_entropy(torch.zeros(2, 3), torch.tensor([0, -1]), ArcFaceMargin())
    with pytest.raises(ValueError, match="target_col"):
        normalized_margin_cross_entropy(
            torch.randn(2, 4), torch.randn(3, 4), torch.tensor([0, 3]), ArcFaceMargin()
        )


# ---------------------------------------------------------------- the head


def _worked_example_head(margin):
    """The worked example of test_margins.py: one sample at 60 / 75 / 110 deg from three unit
    centers."""
    head = MarginSoftmaxHead(3, 4, margin).double()
    angles = [math.radians(a) for a in (60.0, 75.0, 110.0)]
    with torch.no_grad():
        head.weight.zero_()
        for c, a in enumerate(angles):
            head.weight[c, 0] = math.cos(a)
            head.weight[c, c + 1] = math.sin(a)
    return head, torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), torch.tensor([0])


def test_head_reproduces_the_worked_example():
    head, x, y = _worked_example_head(NormFaceMargin(64.0))
    assert head.logits(x, y)[0].tolist() == pytest.approx([32.000, 16.564, -21.889], abs=5e-4)
    assert head(x, y).item() == pytest.approx(1.979e-7, rel=2e-3)
    head, x, y = _worked_example_head(CosFaceMargin(0.35, 64.0))
    assert head.logits(x, y)[0, 0].item() == pytest.approx(9.600, abs=1e-9)
    assert head(x, y).item() == pytest.approx(-math.log(9.449e-4 / (1 + 9.449e-4)), rel=1e-3)
    head, x, y = _worked_example_head(ArcFaceMargin(math.radians(28.65), 64.0))
    assert head.logits(x, y)[0, 0].item() == pytest.approx(1.508, abs=5e-4)


@pytest.mark.parametrize("num_subcenters", [1, 3])
def test_head_matches_reference_composition(num_subcenters):
    margin = ArcFaceMargin(0.5, 16.0)
    head = MarginSoftmaxHead(10, 8, margin, num_subcenters=num_subcenters).double()
    x = torch.randn(12, 8, dtype=torch.float64)
    y = torch.randint(0, 10, (12,))
    cos = F.normalize(x, dim=1) @ F.normalize(head.weight, dim=1).T
    cos = cos.view(12, 10, num_subcenters).amax(dim=2)
    expected = F.cross_entropy(margin(cos, y), y)
    torch.testing.assert_close(head(x, y), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(head.logits(x, y), margin(cos, y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_subcenters", [1, 3])
def test_bfloat16_embeddings_take_the_same_float32_math_for_every_k(num_subcenters):
    torch.manual_seed(5)
    head = MarginSoftmaxHead(10, 8, ArcFaceMargin(0.5, 16.0), num_subcenters, intra_weight=0.1)
    x32 = torch.randn(12, 8)
    y = torch.randint(0, 10, (12,))
    x16 = x32.to(torch.bfloat16).requires_grad_(True)
    widened = x16.detach().float().requires_grad_(True)  # the same values, as float32
    loss16, loss_widened = head(x16, y), head(widened, y)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss_widened, rtol=1e-6, atol=1e-6)
    # and within bfloat16 rounding of the float32 input it came from
    torch.testing.assert_close(loss16, head(x32, y), rtol=2e-2, atol=0)
    loss16.backward()
    loss_widened.backward()
    assert x16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x16.grad, widened.grad.to(torch.bfloat16))
    torch.testing.assert_close(head.logits(x16, y), head.logits(widened, y))
    best = head.dominant_subcenters(x16, y)
    assert torch.equal(best.subcenter, head.dominant_subcenters(widened, y).subcenter)


def test_three_equal_subcenters_equal_one_center_on_bfloat16_input():
    """The K = 1 (fused) and K = 3 (cosines, max, margin) paths agree when each class's three
    sub-centers are copies of its one center."""
    torch.manual_seed(6)
    one = MarginSoftmaxHead(10, 8, ArcFaceMargin(0.5, 16.0))
    three = MarginSoftmaxHead(10, 8, ArcFaceMargin(0.5, 16.0), num_subcenters=3)
    with torch.no_grad():
        three.weight.copy_(one.weight.repeat_interleave(3, dim=0))
    x = torch.randn(12, 8).to(torch.bfloat16)
    y = torch.randint(0, 10, (12,))
    torch.testing.assert_close(three(x, y), one(x, y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_subcenters", [1, 3])
def test_gradcheck_head_float64(num_subcenters):
    torch.manual_seed(3)
    head = MarginSoftmaxHead(
        6, 5, CombinedMargin(1.1, 0.3, 0.1, 8.0), num_subcenters, reuse_buffers=False
    ).double()
    with torch.no_grad():
        head.weight.normal_()
    x = torch.randn(7, 5, dtype=torch.float64)
    x[0] = head.weight[0 * num_subcenters] + 1e-3  # near |cos| = 1 with its own center
    x[1] = -head.weight[2 * num_subcenters] + 0.1  # far past pi - m
    x.requires_grad_(True)
    y = torch.tensor([0, 2, 1, 3, 4, 5, 0])

    def loss_of(x, weight):
        return torch.func.functional_call(head, {"weight": weight}, (x, y))

    weight = head.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(loss_of, (x, weight))


def test_class_subset_uses_the_named_rows_in_order():
    margin = CosFaceMargin(0.35, 8.0)
    head = MarginSoftmaxHead(20, 6, margin).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    subset = torch.tensor([17, 3, 9, 0, 12])
    y = torch.tensor([3, 3, 12, 0, 17])
    cos = F.normalize(x, dim=1) @ F.normalize(head.weight[subset], dim=1).T
    target = torch.tensor([1, 1, 4, 3, 0])
    expected = F.cross_entropy(margin(cos, target), target)
    torch.testing.assert_close(head(x, y, class_subset=subset), expected)
    logits = head.logits(x, torch.tensor([3, 5, 12, 0, 17]), class_subset=subset)
    assert logits[1].tolist() == pytest.approx((8.0 * cos[1]).tolist())  # class 5: no margin
    with pytest.raises(ValueError, match="class_subset"):
        head(x, torch.tensor([3, 5, 12, 0, 17]), class_subset=subset)


def test_dominant_subcenters_and_angles():
    head = MarginSoftmaxHead(2, 3, ArcFaceMargin(), num_subcenters=3).double()
    with torch.no_grad():
        head.weight.copy_(
            torch.tensor(
                [[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0], [0, 0, -1]],
                dtype=torch.float64,
            )
        )
    x = torch.tensor([[0.0, 2.0, 0.1], [1.0, 1.0, 0.0], [0.0, 0.0, -1.0]], dtype=torch.float64)
    out = head.dominant_subcenters(x, torch.tensor([0, 0, 1]))
    assert out.subcenter.tolist() == [1, 0, 2]
    expected_deg = [math.degrees(math.atan2(0.1, 2.0)), 45.0, 0.0]
    assert out.angle_deg.tolist() == pytest.approx(expected_deg, abs=1e-6)
    expected_rad = [math.radians(d) for d in expected_deg]
    assert out.angle_rad.tolist() == pytest.approx(expected_rad, abs=1e-7)


def test_intra_and_inter_add_ons():
    margin = NormFaceMargin(4.0)
    base = MarginSoftmaxHead(3, 3, margin).double()
    with torch.no_grad():
        base.weight.copy_(torch.eye(3, dtype=torch.float64))
    x = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    plain = base(x, y)
    intra = MarginSoftmaxHead(3, 3, margin, intra_weight=1.0).double()
    inter = MarginSoftmaxHead(3, 3, margin, inter_weight=1.0).double()
    intra.weight.data.copy_(base.weight)
    inter.weight.data.copy_(base.weight)
    # L5: + mean(theta_y) / pi = (pi/4 + 0) / 2 / pi = 1/8
    assert (intra(x, y) - plain).item() == pytest.approx(0.125, abs=1e-7)
    # L6: - 1/(pi (N-1)) sum_{j != y} angle(w_y, w_j) = -(pi/2 + pi/2) / (2 pi) = -0.5
    assert (inter(x, y) - plain).item() == pytest.approx(-0.5, abs=1e-7)


def test_softmax_head_is_plain_linear_cross_entropy():
    head = SoftmaxHead(7, 4).double()
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (5,))
    expected = F.cross_entropy(x @ head.linear.weight.T + head.linear.bias, y)
    torch.testing.assert_close(head(x, y), expected)
    assert torch.autograd.gradcheck(lambda x: head(x, y), (x,))


@pytest.mark.parametrize("head_cls", ["margin", "softmax"])
def test_heads_reject_bad_input(head_cls):
    head = MarginSoftmaxHead(5, 3, ArcFaceMargin()) if head_cls == "margin" else SoftmaxHead(5, 3)
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="labels"):
        head(x, torch.tensor([0, 1, 2, 5]))
    with pytest.raises(ValueError, match="labels"):
        head(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="labels"):
        head(x, torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="embeddings"):
        head(torch.randn(4, 2), torch.tensor([0, 1, 2, 3]))
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="row: 2"):
        head(bad, torch.tensor([0, 1, 2, 3]))


def test_margin_head_rejects_bad_construction():
    with pytest.raises(ValueError, match="num_classes"):
        MarginSoftmaxHead(0, 3, ArcFaceMargin())
    with pytest.raises(ValueError, match="num_subcenters"):
        MarginSoftmaxHead(4, 3, ArcFaceMargin(), num_subcenters=0)
    with pytest.raises(ValueError, match="margin"):
        MarginSoftmaxHead(4, 3, margin=0.5)
    with pytest.raises(ValueError, match="inter_weight"):
        MarginSoftmaxHead(4, 3, ArcFaceMargin(), num_subcenters=3, inter_weight=1.0)


# ---------------------------------------------------------------- fused loss: defaults, dtypes


@pytest.mark.parametrize("fused", ["cos", "normalized"])
def test_fused_losses_reuse_their_buffer_by_default(fused):
    """Default (and explicit True): one backward only; reuse_buffer=False allows a second one
    with the same gradient."""
    margin = CosFaceMargin(0.35, 16.0)
    labels = torch.tensor([0, 2, 1])

    def loss_fn(**kwargs):
        x = torch.randn(3, 4, requires_grad=True)
        if fused == "cos":
            cos = torch.tanh(x)
            return x, margin_cross_entropy(cos, labels, margin, **kwargs)
        return x, normalized_margin_cross_entropy(x, torch.randn(5, 4), labels, margin, **kwargs)

    for kwargs in ({}, {"reuse_buffer": True}):
        _, loss = loss_fn(**kwargs)
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="reuse_buffer=False"):
            loss.backward()
    x, loss = loss_fn(reuse_buffer=False)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first, rtol=0, atol=0)


@pytest.mark.parametrize(("scale", "num_cols"), [(30.0, 50), (3.0, 4)])
def test_bfloat16_cosines_give_the_float32_loss_and_gradient_exactly(scale, num_cols):
    """Narrow cosines are widened before scaling (s = 30 is not a power of two, so scaling in
    bfloat16 would round) and the margin slope is taken in float32 (a bfloat16 slope shows in
    the target gradient once p_target is far from 0, hence the small scale and few columns)."""
    margin = ArcFaceMargin(0.5, scale)
    cos16 = (torch.rand(256, num_cols) * 1.8 - 0.9).to(torch.bfloat16).requires_grad_(True)
    cos32 = cos16.detach().float().requires_grad_(True)
    labels = torch.arange(256) % num_cols
    loss16 = margin_cross_entropy(cos16, labels, margin)
    loss32 = margin_cross_entropy(cos32, labels, margin)
    assert loss16.dtype == torch.float32
    assert torch.equal(loss16, loss32)
    loss16.backward()
    loss32.backward()
    assert cos16.grad.dtype == torch.bfloat16
    assert torch.equal(cos16.grad, cos32.grad.to(torch.bfloat16))


def test_normalized_loss_of_bfloat16_inputs_is_computed_in_float32():
    margin = ArcFaceMargin(0.5, 30.0)
    x = torch.randn(8, 16).to(torch.bfloat16)
    w = torch.randn(20, 16).to(torch.bfloat16)
    labels = torch.arange(8) * 2
    loss = normalized_margin_cross_entropy(x, w, labels, margin)
    assert loss.dtype == torch.float32
    expected = normalized_margin_cross_entropy(x.float(), w.float(), labels, margin)
    assert torch.equal(loss, expected)
    mixed = normalized_margin_cross_entropy(x, w.float(), labels, margin)
    assert torch.equal(mixed, expected)


def test_fused_loss_input_errors_name_what_is_wrong():
    margin = ArcFaceMargin(0.5, 8.0)
    cos, labels = torch.zeros(3, 4), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"2-D floating tensor \(B, N\), got \(4,\)"):
        margin_cross_entropy(torch.zeros(4), labels, margin)
    with pytest.raises(ValueError, match="floating"):
        margin_cross_entropy(torch.zeros(3, 4, dtype=torch.long), labels, margin)
    with pytest.raises(ValueError, match="CombinedMargin, got Linear"):
        margin_cross_entropy(cos, labels, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"shape \(3,\), got \(2,\)"):
        margin_cross_entropy(cos, labels[:2], margin)
    with pytest.raises(ValueError, match=r"shape \(3,\), got \(3, 1\)"):
        margin_cross_entropy(cos, labels[:, None], margin)
    for bad in (labels.float(), labels.bool()):
        with pytest.raises(ValueError, match=f"integer tensor, got dtype {bad.dtype}"):
            margin_cross_entropy(cos, bad, margin)
    with pytest.raises(ValueError, match="^the batch must have at least one row$"):
        margin_cross_entropy(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), margin)
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"must share d, got \(3, 4\) and \(5, 3\)"):
        normalized_margin_cross_entropy(x, w[:, :3], labels, margin)
    with pytest.raises(ValueError, match=r"must share d, got \(4,\) and \(5, 4\)"):
        normalized_margin_cross_entropy(x[0], w, labels, margin)
    with pytest.raises(ValueError, match=r"must share d, got \(3, 4\) and \(4,\)"):
        normalized_margin_cross_entropy(x, w[0], labels, margin)


def test_second_backward_error_says_how_to_differentiate_again():
    cos = torch.rand(2, 3, requires_grad=True)
    loss = margin_cross_entropy(cos, torch.tensor([0, 1]), ArcFaceMargin(0.5, 8.0))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError) as err:
        loss.backward()
    assert str(err.value) == (
        "the fused margin cross-entropy reuses its buffer for the gradient and can be "
        "differentiated only once per forward; pass reuse_buffer=False to differentiate again"
    )


def test_partial_fc_and_the_dense_heads_check_input_with_one_validator():
    from partialfc.classifier import PartialFC

    dense = MarginSoftmaxHead(5, 3, ArcFaceMargin())
    pfc = PartialFC(5, 3, ArcFaceMargin(), sample_rate=1.0)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    cases = [
        (x, torch.tensor([0, 1, 2, 5]), "contains 5, outside [0, num_classes=5)"),
        (x, torch.tensor([0, 1, 2]), "has 3 entries for 4 embeddings"),
        (x, y.float(), "must be an integer tensor, got dtype torch.float32"),
        (torch.randn(4, 2), y, "has dimension 2, expected embedding_dim=3"),
        (x.long(), y, "must be floating point, got dtype torch.int64"),
        (x[0], torch.tensor([0]), "must be a 2-D tensor (B, d), got (3,)"),
    ]
    for embeddings, labels, message in cases:
        with pytest.raises(ValueError) as dense_error:
            dense(embeddings, labels)
        with pytest.raises(ValueError) as pfc_error:
            pfc(embeddings, labels)
        assert message in str(dense_error.value) and message in str(pfc_error.value)
        # each names its own arguments
        assert str(pfc_error.value).startswith("PartialFC (rank 0): local_")
        assert str(dense_error.value).split()[0] in ("embeddings", "labels")
