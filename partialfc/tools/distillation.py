"""Knowledge distillation objective for a small student backbone (feature regression and logit
KL, as in ArcFace, Deng et al., IEEE TPAMI 2022).

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
import math
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _at_least_fp32(x: Tensor) -> Tensor:
    """fp16/bf16 → fp32 (the loss math runs in fp32); fp32/fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _teacher_cosines(teacher: Tensor, unit_centers: Tensor, num_subcenters: int = 1) -> Tensor:
    from partialfc.losses.subcenter import max_over_subcenters

    t_hat = F.normalize(_at_least_fp32(teacher.detach()), dim=1)
    cos = t_hat @ unit_centers.to(t_hat.dtype).T
    return max_over_subcenters(cos, num_subcenters)[0] if num_subcenters > 1 else cos


def _check_same_size(student: Tensor, teacher: Tensor) -> None:
    if student.shape != teacher.shape:
        raise ValueError(
            f"student embeddings {tuple(student.shape)} and teacher embeddings "
            f"{tuple(teacher.shape)} differ; feature regression needs the same size"
        )


def feature_and_kl(
    student: Tensor,
    teacher: Tensor,
    student_cos: Tensor,
    teacher_cos: Tensor,
    scale: float,
    temperature: float = 1.0,
) -> dict[str, Tensor]:
    """``{"feature": mean ‖ŝ − t̂‖², "kl": mean KL(p_t ‖ p_s)}`` (unweighted, fp32).

    ``student_cos`` / ``teacher_cos`` are ``(B, C)`` class cosines of the two models over the
    same classes; ``p = softmax(scale · cos / T)``. Only ``student`` and ``student_cos`` carry
    gradient.
    """
    _check_same_size(student, teacher)
    if student_cos.shape != teacher_cos.shape:
        raise ValueError(
            f"student head has {student_cos.shape[1]} classes, teacher "
            f"{teacher_cos.shape[1]}: the KL term needs the same classes"
        )
    t_hat = F.normalize(_at_least_fp32(teacher.detach()), dim=1)
    s_hat = F.normalize(_at_least_fp32(student), dim=1)
    feature = (s_hat - t_hat).square().sum(1).mean()
    log_p_s = F.log_softmax(scale * _at_least_fp32(student_cos) / temperature, dim=1)
    log_p_t = F.log_softmax(scale * teacher_cos.detach().float() / temperature, dim=1)
    kl = F.kl_div(log_p_s, log_p_t.to(log_p_s.dtype), log_target=True, reduction="batchmean")
    return {"feature": feature, "kl": kl}


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
        _check_same_size(student, teacher)
        student = _at_least_fp32(student)
        student_cos, _ = self.head.cosines(student)
        teacher_cos = _teacher_cosines(teacher, self.teacher_centers)
        out = feature_and_kl(
            student, teacher, student_cos, teacher_cos, self.scale, self.temperature
        )
        out["head"] = self.head(student, labels)
        return out

    def forward(self, student: Tensor, teacher: Tensor, labels: Tensor) -> Tensor:
        t = self.terms(student, teacher, labels)
        return (
            t["head"]
            + self.feature_weight * t["feature"]
            + self.kl_weight * self.temperature**2 * t["kl"]
        )


def _student_class_cosines(ctx) -> tuple[Tensor, float]:
    """The student's ``(B, C)`` class cosines against a detached copy of its head's current
    centers (max over sub-centers), and its margin's scale; refuses heads without both."""
    from partialfc.losses.subcenter import max_over_subcenters

    head = ctx.head
    centers, margin = head.class_centers(), head.angular_margin()
    if centers is None or margin is None:
        raise ValueError(
            f"distillation needs a student head with class centers and an angular margin "
            f"(head.kind=partial_fc or margin_softmax), got {type(head).__name__}"
        )
    with torch.no_grad():
        centers = F.normalize(centers.to(ctx.embeddings.device).float(), dim=1)
    cos = F.normalize(ctx.embeddings, dim=1) @ centers.T
    if head.num_subcenters > 1:
        cos = max_over_subcenters(cos, head.num_subcenters)[0]
    return cos, margin.scale


