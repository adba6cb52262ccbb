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


# ---------------------------------------------------------------------- ensemble of teachers
def _ensemble_inputs(dtype=torch.float32, b=5, c=6):
    torch.manual_seed(3)
    student = torch.randn(b, 8, dtype=dtype) * 2
    teachers = [
        F.normalize(torch.randn(b, 8, dtype=dtype), dim=1),
        F.normalize(torch.randn(b, 5, dtype=dtype), dim=1),  # another space and size
    ]
    student_cos = torch.rand(b, c, dtype=dtype) * 2 - 1
    teacher_cos = [torch.rand(b, c, dtype=dtype) * 2 - 1 for _ in teachers]
    return student, teachers, student_cos, teacher_cos


def test_ensemble_terms_match_a_sample_by_sample_computation():
    from partialfc.tools.distillation import ensemble_relation_and_kl

    s, ts, s_cos, t_cos = _ensemble_inputs()
    out = ensemble_relation_and_kl(s, ts, s_cos, t_cos, scale=16.0, temperature=2.0)
    b, c = s_cos.shape
    s64 = [[float(v) for v in row] for row in s.double()]
    norms = [math.sqrt(sum(v * v for v in row)) for row in s64]
    squares = []
    for i in range(b):
        for j in range(b):
            if i == j:
                continue
            cos_s = sum(s64[i][d] * s64[j][d] for d in range(8)) / (norms[i] * norms[j])
            cos_t = sum(float(t[i] @ t[j]) for t in ts) / len(ts)  # the ensemble's score
            squares.append((cos_s - cos_t) ** 2)
    assert float(out["relation"]) == pytest.approx(sum(squares) / len(squares), rel=1e-5)

    def softmax(row):
        z = [16.0 * float(v) / 2.0 for v in row]
        top = max(z)
        e = [math.exp(v - top) for v in z]
        return [v / sum(e) for v in e]

    kl = 0.0
    for i in range(b):
        p_s = softmax(s_cos[i])
        per_teacher = [softmax(t[i]) for t in t_cos]
        p_bar = [sum(p[k] for p in per_teacher) / len(t_cos) for k in range(c)]
        kl += sum(p_bar[k] * math.log(p_bar[k] / p_s[k]) for k in range(c))
    assert float(out["kl"]) == pytest.approx(kl / b, rel=1e-5)


def test_ensemble_terms_vanish_when_one_teacher_equals_the_student():
    from partialfc.tools.distillation import ensemble_relation_and_kl

    s, _, s_cos, _ = _ensemble_inputs()
    out = ensemble_relation_and_kl(s, [F.normalize(s, dim=1)], s_cos, [s_cos.clone()], 16.0)
    assert float(out["relation"]) == pytest.approx(0.0, abs=1e-6)
    assert float(out["kl"]) == pytest.approx(0.0, abs=1e-6)
    lone = ensemble_relation_and_kl(
        s[:1], [F.normalize(s[:1], dim=1)], s_cos[:1], [s_cos[:1]], 16.0
    )
    assert float(lone["relation"]) == 0.0  # one sample: no pairs


def test_ensemble_gradcheck_float64_with_respect_to_the_student():
    from partialfc.tools.distillation import ensemble_relation_and_kl

    s, ts, s_cos, t_cos = _ensemble_inputs(torch.float64, b=4, c=3)

    def total(student, student_cos):
        out = ensemble_relation_and_kl(student, ts, student_cos, t_cos, 4.0, 1.5)
        return out["relation"] + out["kl"]

    s.requires_grad_(True)
    s_cos.requires_grad_(True)
    assert torch.autograd.gradcheck(total, (s, s_cos))


class _StubHead:
    """What the term reads from a head: its centers, its margin's scale, K."""

    num_subcenters = 1

    def __init__(self, centers, scale=16.0):
        self.centers, self.margin = centers, ArcFaceMargin(0.5, scale)

    def class_centers(self):
        return self.centers

    def angular_margin(self):
        return self.margin


