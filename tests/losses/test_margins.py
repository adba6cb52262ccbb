"""Margin math: a hand-worked sample, ArcFace's published constants, monotonicity,
finite values/gradients at |cos| = 1, gradcheck in float64, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from partialfc.losses.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
)

# A worked example of the margins of NormFace (Wang et al., ACM MM 2017), CosFace (Wang et al.,
# CVPR 2018) and ArcFace (Deng et al., CVPR 2019): one sample, three classes, s = 64. Target at
# 60 deg, impostors at 75 and 110 deg.
SAMPLE_COS = [0.5, math.cos(math.radians(75.0)), math.cos(math.radians(110.0))]


def _sample(dtype=torch.float64):
    return torch.tensor([SAMPLE_COS], dtype=dtype), torch.tensor([0])


def test_normface_logits_and_loss_match_the_worked_example():
    cos, target = _sample()
    logits = NormFaceMargin(scale=64.0)(cos, target)
    assert logits[0].tolist() == pytest.approx([32.000, 16.564, -21.889], abs=5e-4)
    loss = F.cross_entropy(logits, target).item()
    assert loss == pytest.approx(1.979e-7, rel=2e-3)


def test_cosface_target_logit_is_9_600():
    cos, target = _sample()
    logits = CosFaceMargin(margin=0.35, scale=64.0)(cos, target)
    assert logits[0, 0].item() == pytest.approx(9.600, abs=1e-9)
    assert logits[0, 1:].tolist() == pytest.approx([16.564, -21.889], abs=5e-4)
    p_target = torch.softmax(logits, dim=1)[0, 0].item()
    assert p_target == pytest.approx(9.44e-4, rel=2e-3)


def test_arcface_target_logit_is_1_508():
    cos, target = _sample()
    logits = ArcFaceMargin(margin_rad=0.5, scale=64.0)(cos, target)
    assert logits[0, 0].item() == pytest.approx(64 * math.cos(math.pi / 3 + 0.5), abs=1e-9)
    # The worked example rounds 0.5 rad to 28.65 deg: 60 + 28.65 = 88.65 deg, cos = 0.023562,
    # 64x = 1.508.
    assert logits[0, 0].item() == pytest.approx(1.508, abs=3e-3)
    rounded_margin = ArcFaceMargin(margin_rad=math.radians(28.65), scale=64.0)
    logits = rounded_margin(cos, target)
    assert logits[0, 0].item() == pytest.approx(1.508, abs=5e-4)
    assert logits[0, 1:].tolist() == pytest.approx([16.564, -21.889], abs=5e-4)
    p_target = torch.softmax(logits, dim=1)[0, 0].item()
    assert p_target == pytest.approx(2.891e-7, rel=2e-3)


@pytest.mark.parametrize(
    ("margin", "expected_per_rad"),
    [(ArcFaceMargin(0.5, 64.0), 63.98), (CosFaceMargin(0.35, 64.0), 55.37)],
)
def test_angular_gradient_per_radian(margin, expected_per_rad):
    """dL/dtheta_y = s (1 - p_y) sin(theta_y + m) (ArcFace), s (1 - p_y) sin(theta_y) (CosFace)."""
    theta = torch.tensor([[math.radians(d) for d in (60.0, 75.0, 110.0)]], dtype=torch.float64)
    theta.requires_grad_(True)
    loss = F.cross_entropy(margin(torch.cos(theta), torch.tensor([0])), torch.tensor([0]))
    loss.backward()
    # descent decreases theta_y: the loss gradient w.r.t. the target angle is positive
    assert theta.grad[0, 0].item() == pytest.approx(expected_per_rad, abs=5e-3)


@pytest.mark.parametrize(("scale", "expected"), [(1.0, 10.36), (8.0, 3.393)])
def test_normface_floor_at_85742_classes(scale, expected):
    """Perfect sample: cos = 1 to its own class, 0 to the other 85,741."""
    num_classes = 85_742
    cos = torch.zeros(1, num_classes, dtype=torch.float64)
    cos[0, 0] = 1.0
    loss = F.cross_entropy(NormFaceMargin(scale)(cos, torch.tensor([0])), torch.tensor([0]))
    assert loss.item() == pytest.approx(expected, abs=5e-3)


def test_random_init_loss_is_ln_num_classes():
    num_classes = 85_742
    cos = torch.zeros(1, num_classes, dtype=torch.float64)
    loss = F.cross_entropy(NormFaceMargin(64.0)(cos, torch.tensor([0])), torch.tensor([0]))
    assert loss.item() == pytest.approx(11.36, abs=5e-3)
    assert loss.item() == pytest.approx(math.log(num_classes), abs=1e-9)


def test_arcface_published_tail_constants():
    margin = ArcFaceMargin(0.5)
    assert math.cos(margin.theta_star_rad) == pytest.approx(-0.877583, abs=1e-6)
    assert margin.tail_shift == pytest.approx(0.239713, abs=1e-6)
    # past pi - m: cos(theta) - m sin(m); before: cos(theta + m)
    cos = torch.tensor([[-0.95, 0.0], [-0.85, 0.0]], dtype=torch.float64)
    logits = margin(cos, torch.tensor([0, 0]))
    assert logits[0, 0].item() == pytest.approx(64 * (-0.95 - 0.239713), abs=1e-4)
    expected = 64 * math.cos(math.acos(-0.85) + 0.5)
    assert logits[1, 0].item() == pytest.approx(expected, abs=1e-9)


def _reference_target_logit(theta, m1, m2, m3):
    """Independent numpy statement of the combined margin with its continuation."""
    theta_star = (math.pi - m2) / m1
    shift = m3 + max(m2 * math.sin(m2), 1.0 + math.cos(theta_star))
    margin_branch = np.cos(m1 * theta + m2) - m3
    return np.where(theta <= theta_star, margin_branch, np.cos(theta) - shift)


MARGINS = {
    "arcface": (ArcFaceMargin(0.5), (1.0, 0.5, 0.0)),
    "cosface": (CosFaceMargin(0.35), (1.0, 0.0, 0.35)),
    "sphereface": (SphereFaceMargin(1.35), (1.35, 0.0, 0.0)),
    "combined": (CombinedMargin(1.0, 0.3, 0.2), (1.0, 0.3, 0.2)),
    "all_three": (CombinedMargin(1.2, 0.3, 0.2), (1.2, 0.3, 0.2)),
    "m1_below_one": (CombinedMargin(0.9, 0.4, 0.1), (0.9, 0.4, 0.1)),
    "large_m2": (CombinedMargin(1.0, 1.2, 0.0), (1.0, 1.2, 0.0)),
}


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_target_logit_monotone_over_0_to_pi(name):
    margin, _ = MARGINS[name]
    theta = torch.linspace(0.0, math.pi, 20001, dtype=torch.float64)
    f = margin.target_logit_from_angle(theta)
    assert torch.all(torch.diff(f) <= 1e-12), f"{name}: target logit increases somewhere"
    # and through the cosine route used by forward
    g = margin.target_logit(torch.cos(theta))
    assert torch.all(torch.diff(g) <= 1e-9)


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_target_logit_matches_independent_reference(name):
    margin, (m1, m2, m3) = MARGINS[name]
    theta = np.linspace(0.0, math.pi, 997)
    expected = _reference_target_logit(theta, m1, m2, m3)
    cos = torch.tensor(np.cos(theta)).reshape(-1, 1).repeat(1, 3)
    logits = margin(cos, torch.zeros(len(theta), dtype=torch.long))
    np.testing.assert_allclose(logits[:, 0].numpy() / margin.scale, expected, atol=1e-7)
    np.testing.assert_allclose(logits[:, 1:].numpy(), margin.scale * cos[:, 1:].numpy())


def test_all_three_margins_active_m2_not_dropped_when_m3_positive():
    margin = CombinedMargin(m1=1.0, m2_rad=0.3, m3=0.2, scale=1.0)
    theta = math.radians(60.0)
    got = margin(torch.tensor([[math.cos(theta)]], dtype=torch.float64), torch.tensor([0]))
    assert got.item() == pytest.approx(math.cos(theta + 0.3) - 0.2, abs=1e-12)
    assert got.item() < math.cos(theta) - 0.2 - 0.2  # m2 costs ~0.26 here on top of m3
    margin = CombinedMargin(m1=1.35, m2_rad=0.3, m3=0.2, scale=1.0)
    got = margin(torch.tensor([[math.cos(theta)]], dtype=torch.float64), torch.tensor([0]))
    assert got.item() == pytest.approx(math.cos(1.35 * theta + 0.3) - 0.2, abs=1e-12)


def test_sphereface_uses_real_valued_m1_and_continues_past_pi_over_m1():
    margin = SphereFaceMargin(1.35, scale=1.0)
    cos = torch.tensor([[math.cos(1.0)], [math.cos(3.0)]], dtype=torch.float64)
    got = margin(cos, torch.tensor([0, 0]))[:, 0]
    assert got[0].item() == pytest.approx(math.cos(1.35), abs=1e-12)
    theta_star = math.pi / 1.35
    # continuation is continuous here (1 + cos(theta*) > 0 = m2 sin m2)
    assert got[1].item() == pytest.approx(math.cos(3.0) - (1 + math.cos(theta_star)), abs=1e-12)


def test_easy_margin_only_where_cos_positive():
    margin = ArcFaceMargin(0.5, scale=1.0, easy_margin=True)
    cos = torch.tensor([[0.5], [-0.2], [0.0]], dtype=torch.float64)
    got = margin(cos, torch.tensor([0, 0, 0]))[:, 0]
    assert got[0].item() == pytest.approx(math.cos(math.pi / 3 + 0.5), abs=1e-12)
    assert got[1].item() == pytest.approx(-0.2, abs=1e-15)
    assert got[2].item() == pytest.approx(0.0, abs=1e-15)


def test_rows_with_target_minus_one_get_no_margin():
    margin = ArcFaceMargin(0.5, scale=2.0)
    cos = torch.tensor([[0.5, 0.1], [0.3, 0.7]], dtype=torch.float64)
    got = margin(cos, torch.tensor([-1, 1]))
    assert got[0].tolist() == [1.0, 0.2]
    assert got[1, 0].item() == pytest.approx(0.6)
    assert got[1, 1].item() == pytest.approx(2 * math.cos(math.acos(0.7) + 0.5), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(MARGINS))
def test_exact_unit_cosine_gives_finite_values_and_gradients(name, dtype):
    margin, _ = MARGINS[name]
    cos = torch.tensor([[1.0, -1.0, 0.3], [-1.0, 1.0, 1.0], [1.0, 1.0, -1.0]], dtype=dtype)
    cos.requires_grad_(True)
    logits = margin(cos, torch.tensor([0, 0, 2]))
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.tensor([0, 0, 2])).backward()
    assert torch.isfinite(cos.grad).all()


def test_bfloat16_input_computes_margin_in_float32():
    margin = ArcFaceMargin(0.5)
    cos = torch.rand(8, 5, dtype=torch.float32).mul(2).sub(1).to(torch.bfloat16)
    target = torch.arange(8) % 5
    logits = margin(cos, target)
    assert logits.dtype == torch.float32
    reference = margin(cos.float(), target)
    torch.testing.assert_close(logits, reference, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_gradcheck_float64_including_near_unit_cos_and_past_threshold(name):
    margin, (m1, m2, _) = MARGINS[name]
    theta_star = (math.pi - m2) / m1
    thetas = [1e-2, 0.3, 1.0, 2.0, math.pi - 1e-2]
    if theta_star < math.pi - 0.02:
        thetas.append((theta_star + math.pi) / 2)  # past the threshold, on the continuation
    targets = torch.tensor([[math.cos(t)] for t in thetas], dtype=torch.float64)
    others = torch.linspace(-0.99, 0.99, 3, dtype=torch.float64).expand(len(thetas), 3)
    cos = torch.cat([targets, others], dim=1).requires_grad_(True)
    target_col = torch.zeros(len(thetas), dtype=torch.long)
    target_col[-1] = -1  # one row without its class among the columns
    assert torch.autograd.gradcheck(lambda c: margin(c, target_col), (cos,))


def test_hyperparameters_are_plain_floats_a_schedule_can_change():
    margin = ArcFaceMargin(0.5, 64.0)
    cos, target = _sample()
    margin.m2_rad = 0.0
    assert margin(cos, target)[0, 0].item() == pytest.approx(32.0)
    margin.scale = 30.0
    assert margin(cos, target)[0, 0].item() == pytest.approx(15.0)
    assert list(margin.parameters()) == []


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"m1": 0.0}, "m1"),
        ({"m1": -1.0}, "m1"),
        ({"m2_rad": math.pi}, "m2_rad"),
        ({"m2_rad": -0.1}, "m2_rad"),
        ({"m2_rad": float("nan")}, "m2_rad"),
        ({"m3": 1.0}, "m3"),
        ({"m3": -0.1}, "m3"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("inf")}, "scale"),
    ],
)
def test_invalid_hyperparameters_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CombinedMargin(**kwargs)


def test_invalid_hyperparameter_set_by_schedule_is_caught_at_forward():
    margin = ArcFaceMargin(0.5)
    margin.m2_rad = 4.0
    with pytest.raises(ValueError, match="m2_rad"):
        margin(*_sample())


def test_invalid_inputs_raise():
    margin = ArcFaceMargin(0.5)
    with pytest.raises(ValueError, match="cos"):
        margin(torch.zeros(3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="target_col"):
        margin(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="target_col"):
        margin(torch.zeros(3, 4), torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match="target_col"):
        margin(torch.zeros(3, 4), torch.tensor([0, -2, 1]))
    with pytest.raises(ValueError, match="target_col"):
        margin(torch.zeros(3, 4), torch.zeros(3))


def _angle_where_target_logit_equals(margin, value):
    """Bisection on the (monotone) target logit: the largest angle that still beats ``value``."""
    low, high = 0.0, math.pi / 2
    for _ in range(200):
        mid = (low + high) / 2
        f = margin.target_logit_from_angle(torch.tensor(mid, dtype=torch.float64)).item()
        low, high = (mid, high) if f > value else (low, mid)
    return math.degrees(low)


def test_required_travel_cosface_7_5_deg_arcface_13_65_deg():
    """The worked example: from 60 deg, with the impostor fixed at 75 deg."""
    impostor = math.cos(math.radians(75.0))
    cosface = _angle_where_target_logit_equals(CosFaceMargin(0.35), impostor)
    arcface = _angle_where_target_logit_equals(ArcFaceMargin(0.5), impostor)
    assert cosface == pytest.approx(52.50, abs=5e-3)
    assert 60.0 - cosface == pytest.approx(7.5, abs=5e-3)
    assert 60.0 - arcface == pytest.approx(13.65, abs=5e-3)


# ---------------------------------------------------------------- defaults and exact values


@pytest.mark.parametrize(
    ("margin_cls", "target_fn"),
    [
        (CombinedMargin, lambda c: c),
        (NormFaceMargin, lambda c: c),
        (ArcFaceMargin, lambda c: np.cos(np.arccos(c) + 0.5)),
        (CosFaceMargin, lambda c: c - 0.35),
        (SphereFaceMargin, lambda c: np.cos(1.35 * np.arccos(c))),
    ],
    ids=["combined", "normface", "arcface", "cosface", "sphereface"],
)
def test_documented_defaults_give_the_documented_logits(margin_cls, target_fn):
    """Defaults: s = 64; ArcFace m = 0.5 rad, CosFace m = 0.35, SphereFace m1 = 1.35, and a
    bare CombinedMargin() is NormFace. Angles stay below every theta* so no tail is involved."""
    margin = margin_cls()  # built in the test, not at collection time
    cos = torch.tensor([[0.8, -0.3, 0.1], [0.2, 0.5, -0.6]], dtype=torch.float64)
    target = torch.tensor([0, 1])
    got = margin(cos, target).numpy()
    expected = 64.0 * cos.numpy()
    expected[0, 0] = 64.0 * target_fn(0.8)
    expected[1, 1] = 64.0 * target_fn(0.5)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_normface_is_exactly_scale_times_cos_including_unit_cosines(dtype):
    """No margin means no arccos round trip: bit-identical to ``scale * cos``."""
    cos = torch.cat(
        [torch.rand(6, 4, dtype=dtype) * 2 - 1, torch.tensor([[1.0, -1.0, 0.0, 1.0]], dtype=dtype)]
    )
    target = torch.tensor([0, 1, 2, 3, 0, 1, 3])
    for margin in (NormFaceMargin(scale=30.0), CombinedMargin(scale=30.0)):
        got = margin(cos, target)
        assert torch.equal(got, cos * 30.0)


def test_margin_branch_includes_theta_star_itself():
    """f(theta*) = cos(m1 theta* + m2) - m3 = -1 - m3 (documented ``theta <= theta*``); for ArcFace
    the continuation starts just past it, at cos(theta*) - m sin m = -1.117."""
    for margin in (ArcFaceMargin(0.5), CombinedMargin(1.0, 1.2, 0.1)):
        theta = torch.tensor([margin.theta_star_rad], dtype=torch.float64)
        got = margin.target_logit_from_angle(theta).item()
        assert got == pytest.approx(-1.0 - margin.m3, abs=1e-12)
    arcface = ArcFaceMargin(0.5)
    past = torch.tensor([arcface.theta_star_rad + 1e-9], dtype=torch.float64)
    expected = math.cos(math.pi - 0.5) - 0.5 * math.sin(0.5)
    assert arcface.target_logit_from_angle(past).item() == pytest.approx(expected, abs=1e-8)


def test_cosines_outside_unit_interval_are_clamped_before_the_angle():
    """Rounding can push a cosine just past +-1; it is treated as +-1, with zero gradient."""
    from partialfc.losses.margins import angle_from_cos

    cos = torch.tensor([-1.5, -1.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    theta = angle_from_cos(cos)
    assert theta[0].item() == theta[1].item()
    assert theta[2].item() == theta[3].item()
    assert theta[1].item() == pytest.approx(math.pi, abs=1e-7)
    assert theta[2].item() == pytest.approx(0.0, abs=1e-7)
    theta.sum().backward()
    assert cos.grad[0].item() == 0.0 and cos.grad[3].item() == 0.0
    margin = ArcFaceMargin(0.5, scale=1.0)
    f = margin.target_logit(cos.detach())
    assert f[0].item() == f[1].item() and f[2].item() == f[3].item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_angle_and_target_logit_are_float32_for_narrow_input(dtype):
    cos = torch.tensor([0.123, -0.777, 0.5], dtype=dtype)
    wide = cos.double()
    theta = __import__("partialfc.losses.margins", fromlist=["x"]).angle_from_cos(cos)
    assert theta.dtype == torch.float32
    np.testing.assert_allclose(theta.numpy(), np.arccos(wide.numpy()), rtol=0, atol=2e-6)
    f = ArcFaceMargin(0.5, scale=1.0).target_logit(cos)
    assert f.dtype == torch.float32
    np.testing.assert_allclose(f.numpy(), np.cos(np.arccos(wide.numpy()) + 0.5), rtol=0, atol=2e-6)


def test_rows_without_target_keep_float32_scaled_cosine_for_bfloat16_input():
    """A row whose class is absent keeps ``s * cos`` computed in float32 (s = 30 is not a power
    of two, so a bfloat16 product would round differently)."""
    cos = (torch.rand(16, 4) * 2 - 1).to(torch.bfloat16)
    target = torch.tensor([-1] * 8 + [1] * 8)
    got = ArcFaceMargin(0.5, scale=30.0)(cos, target)
    assert torch.equal(got[:8], cos[:8].float() * 30.0)
    assert torch.equal(got[8:, [0, 2, 3]], cos[8:, [0, 2, 3]].float() * 30.0)


def test_empty_batch_and_no_columns_return_scaled_cos():
    margin = ArcFaceMargin(0.5, scale=2.0)
    out = margin(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 5) and out.dtype == torch.float32
    out = margin(torch.zeros(3, 0), torch.full((3,), -1))
    assert out.shape == (3, 0)


def test_input_errors_name_the_offending_value():
    margin = ArcFaceMargin(0.5)
    with pytest.raises(ValueError, match=r"target_col must have shape \(3,\)"):
        margin(torch.zeros(3, 5), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="got 9"):  # a valid -1 before the bad value
        margin(torch.zeros(3, 5), torch.tensor([-1, 0, 9]))
    with pytest.raises(ValueError, match="got -3"):
        margin(torch.zeros(3, 5), torch.tensor([0, -1, -3]))
    with pytest.raises(ValueError, match="floating"):
        margin(torch.zeros(3, 5, dtype=torch.long), torch.zeros(3, dtype=torch.long))