# ---------------------------------------------------------------------- in the Trainer
class DistillationTerm:
    """Trainer extra loss: ``feature_weight · ‖ŝ − t̂‖² + kl_weight · T² · KL(p_t ‖ p_s)``.

    The ArcFace part of the objective is the Trainer's own Partial FC head; this term adds the
    feature regression to the frozen teacher and the KL between the teacher's softmax over its
    centers and the student's softmax over the student head's current centers (a detached
    copy: the KL moves the student's embeddings, the ArcFace loss moves its centers), both at
    the student margin's ``scale`` and without margin. Both heads must cover the same classes.

    Args:
        teacher: frozen teacher backbone (put in eval mode, no gradient), same input as the
            student.
        teacher_centers: ``(C · K_t, d)`` teacher center table (class-major sub-centers).
        teacher_subcenters: ``K_t``; default 1.
        feature_weight: weight of the feature term; default 1.0.
        kl_weight: weight of the KL term; default 0.1.
        temperature: softmax temperature of the KL term; default 1.0.
    """

    name = "distill"

    def __init__(
        self,
        teacher: nn.Module,
        teacher_centers: Tensor,
        teacher_subcenters: int = 1,
        feature_weight: float = 1.0,
        kl_weight: float = 0.1,
        temperature: float = 1.0,
    ):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_centers = F.normalize(teacher_centers.detach().float(), dim=1)
        self.teacher_subcenters = int(teacher_subcenters)
        self.feature_weight = float(feature_weight)
        self.kl_weight = float(kl_weight)
        self.temperature = float(temperature)

    def __call__(self, ctx):
        from partialfc.train.extra_losses import LossTerm

        student_cos, scale = _student_class_cosines(ctx)
        with torch.no_grad():
            device = ctx.images.device
            teacher = self.teacher.to(device)(ctx.images).float()
        self.teacher_centers = self.teacher_centers.to(device)
        teacher_cos = _teacher_cosines(teacher, self.teacher_centers, self.teacher_subcenters)
        t = feature_and_kl(
            ctx.embeddings, teacher, student_cos, teacher_cos, scale, self.temperature
        )
        loss = self.feature_weight * t["feature"] + self.kl_weight * self.temperature**2 * t["kl"]
        return LossTerm(
            loss,
            {
                "feature": float(t["feature"].detach()),
                "kl": float(t["kl"].detach()),
                "loss": float(loss.detach()),
            },
        )


def ensemble_relation_and_kl(
    student: Tensor,
    teacher_units: list[Tensor],
    student_cos: Tensor,
    teacher_cos: list[Tensor],
    scale: float,
    temperature: float = 1.0,
) -> dict[str, Tensor]:
    """``{"relation": mean_{i≠j} (ŝ_iᵀŝ_j − ḡ_ij)², "kl": mean_i KL(p̄_i ‖ p_s,i)}`` (fp32).

    ``teacher_units[k]`` is teacher k's ``(B, d_k)`` unit embeddings of the batch; the target
    cosine ``ḡ_ij = (1/K) Σ_k t̂_kiᵀ t̂_kj`` is the score of the K teachers as one ensemble of
    concatenated normalised embeddings, so the teachers may embed in different spaces and
    sizes. ``p̄ = (1/K) Σ_k softmax(scale · cos_k / T)`` averages the teachers' class
    probabilities (Hinton, Vinyals & Dean, "Distilling the Knowledge in a Neural Network",
    NIPS 2014 Deep Learning Workshop, section 2); the relation term matches pairwise
    similarities rather than features (Park et al., "Relational Knowledge Distillation",
    CVPR 2019; Tung & Mori, "Similarity-Preserving Knowledge Distillation", ICCV 2019).
    Only ``student`` and ``student_cos`` carry gradient; a batch of one has no pairs
    (relation 0).
    """
    if not teacher_units or len(teacher_units) != len(teacher_cos):
        raise ValueError(
            f"need one embedding and one cosine table per teacher, got {len(teacher_units)} "
            f"and {len(teacher_cos)}"
        )
    for k, (units, cos) in enumerate(zip(teacher_units, teacher_cos, strict=True)):
        if units.shape[0] != student.shape[0] or cos.shape != student_cos.shape:
            raise ValueError(
                f"teacher {k}: embeddings {tuple(units.shape)} and class cosines "
                f"{tuple(cos.shape)} do not fit the student's {tuple(student.shape)} and "
                f"{tuple(student_cos.shape)} (same samples, same classes)"
            )
    s_hat = F.normalize(_at_least_fp32(student), dim=1)
    target = torch.stack([t.detach().float() @ t.detach().float().T for t in teacher_units])
    target = target.mean(0)
    b = s_hat.shape[0]
    off_diagonal = ~torch.eye(b, dtype=torch.bool, device=s_hat.device)
    diff = (s_hat @ s_hat.T - target)[off_diagonal]
    relation = diff.square().mean() if b > 1 else s_hat.sum() * 0.0
    log_p_s = F.log_softmax(scale * _at_least_fp32(student_cos) / temperature, dim=1)
    log_p_k = torch.stack(
        [F.log_softmax(scale * c.detach().float() / temperature, dim=1) for c in teacher_cos]
    )
    log_p_bar = torch.logsumexp(log_p_k, dim=0) - math.log(len(teacher_cos))
    kl = F.kl_div(log_p_s, log_p_bar.to(log_p_s.dtype), log_target=True, reduction="batchmean")
    return {"relation": relation, "kl": kl}


