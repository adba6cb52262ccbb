"""Schedules write the margin's float attributes only on step()/update(), never in forward."""

from __future__ import annotations

import pytest
import torch

from partialfc.losses.margins import ArcFaceMargin, CombinedMargin, SphereFaceMargin
from partialfc.losses.schedules import MarginRamp, MarginWarmup, ScaleRamp


def test_warmup_is_zero_then_full():
    margin = ArcFaceMargin(0.5, 64.0)
    schedule = MarginWarmup(margin, warmup_steps=3)
    seen = [margin.m2_rad]
    for _ in range(4):
        schedule.step()
        seen.append(margin.m2_rad)
    assert seen == [0.0, 0.0, 0.0, 0.5, 0.5]
    assert margin.m1 == 1.0 and margin.m3 == 0.0


def test_ramp_is_linear_in_all_three_margins():
    margin = CombinedMargin(m1=1.4, m2_rad=0.4, m3=0.2)
    schedule = MarginRamp(margin, ramp_steps=4, start_step=2)
    values = []
    for step in range(8):
        schedule.update(step)
        values.append((margin.m1, margin.m2_rad, margin.m3))
    strengths = [0, 0, 0, 0.25, 0.5, 0.75, 1, 1]
    for (m1, m2, m3), t in zip(values, strengths, strict=True):
        assert m1 == pytest.approx(1 + 0.4 * t)
        assert m2 == pytest.approx(0.4 * t)
        assert m3 == pytest.approx(0.2 * t)


def test_sphereface_ramp_starts_at_m1_equal_one():
    margin = SphereFaceMargin(1.35)
    MarginRamp(margin, ramp_steps=10)
    assert margin.m1 == 1.0


def test_scale_ramp_and_forward_does_not_move_the_schedule():
    margin = ArcFaceMargin(0.5, 64.0)
    schedule = ScaleRamp(margin, start_scale=16.0, ramp_steps=4)
    assert margin.scale == 16.0
    cos = torch.rand(3, 5)
    margin(cos, torch.tensor([0, 1, 2]))
    margin(cos, torch.tensor([0, 1, 2]))
    assert margin.scale == 16.0
    schedule.step()
    assert margin.scale == pytest.approx(28.0)
    schedule.update(100)
    assert margin.scale == 64.0


def test_state_dict_round_trip_resumes_the_value():
    margin = ArcFaceMargin(0.5)
    schedule = MarginRamp(margin, ramp_steps=10)
    for _ in range(3):
        schedule.step()
    state = schedule.state_dict()
    other_margin = ArcFaceMargin(0.5)
    other = MarginRamp(other_margin, ramp_steps=10)
    other.load_state_dict(state)
    assert other_margin.m2_rad == pytest.approx(0.15) == margin.m2_rad


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup_steps"):
        MarginWarmup(ArcFaceMargin(), warmup_steps=-1)
    with pytest.raises(ValueError, match="ramp_steps"):
        MarginRamp(ArcFaceMargin(), ramp_steps=0)
    with pytest.raises(ValueError, match="start_scale"):
        ScaleRamp(ArcFaceMargin(), start_scale=0.0)
    with pytest.raises(ValueError, match="margin"):
        MarginWarmup(0.5)
