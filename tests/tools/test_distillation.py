"""Distillation objective: independent recomputation, zero at agreement, float64 gradcheck."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from partialfc.losses import ArcFaceMargin, MarginSoftmaxHead
from partialfc.tools.distillation import DistillationLoss


def make(num_classes=6, dim=8, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    head = MarginSoftmaxHead(num_classes, dim, ArcFaceMargin(0.5, 16.0), reuse_buffers=False)
    head = head.to(dtype)
    teacher_centers = torch.randn(num_classes, dim, dtype=dtype)
    return DistillationLoss(head, teacher_centers, **kwargs), head, teacher_centers


def test_terms_match_an_independent_computation():
    loss, head, centers = make()
    s, t = torch.randn(5, 8) * 3, torch.randn(5, 8) * 0.5
    y = torch.tensor([0, 1, 2, 3, 5])
    with torch.no_grad():
        terms = loss.terms(s, t, y)
    cos_st = F.cosine_similarity(s, t)
    assert float(terms["feature"]) == pytest.approx(float((2 - 2 * cos_st).mean()), rel=1e-5)
    w_s = head.weight / head.weight.norm(dim=1, keepdim=True)
    w_t = centers / centers.norm(dim=1, keepdim=True)
    p_s = torch.softmax(16.0 * (s / s.norm(dim=1, keepdim=True)) @ w_s.T, dim=1)
    p_t = torch.softmax(16.0 * (t / t.norm(dim=1, keepdim=True)) @ w_t.T, dim=1)
    kl = (p_t * (p_t.log() - p_s.log())).sum(1).mean().detach()
    assert float(terms["kl"]) == pytest.approx(float(kl), rel=1e-4)
    assert float(terms["head"]) == pytest.approx(float(head(s, y).detach()), rel=1e-6)
    with torch.no_grad():
        total = float(loss(s, t, y))
    expected = float(terms["head"] + 1.0 * terms["feature"] + 0.1 * terms["kl"])
    assert total == pytest.approx(expected, rel=1e-6)


@torch.no_grad()
def test_regression_and_kl_vanish_when_student_equals_teacher():
    loss, head, _ = make()
    loss.teacher_centers.copy_(F.normalize(head.weight.detach(), dim=1))
    s = torch.randn(4, 8)
    terms = loss.terms(s, 2.0 * s, torch.tensor([0, 1, 2, 3]))  # same direction, other norm
    assert float(terms["feature"]) == pytest.approx(0.0, abs=1e-6)
    assert float(terms["kl"]) == pytest.approx(0.0, abs=1e-6)


@torch.no_grad()
def test_temperature_scales_the_kl_weight_by_t_squared():
    loss, _, _ = make(temperature=2.0)
    s, t, y = torch.randn(3, 8), torch.randn(3, 8), torch.tensor([0, 1, 2])
    terms = loss.terms(s, t, y)
    total = terms["head"] + terms["feature"] + 0.1 * 4.0 * terms["kl"]
    assert math.isclose(float(loss(s, t, y)), float(total), rel_tol=1e-6)


def test_gradcheck_float64_with_respect_to_student_embeddings():
    loss, _, _ = make(dtype=torch.float64)
    t = torch.randn(3, 8, dtype=torch.float64)
    y = torch.tensor([0, 2, 4])
    s = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(x, t, y), (s,))


def test_teacher_gets_no_gradient_and_mismatches_are_errors():
    loss, _, _ = make()
    s = torch.randn(2, 8, requires_grad=True)
    t = torch.randn(2, 8, requires_grad=True)
    loss(s, t, torch.tensor([0, 1])).backward()
    assert s.grad is not None and t.grad is None
    with pytest.raises(ValueError, match="feature regression needs the same size"):
        loss.terms(torch.randn(2, 8), torch.randn(2, 4), torch.tensor([0, 1]))
    other, _, _ = make(num_classes=6)
    other.teacher_centers = torch.randn(7, 8)
    with pytest.raises(ValueError, match="needs the same classes"):
        other.terms(torch.randn(2, 8), torch.randn(2, 8), torch.tensor([0, 1]))


# ---------------------------------------------------------------------- in the Trainer
def test_distillation_term_loss_decreases_on_a_tiny_run(tmp_path):
    from partialfc.tools.distillation import DistillationTerm
    from partialfc.train.engine import Trainer
    from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config

    cfg = tiny_config(tmp_path, "data.batch_size=40", "train.epochs=2", "optim.lr=0.02")
    torch.manual_seed(5)
    term = DistillationTerm(tiny_backbone(1), torch.randn(20, 16))  # frozen random teacher
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(20),
        extra_losses=[term],
    )
    teacher_before = [p.clone() for p in term.teacher.parameters()]
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    distill = [r["terms"]["distill"] for r in records if r["kind"] == "train"]
    assert len(distill) == 20
    first, last = distill[0], distill[-1]
    # measured: feature 2.27 -> 0.66, KL 9.1 -> 2.5, total 3.18 -> 0.92
    assert last["feature"] < 0.5 * first["feature"]
    assert last["loss"] < 0.5 * first["loss"]
    assert last["loss"] == pytest.approx(last["feature"] + 0.1 * last["kl"], rel=1e-5)
    teacher_after = list(term.teacher.parameters())
    assert all(torch.equal(a, b) for a, b in zip(teacher_before, teacher_after, strict=True))


def _write_tiny_config(path, run_dir, name, model, dim=16):
    cfg = {
        "model": {"name": model, "embedding_dim": dim},
        "data": {"source": "omniglot", "input_size": 28, "batch_size": 32, "num_workers": 0},
        "head": {"margin": {"m2_rad": 0.3, "scale": 16.0}},
        "train": {"epochs": 0.004, "precision": "fp32", "log_every": 1, "num_threads": 1},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "run": {"output_dir": str(run_dir), "name": name, "progress": False},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_distill_command_runs_end_to_end(tmp_path, bundled_omniglot, capsys):
    from partialfc.cli import main

    teacher_cfg = _write_tiny_config(tmp_path / "t.yaml", tmp_path, "teacher", "iresnet_small")
    assert main(["train", "--config", str(teacher_cfg), "--no-eval"]) == 0
    student_cfg = _write_tiny_config(tmp_path / "s.yaml", tmp_path, "student", "mobilefacenet")
    teacher = str(tmp_path / "teacher")
    assert main(["distill", "--teacher", teacher, "--config", str(student_cfg), "--no-eval"]) == 0
    records = [json.loads(x) for x in (tmp_path / "student" / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and {"classifier", "distill"} <= set(train[-1]["terms"])
    assert (tmp_path / "student" / "checkpoints").is_dir()
    # a student whose embedding size differs from the teacher's is refused, naming both
    args = ["--teacher", teacher, "--config", str(student_cfg), "--set", "model.embedding_dim=8"]
    assert main(["distill", *args]) == 1
    assert "model.embedding_dim=8" in capsys.readouterr().err