def test_ensemble_term_looks_its_targets_up_by_dataset_index():
    from partialfc.tools.distillation import EnsembleDistillationTerm, ensemble_relation_and_kl
    from partialfc.train.extra_losses import StepContext

    torch.manual_seed(4)
    n, c = 10, 6
    units = [torch.randn(n, 8), torch.randn(n, 5)]
    cosines = [torch.rand(n, c) * 2 - 1, torch.rand(n, c) * 2 - 1]
    term = EnsembleDistillationTerm(units, cosines, relation_weight=30.0, kl_weight=0.5)
    head = _StubHead(torch.randn(c, 8), scale=10.0)
    e = torch.randn(3, 8, requires_grad=True)
    rows = torch.tensor([7, 2, 5])
    out = term(StepContext(torch.zeros(3, 1, 4, 4), e, torch.zeros(3), head, 0, rows))
    s_cos = F.normalize(e, dim=1) @ F.normalize(head.centers, dim=1).T
    expected = ensemble_relation_and_kl(
        e,
        [F.normalize(u[rows], dim=1) for u in units],  # the term normalises the tables' rows
        s_cos,
        [cos[rows] for cos in cosines],
        10.0,
    )
    want = 30.0 * expected["relation"] + 0.5 * expected["kl"]
    assert float(out.loss.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    assert out.diagnostics["relation"] == pytest.approx(
        float(expected["relation"].detach()), rel=1e-6
    )
    out.loss.backward()
    assert e.grad is not None and float(e.grad.abs().sum()) > 0
    other = term(StepContext(None, e, None, head, 0, torch.tensor([0, 1, 3])))
    assert float(other.loss.detach()) != pytest.approx(
        float(out.loss.detach()), rel=1e-3
    )  # other rows, other loss


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"teacher_units": []}, "one embedding table and one cosine table per teacher"),
        ({"teacher_units": [torch.randn(9, 4)]}, "with the N = 9 samples"),
        ({"relation_weight": -1.0}, "relation_weight must be a finite number >= 0"),
        ({"kl_weight": float("nan")}, "kl_weight must be a finite number >= 0"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
    ],
)
def test_ensemble_term_refuses_bad_tables_and_weights(kwargs, message):
    from partialfc.tools.distillation import EnsembleDistillationTerm

    args = {"teacher_units": [torch.randn(10, 4)], "teacher_cosines": [torch.randn(10, 3)]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        EnsembleDistillationTerm(**args)


def test_ensemble_term_needs_the_batch_indices():
    from partialfc.tools.distillation import EnsembleDistillationTerm
    from partialfc.train.extra_losses import StepContext

    term = EnsembleDistillationTerm([torch.randn(4, 8)], [torch.randn(4, 6)])
    ctx = StepContext(None, torch.randn(2, 8), None, _StubHead(torch.randn(6, 8)), 0)
    with pytest.raises(ValueError, match="dataset indices"):
        term(ctx)


def _relation_after_a_tiny_run(run_dir, relation_weight: float) -> list[float]:
    from partialfc.tools.distillation import EnsembleDistillationTerm
    from partialfc.train.engine import Trainer
    from tests.train.helpers import TINY_CNN_CONFIG, omniglot_subset, tiny_cnn, tiny_config

    cfg = tiny_config(
        run_dir, "data.batch_size=40", "train.epochs=3", "optim.lr=0.02", "model.embedding_dim=32"
    )
    data = omniglot_subset(20)
    labels = torch.from_numpy(data.labels)
    torch.manual_seed(6)
    units, cosines = [], []
    for dim in (16, 12):  # two teachers: a random code per class, plus noise per image
        codes = F.normalize(torch.randn(20, dim), dim=1)
        units.append(F.normalize(codes[labels] + 0.3 * torch.randn(len(labels), dim), dim=1))
        cosines.append(units[-1] @ codes.T)
    term = EnsembleDistillationTerm(units, cosines, relation_weight, kl_weight=0.0)
    trainer = Trainer(
        cfg,
        backbone=tiny_cnn(0),
        model_config=TINY_CNN_CONFIG,
        train_set=data,
        extra_losses=[term],
    )
    trainer.fit()
    records = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").open()]
    return [r["terms"]["ensemble_distill"]["relation"] for r in records if r["kind"] == "train"]


def test_ensemble_term_pulls_the_student_towards_the_teachers_similarities(tmp_path):
    taught = _relation_after_a_tiny_run(tmp_path / "a", relation_weight=100.0)
    alone = _relation_after_a_tiny_run(tmp_path / "b", relation_weight=0.0)  # logged only
    assert len(taught) == len(alone) == 30
    assert taught[0] == pytest.approx(alone[0], rel=1e-6)  # same first batch, same model
    # measured: mean of the last 10 steps 0.090 with the term against 0.143 without
    assert sum(taught[-10:]) < 0.8 * sum(alone[-10:])
