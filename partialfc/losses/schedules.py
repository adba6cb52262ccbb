"""Margin and scale schedules (the "initialisation blow-up" of the
ArcFace loss, Deng et al., CVPR 2019, derived below).

At initialisation every target angle is near 90 deg, and a full margin adds tens of nats of loss
before the model has done anything wrong. Two standard remedies:

* :class:`MarginWarmup` — no margin for ``warmup_steps`` steps, then the full margin.
* :class:`MarginRamp` — the margin grows linearly from none to full over ``ramp_steps`` steps.
* :class:`ScaleRamp` — the logit scale grows linearly from ``start_scale`` to the target.

A schedule captures the margin's target values when it is built and writes the plain float
attributes of the :class:`~partialfc.losses.margins.CombinedMargin` only when told to: call
``schedule.step()`` once per optimiser step (or ``schedule.update(step)`` to jump, e.g. after
resuming). Nothing changes inside ``forward``. "No margin" means ``m1 = 1, m2_rad = 0, m3 = 0``;
at strength ``t`` in [0, 1] the margin is ``m1 = 1 + t (m1* - 1), m2_rad = t m2*, m3 = t m3*``.
"""

from __future__ import annotations

from typing import Any

from partialfc.losses.margins import CombinedMargin

__all__ = ["MarginWarmup", "MarginRamp", "ScaleRamp"]


def _check_steps(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


class _Schedule:
    """Common ``step`` / ``update`` / ``state_dict`` for schedules over a margin."""

    def __init__(self, margin: CombinedMargin) -> None:
        if not isinstance(margin, CombinedMargin):
            raise ValueError(f"margin must be a CombinedMargin, got {type(margin).__name__}")
        self.margin = margin
        self.last_step = 0

    def _apply(self, step: int) -> None:
        raise NotImplementedError

    def update(self, step: int) -> None:
        """Set the margin's attributes to their values at optimiser step ``step`` (>= 0)."""
        _check_steps("step", step)
        self.last_step = step
        self._apply(step)
        self.margin.check_hyperparameters()

    def step(self) -> None:
        """Advance one optimiser step."""
        self.update(self.last_step + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.update(int(state["last_step"]))


class _MarginStrength(_Schedule):
    """Interpolates the margin between "none" and the values it had at construction."""

    def __init__(self, margin: CombinedMargin) -> None:
        super().__init__(margin)
        self.target_m1 = margin.m1
        self.target_m2_rad = margin.m2_rad
        self.target_m3 = margin.m3

    def strength(self, step: int) -> float:
        raise NotImplementedError

    def _apply(self, step: int) -> None:
        t = self.strength(step)
        self.margin.m1 = 1.0 + t * (self.target_m1 - 1.0)
        self.margin.m2_rad = t * self.target_m2_rad
        self.margin.m3 = t * self.target_m3


class MarginWarmup(_MarginStrength):
    """No margin for the first ``warmup_steps`` steps, then the full margin.

    Args:
        margin: the margin to drive; its current values are the target.
        warmup_steps: steps with ``m = 0`` (e.g. one epoch). Default 1000.
    """

    def __init__(self, margin: CombinedMargin, warmup_steps: int = 1000) -> None:
        _check_steps("warmup_steps", warmup_steps)
        super().__init__(margin)
        self.warmup_steps = warmup_steps
        self.update(0)

    def strength(self, step: int) -> float:
        return 0.0 if step < self.warmup_steps else 1.0


class MarginRamp(_MarginStrength):
    """Margin strength ``clip((step - start_step) / ramp_steps, 0, 1)``: linear from none to full.

    Args:
        margin: the margin to drive; its current values are the target.
        ramp_steps: steps from no margin to the full margin (> 0). Default 1000.
        start_step: step at which the ramp begins (no margin before). Default 0.
    """

    def __init__(self, margin: CombinedMargin, ramp_steps: int = 1000, start_step: int = 0) -> None:
        _check_steps("ramp_steps", ramp_steps)
        _check_steps("start_step", start_step)
        if ramp_steps == 0:
            raise ValueError("ramp_steps must be > 0 (use MarginWarmup for a switch)")
        super().__init__(margin)
        self.ramp_steps = ramp_steps
        self.start_step = start_step
        self.update(0)

    def strength(self, step: int) -> float:
        return min(1.0, max(0.0, (step - self.start_step) / self.ramp_steps))


class ScaleRamp(_Schedule):
    """Scale linear from ``start_scale`` to the margin's current scale over ``ramp_steps`` steps.

    Args:
        margin: the margin to drive; its current ``scale`` is the target.
        start_scale: scale at step 0 (> 0).
        ramp_steps: steps to reach the target (> 0). Default 1000.
    """

    def __init__(self, margin: CombinedMargin, start_scale: float, ramp_steps: int = 1000) -> None:
        _check_steps("ramp_steps", ramp_steps)
        if ramp_steps == 0:
            raise ValueError("ramp_steps must be > 0")
        if not isinstance(start_scale, (int, float)) or not start_scale > 0:
            raise ValueError(f"start_scale must be > 0, got {start_scale!r}")
        super().__init__(margin)
        self.target_scale = margin.scale
        self.start_scale = float(start_scale)
        self.ramp_steps = ramp_steps
        self.update(0)

    def _apply(self, step: int) -> None:
        t = min(1.0, step / self.ramp_steps)
        self.margin.scale = self.start_scale + t * (self.target_scale - self.start_scale)
