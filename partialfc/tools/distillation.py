"""Knowledge distillation objective for a small student backbone (seed 003, "Hyperparameters").

For a batch with student embeddings ``s``, teacher embeddings ``t`` (same images, teacher
frozen) and labels ``y``::

    L = L_head(s, y)                                   # the student's ArcFace head
      + feature_weight · mean_i ‖ŝ_i − t̂_i‖²          # L2 feature regression, weight 1.0
      + kl_weight · T² · mean_i KL(p_t,i ‖ p_s,i)      # KL on logits, weight 0.1

``ŝ, t̂`` are L2-normalised, so the regression term is ``2 − 2 cos(s, t)`` per sample.
``p_t = softmax(scale · cos(t, W_t) / T)`` uses the teacher's class centers ``W_t``, ``p_s``
the same with the student's own centers and no margin; ``T`` is the temperature (1 by
default, the ``T²`` keeps gradient magnitudes independent of it).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _at_least_fp32(x: Tensor) -> Tensor:
    """fp16/bf16 → fp32 (the loss math runs in fp32); fp32/fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class DistillationLoss(nn.Module):
    """ArcFace + feature regression + logit KL, with the student's head inside.

    Args:
        head: the student's margin head, called as ``head(embeddings, labels) -> loss`` and
            exposing ``cosines(embeddings) -> (cos, argmax)`` (e.g. ``MarginSoftmaxHead``).
        teacher_centers: ``(num_classes, d)`` teacher classifier rows (any norm).
        feature_weight: weight of the L2 feature regression; default 1.0.
        kl_weight: weight of the KL term; default 0.1.
        temperature: softmax temperature of the KL term; default 1.0.
        scale: logit scale for the KL term; default the head margin's ``scale``.
    """

    def __init__(
        self,
        head: nn.Module,
        teacher_centers: Tensor,
        feature_weight: float = 1.0,
        kl_weight: float = 0.1,
        temperature: float = 1.0,
        scale: float | None = None,
    ):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.head = head
        self.register_buffer("teacher_centers", F.normalize(teacher_centers.detach(), dim=1))
        self.feature_weight = float(feature_weight)
        self.kl_weight = float(kl_weight)
        self.temperature = float(temperature)
        self.scale = float(scale if scale is not None else head.margin.scale)

    def terms(self, student: Tensor, teacher: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """The three unweighted terms: ``{"head", "feature", "kl"}``."""
        if student.shape != teacher.shape:
            raise ValueError(
                f"student embeddings {tuple(student.shape)} and teacher embeddings "
                f"{tuple(teacher.shape)} differ; feature regression needs the same size"
            )
        teacher = _at_least_fp32(teacher.detach())
        t_hat = F.normalize(teacher, dim=1)
        student = _at_least_fp32(student)
        s_hat = F.normalize(student, dim=1)
        feature = (s_hat - t_hat).square().sum(1).mean()
        student_cos, _ = self.head.cosines(student)
        teacher_cos = t_hat @ self.teacher_centers.to(t_hat.dtype).T
        if student_cos.shape != teacher_cos.shape:
            raise ValueError(
                f"student head has {student_cos.shape[1]} classes, teacher "
                f"{teacher_cos.shape[1]}: the KL term needs the same classes"
            )
        log_p_s = F.log_softmax(self.scale * student_cos / self.temperature, dim=1)
        log_p_t = F.log_softmax(self.scale * teacher_cos / self.temperature, dim=1)
        kl = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean")
        return {"head": self.head(student, labels), "feature": feature, "kl": kl}

    def forward(self, student: Tensor, teacher: Tensor, labels: Tensor) -> Tensor:
        t = self.terms(student, teacher, labels)
        return (
            t["head"]
            + self.feature_weight * t["feature"]
            + self.kl_weight * self.temperature**2 * t["kl"]
        )


# ---------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("teacher", help="teacher checkpoint")
    parser.add_argument("--config", help="student training config (YAML)")


def run(args: argparse.Namespace) -> int:
    print(
        "partialfc distill: training with a teacher is not available from the command line: "
        "the training engine has no hook for an extra loss term yet. Use "
        "partialfc.tools.distillation.DistillationLoss in your own loop.",
        file=sys.stderr,
    )
    return 2


__all__ = ["DistillationLoss", "add_arguments", "run"]