class EnsembleDistillationTerm:
    """Trainer extra loss distilling an ensemble of K teachers from targets computed once::

        relation_weight · mean_{i≠j} (ŝ_iᵀŝ_j − ḡ_ij)² + kl_weight · T² · KL(p̄ ‖ p_s)

    (:func:`ensemble_relation_and_kl`). The targets are the teachers' unit embeddings and
    class cosines of every training sample, computed once on the un-augmented images
    (:func:`ensemble_targets`) and looked up by the batch's dataset indices, so a step costs
    no teacher forward pass; the student sees its augmented copy. Memory: ``N · (d_k + C)``
    floats per teacher, meant for training sets that fit in memory (for large sets,
    :class:`DistillationTerm` runs one teacher per step). The student's class cosines use
    a detached copy of its head's current centers (the head's own loss moves them), at the
    student margin's ``scale`` and without margin.

    Args:
        teacher_units: K tensors ``(N, d_k)``, unit rows, indexed like the training set.
        teacher_cosines: K tensors ``(N, C)``: each teacher's class cosines (max over its
            sub-centers) of each sample, over the student's C classes in the same order.
        relation_weight: default 100 (the relation term's squared cosine errors are small:
            about 0.01 per pair once training has started).
        kl_weight: default 1.0.
        temperature: default 1.0.
    """

    name = "ensemble_distill"

    def __init__(
        self,
        teacher_units: list[Tensor],
        teacher_cosines: list[Tensor],
        relation_weight: float = 100.0,
        kl_weight: float = 1.0,
        temperature: float = 1.0,
    ):
        if not teacher_units or len(teacher_units) != len(teacher_cosines):
            raise ValueError(
                f"need one embedding table and one cosine table per teacher, got "
                f"{len(teacher_units)} and {len(teacher_cosines)}"
            )
        n = teacher_units[0].shape[0]
        for k, (units, cos) in enumerate(zip(teacher_units, teacher_cosines, strict=True)):
            if units.ndim != 2 or cos.ndim != 2 or units.shape[0] != n or cos.shape[0] != n:
                raise ValueError(
                    f"teacher {k}: embeddings {tuple(units.shape)} and cosines "
                    f"{tuple(cos.shape)} must be (N, d) and (N, C) with the N = {n} samples "
                    "of teacher 0"
                )
        for name, value, low_open in (
            ("relation_weight", relation_weight, False),
            ("kl_weight", kl_weight, False),
            ("temperature", temperature, True),
        ):
            if not math.isfinite(value) or value < 0 or (low_open and value == 0):
                bound = "> 0" if low_open else ">= 0"
                raise ValueError(f"{name} must be a finite number {bound}, got {value}")
        self.teacher_units = [F.normalize(u.detach().float(), dim=1) for u in teacher_units]
        self.teacher_cosines = [c.detach().float() for c in teacher_cosines]
        self.relation_weight = float(relation_weight)
        self.kl_weight = float(kl_weight)
        self.temperature = float(temperature)

    def __call__(self, ctx):
        from partialfc.train.extra_losses import LossTerm

        if ctx.indices is None:
            raise ValueError("ensemble distillation needs the batch's dataset indices")
        student_cos, scale = _student_class_cosines(ctx)
        device = ctx.embeddings.device
        rows = ctx.indices.to(torch.long).cpu()
        units = [u[rows].to(device) for u in self.teacher_units]
        cosines = [c[rows].to(device) for c in self.teacher_cosines]
        t = ensemble_relation_and_kl(
            ctx.embeddings, units, student_cos, cosines, scale, self.temperature
        )
        loss = self.relation_weight * t["relation"] + self.kl_weight * self.temperature**2 * t["kl"]
        return LossTerm(
            loss,
            {
                "relation": float(t["relation"].detach()),
                "kl": float(t["kl"].detach()),
                "loss": float(loss.detach()),
            },
        )


