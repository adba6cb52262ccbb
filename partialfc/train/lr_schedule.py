"""Learning-rate schedules by step: linear warm-up, then polynomial decay or step drops.

Steps count from 0. With ``W`` warm-up steps and ``T`` total steps, the factor on the base rate is

* warm-up (``t < W``):        ``(t + 1) / W``  — the first step already trains (never lr = 0);
* poly (Partial FC §4.1):     ``(1 − (t − W) / (T − W)) ** power``, power 2;
* step (ArcFace, MS1MV3):     ``gamma ** (number of milestones ≤ t)``, e.g. ÷10 at epochs 8, 14;
* constant:                   ``1``.

The schedule is a pure function of the step; ``apply`` writes ``base_lr · factor`` into every
param group of every optimizer (torch optimizers and the row-sparse head optimizers alike).
"""

from __future__ import annotations

import bisect
import math
from typing import get_args

from partialfc.train.config import ScheduleKind

KINDS = get_args(ScheduleKind)


def warmup_steps(
    warmup_epochs: float, warmup_fraction: float, steps_per_epoch: int, total_steps: int
) -> int:
    """``W = round(warmup_epochs · steps_per_epoch)``, or ``round(warmup_fraction · T)`` when
    ``warmup_epochs`` is 0; at most ``T − 1`` (the schedule must leave one step after warm-up).

    A fraction scales with the length of training: 0.05 is 75 of 1,500 steps, 2 of 30.
    """
    if warmup_epochs > 0:
        steps = round(warmup_epochs * steps_per_epoch)
    else:
        steps = round(warmup_fraction * total_steps)
    return max(0, min(steps, total_steps - 1))


class WarmupLR:
    """Per-step LR factor. ``milestone_steps`` are only used by ``kind="step"``."""

    def __init__(
        self,
        kind: ScheduleKind,
        total_steps: int,
        warmup_steps: int = 0,
        power: float = 2.0,
        milestone_steps: list[int] | None = None,
        gamma: float = 0.1,
    ):
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be >= 1")
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"warmup_steps={warmup_steps} must be in [0, total_steps={total_steps})"
            )
        self.kind = kind
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.power = float(power)
        self.milestone_steps = sorted(int(m) for m in (milestone_steps or []))
        self.gamma = float(gamma)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "poly":
            span = self.total_steps - self.warmup_steps
            progress = min(1.0, (step - self.warmup_steps) / span)
            return (1.0 - progress) ** self.power
        if self.kind == "step":
            return self.gamma ** bisect.bisect_right(self.milestone_steps, step)
        return 1.0

    @staticmethod
    def remember_base_lr(optimizers) -> None:
        """Store each param group's configured lr as ``base_lr`` (once, before the first step)."""
        for opt in optimizers:
            for group in opt.param_groups:
                group.setdefault("base_lr", group["lr"])

    def apply(self, optimizers, step: int) -> float:
        """Set ``lr = base_lr · factor(step)`` in every group; return the factor."""
        f = self.factor(step)
        if not math.isfinite(f):
            raise ValueError(f"non-finite learning-rate factor at step {step}")
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * f
        return f