def ensemble_targets(
    specs: list[str], images, batch_size: int = 256, device="cpu"
) -> tuple[list[Tensor], list[Tensor], list[dict]]:
    """Teachers (run folders or checkpoints) → their unit embeddings ``(N, d_k)`` and class
    cosines ``(N, C)`` of uint8 ``images`` (``(N, H, W[, C])``: the training set, un-augmented,
    in dataset order), and each teacher's :func:`load_teacher` info. A teacher trained at
    another input size, or teachers with different numbers of classes, are refused."""
    from partialfc.backbone.embedding import embed_array
    from partialfc.losses.subcenter import max_over_subcenters

    units, cosines, infos = [], [], []
    height, width = images.shape[1:3]
    for spec in specs:
        backbone, centers, subcenters, info = load_teacher(spec, device)
        size = info["model"].get("kwargs", {}).get("input_size")
        if size is not None and (size, size) != (height, width):
            raise ValueError(
                f"teacher {spec}: trained at {size}x{size}, the images are {height}x{width}"
            )
        raw = torch.from_numpy(embed_array(backbone, images, batch_size, device))
        unit = F.normalize(raw, dim=1)
        cos = unit @ F.normalize(centers.detach().float().cpu(), dim=1).T
        if subcenters > 1:
            cos = max_over_subcenters(cos, subcenters)[0]
        units.append(unit)
        cosines.append(cos)
        infos.append(info)
    classes = {c.shape[1] for c in cosines}
    if len(classes) > 1:
        raise ValueError(f"teachers {specs} have different numbers of classes: {sorted(classes)}")
    return units, cosines, infos


def load_teacher(spec: str, device="cpu") -> tuple[nn.Module, Tensor, int, dict]:
    """A training run folder or checkpoint → ``(backbone, centers, num_subcenters, meta)``.

    ``centers`` is the full ``(C · K, d)`` float32 center table of its head (any kind with
    class centers: Partial FC, margin-softmax, softmax, ProxyNCA).
    """
    from pathlib import Path

    from partialfc.backbone.io import load_backbone_from_checkpoint
    from partialfc.train.builders import load_trained_head
    from partialfc.train.checkpoint import resolve_checkpoint

    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"teacher {spec!r}: no such run folder or checkpoint")
    path = resolve_checkpoint(spec, path)
    backbone, model_config = load_backbone_from_checkpoint(path)
    head, cfg = load_trained_head(path, device)
    centers = head.class_centers()
    if centers is None:
        raise ValueError(f"teacher {spec!r}: its head (head.kind={cfg.head.kind!r}) has no centers")
    num_classes = centers.shape[0] // head.num_subcenters
    info = {"checkpoint": str(path), "model": model_config, "num_classes": num_classes}
    return backbone.to(device), centers, head.num_subcenters, info


# ---------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    from partialfc.train.command import add_arguments as add_train_arguments

    parser.add_argument(
        "--teacher", required=True, help="teacher run folder (newest checkpoint) or checkpoint"
    )
    parser.add_argument("--feature-weight", type=float, default=1.0, help="default 1.0")
    parser.add_argument("--kl-weight", type=float, default=0.1, help="default 0.1")
    parser.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    add_train_arguments(parser, command)


def run(args: argparse.Namespace) -> int:
    """Train the student of ``--config`` with the Trainer plus a :class:`DistillationTerm`."""
    from partialfc.ranges import Range, check_options
    from partialfc.train.command import train_and_report

    try:
        check_options(
            args,
            {
                "--feature-weight": Range(0),
                "--kl-weight": Range(0),
                "--temperature": Range(0, low_open=True),
            },
        )
    except ValueError as err:
        print(f"partialfc distill: {err}", file=sys.stderr)
        return 2

    def make_extra_losses(cfg, device):
        teacher, centers, subcenters, info = load_teacher(args.teacher, device)
        teacher_input = info["model"]["kwargs"].get("input_size")
        if teacher_input is not None and teacher_input != cfg.data.input_size:
            raise ValueError(
                f"teacher {info['checkpoint']} takes {teacher_input}×{teacher_input} inputs, "
                f"the student config data.input_size={cfg.data.input_size}"
            )
        if cfg.model.embedding_dim != centers.shape[1]:
            raise ValueError(
                f"teacher {info['checkpoint']} embeds in {centers.shape[1]} dimensions, the "
                f"student model.embedding_dim={cfg.model.embedding_dim}: feature regression "
                "needs the same size"
            )
        if cfg.head.num_classes and cfg.head.num_classes != info["num_classes"]:
            raise ValueError(
                f"teacher {info['checkpoint']} has {info['num_classes']} classes, the student "
                f"head.num_classes={cfg.head.num_classes}: the KL term needs the same classes"
            )
        term = DistillationTerm(
            teacher, centers, subcenters, args.feature_weight, args.kl_weight, args.temperature
        )
        return [term]

    return train_and_report(args, prog="partialfc distill", make_extra_losses=make_extra_losses)


__all__ = [
    "DistillationLoss",
    "DistillationTerm",
    "EnsembleDistillationTerm",
    "add_arguments",
    "ensemble_relation_and_kl",
    "ensemble_targets",
    "feature_and_kl",
    "load_teacher",
    "run",
]
