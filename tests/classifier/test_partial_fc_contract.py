"""Partial FC's contract in one process, value by value: the exact error messages of every
misuse, the boundaries of label validation, the record an accumulated or staged step hands to
the optimizer, input dtypes, the PFC* threshold at equality, and the shift of each sample's
logits by its own maximum."""

from __future__ import annotations

import math
import re

import pytest
import torch

from partialfc.classifier import PartialFC, RowSparseSGD
from partialfc.classifier.diagnostics import partial_fc_diagnostics
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import dense_reference

D = 8


def _batch(c, b=12, seed=0):
    gen = torch.Generator().manual_seed(2000 + seed)
    return torch.randn(b, D, generator=gen), torch.randint(0, c, (b,), generator=gen)


def _exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_misuse_messages_are_exact():
    pfc = PartialFC(20, D, ArcFaceMargin(), sample_rate=0.5, init_std=0.3)
    x, y = _batch(20)
    pfc(x, y)
    with pytest.raises(RuntimeError, match=_exact(
        "PartialFC: center gradients need loss.backward() first"
    )):  # fmt: skip
        pfc.active_rows.center_grad()
    with pytest.raises(RuntimeError, match=_exact(
        "PartialFC: optimizer.step() called before loss.backward() for the last forward"
    )):  # fmt: skip
        pfc.consume_active_rows()
    stale = pfc(x, y)
    pfc(x, y)
    with pytest.raises(RuntimeError, match=_exact(
        "PartialFC: backward through a stale forward (another forward reused the score "
        "buffer); call backward before the next forward"
    )):  # fmt: skip
        stale.backward()
    pfc.discard_step()
    with pytest.raises(ValueError, match=_exact(
        "PartialFC: the global batch is empty on every rank"
    )):  # fmt: skip
        pfc(torch.zeros(0, D), torch.zeros(0, dtype=torch.long))
    # an accumulated step: a second micro-batch before the first one's backward
    pfc.prepare_step(y)
    pfc(x[:6], y[:6])
    with pytest.raises(RuntimeError, match=_exact(
        "PartialFC: backward the micro-batch before the next forward"
    )):  # fmt: skip
        pfc(x[6:], y[6:])
    pfc.discard_step()
    pfc.prepare_step(y[:6])
    unplanned = torch.tensor([int(c) for c in range(20) if c not in y[:6].tolist()][:1])
    with pytest.raises(ValueError, match=_exact(
        "PartialFC: a micro-batch holds labels that prepare_step() was not given; pass the "
        "labels of all micro-batches of the step"
    )):  # fmt: skip
        pfc(x[:1], unplanned)


@pytest.mark.parametrize("bad", [[-1], [20], [0, 20], [-1, 19]])
def test_prepare_step_refuses_each_label_outside_the_classes(bad):
    pfc = PartialFC(20, D, ArcFaceMargin())
    with pytest.raises(ValueError, match=_exact(
        "PartialFC.prepare_step: labels outside [0, 20)"
    )):  # fmt: skip
        pfc.prepare_step(torch.tensor(bad))
    pfc.prepare_step(torch.tensor([0, 19], dtype=torch.int32))  # both ends are classes
    assert pfc.sampling_step == 1


def test_accumulated_record_keeps_its_step_and_the_staged_cache():
    """Micro-batches of one planned step hand one record to the optimizer: it names the step
    the active set was drawn for, and a staged table (host storage next to a GPU, forced here)
    keeps its device cache through every micro-batch, so both give the same centers."""
    kw = dict(sample_rate=0.3, init_std=0.3, seed=7, storage_dtype=torch.bfloat16)
    direct = PartialFC(40, D, ArcFaceMargin(), **kw)
    staged = PartialFC(40, D, ArcFaceMargin(), **kw)
    staged.centers.staged = True
    for step in range(2):
        x, y = _batch(40, seed=step)
        for pfc in (direct, staged):
            opt = RowSparseSGD(pfc, lr=0.2)
            pfc.prepare_step(y)
            for part in (slice(0, 6), slice(6, 12)):
                pfc(x[part], y[part]).backward()
            record = pfc.active_rows
            assert record.step == step and pfc.sampling_step == step + 1
            assert (record.weight_cache is not None) == (pfc is staged)
            opt.step()
    assert torch.equal(direct.centers.data, staged.centers.data)


def test_low_precision_embeddings_are_normalised_in_float32():
    pfc = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), init_std=0.3)
    x, y = _batch(20)
    x16 = x.bfloat16()
    loss16 = pfc(x16, y)
    pfc.discard_step()
    loss32 = pfc(x16.float(), y)
    assert loss16.dtype == torch.float32 and torch.equal(loss16, loss32)


def test_pfc_star_keeps_a_negative_exactly_at_the_threshold():
    """PFC* drops negatives with cosine *above* the threshold: with threshold 0, a negative
    at cosine exactly 0 stays in the softmax, one at cosine 0.447 is dropped."""
    s, m = 4.0, 0.5
    pfc = PartialFC(4, 2, ArcFaceMargin(m, s), negative_cos_threshold=0.0, update="dense")
    centers = [[0.6, 0.8], [0.0, 1.0], [0.5, 1.0], [-1.0, 0.0]]  # cos 0.6 (target), 0, 0.447, -1
    with torch.no_grad():
        pfc.weight.copy_(torch.tensor(centers))
    loss = pfc(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    target = s * math.cos(math.acos(0.6) + m)
    expected = math.log(math.exp(target) + math.exp(0.0) + math.exp(-s)) - target
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_diagnostics_pass_their_seed_to_the_class_sample():
    """With more classes than MICS samples (512) the sampled classes depend on the seed."""
    pfc = PartialFC(2000, 4, ArcFaceMargin(), init_std=0.3)
    x, y = _batch(2000, b=6)[0][:, :4], _batch(2000, b=6)[1]
    pfc(x, y)
    default = pfc.diagnostics(x, y)
    assert default == partial_fc_diagnostics(x, y, pfc, seed=0)
    other = pfc.diagnostics(x, y, seed=5)
    assert other == partial_fc_diagnostics(x, y, pfc, seed=5)
    assert other["mics"] != default["mics"]


THRESHOLD_RANGE = "negative_cos_threshold must be in [-1, 1] or None, got "
REFUSALS = [
    (dict(margin=lambda c, t: c), "margin must be a CombinedMargin, got function"),
    (dict(num_classes=True), "num_classes must be a positive int, got True"),
    (dict(num_classes=0), "num_classes must be a positive int, got 0"),
    (dict(num_classes=2.0), "num_classes must be a positive int, got 2.0"),
    (dict(embedding_dim=0), "embedding_dim must be a positive int, got 0"),
    (dict(embedding_dim="8"), "embedding_dim must be a positive int, got '8'"),
    (dict(num_subcenters=0), "num_subcenters must be an int >= 1, got 0"),
    (dict(num_subcenters=2.0), "num_subcenters must be an int >= 1, got 2.0"),
    (dict(negative_cos_threshold=-1.5), THRESHOLD_RANGE + "-1.5"),
    (dict(negative_cos_threshold=1.5), THRESHOLD_RANGE + "1.5"),
    (dict(update="Dense"), 'update must be "sparse" or "dense", got \'Dense\''),
    (
        dict(backbone_grad_reduction="SUM"),
        'backbone_grad_reduction must be "mean" or "sum", got \'SUM\'',
    ),
    (
        dict(storage_dtype=torch.float16),
        "storage_dtype must be one of (torch.float32, torch.bfloat16), got torch.float16",
    ),
    (
        dict(update="dense", storage_device="cpu"),
        'update="dense" keeps a float32 table on the compute device',
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), REFUSALS)
def test_constructor_refusals_name_the_argument(kwargs, message):
    args = dict(num_classes=10, embedding_dim=D, margin=ArcFaceMargin())
    with pytest.raises(ValueError, match=_exact(message)):
        PartialFC(**{**args, **kwargs})


def test_constructor_accepts_the_boundaries_and_keeps_its_settings():
    for kwargs in (
        dict(num_classes=1),
        dict(embedding_dim=1),
        dict(negative_cos_threshold=-1.0),
        dict(negative_cos_threshold=1.0),
        dict(backbone_grad_reduction="sum"),
        dict(sample_rate=1),
    ):
        PartialFC(**{**dict(num_classes=10, embedding_dim=D, margin=ArcFaceMargin()), **kwargs})
    pfc = PartialFC(10, D, ArcFaceMargin(), sample_rate=0.5, num_subcenters=2,
                    negative_cos_threshold=0.4, storage_dtype=torch.bfloat16,
                    backbone_grad_reduction="sum")  # fmt: skip
    assert pfc.extra_repr() == (
        "num_classes=10, embedding_dim=8, sample_rate=0.5, num_subcenters=2, "
        "negative_cos_threshold=0.4, update='sparse', storage_dtype=torch.bfloat16, "
        "compute=float32 (float32), rank=0/1, classes=[0, 10)"
    )
    assert pfc.backbone_grad_reduction == "sum" and pfc.process_group is None
    for path in ("native", "emulated"):
        precision = PartialFC(10, D, ArcFaceMargin(), compute_dtype="bfloat16", gemm_path=path)
        assert precision.precision.path == path


def test_initial_centers_across_the_65536_class_chunk_boundary():
    """Rows are drawn per chunk of 65536 classes, chunk j from seed * 1_000_003 + j; every
    window of classes, inside a chunk or across the boundary, is a slice of the full table."""
    from partialfc.classifier import init_center_rows

    chunk, extra, d, k, seed, std = 65536, 41, 2, 1, 5, 0.5
    c = chunk + extra
    full = init_center_rows(c, d, k, seed, 0, c, std=std)
    first = torch.randn(chunk * k, d, generator=torch.Generator().manual_seed(seed * 1_000_003))
    second = torch.randn(
        extra * k, d, generator=torch.Generator().manual_seed(seed * 1_000_003 + 1)
    )
    assert torch.equal(full[: chunk * k], first * std)
    assert torch.equal(full[chunk * k :], second * std)
    for start, stop in [(65530, 65537), (65536, 65537), (65535, 65536), (65536, c), (10, c)]:
        assert torch.equal(init_center_rows(c, d, k, seed, start, stop, std=std), full[start:stop])


def test_make_optimizer_passes_every_setting():
    from partialfc.classifier import RowSparseAdamW
    from partialfc.losses.contract import OptimizerSettings

    sparse = PartialFC(10, D, ArcFaceMargin())
    sgd = sparse.make_optimizer(OptimizerSettings("sgd", lr=0.3, momentum=0.7, weight_decay=0.2))
    assert type(sgd) is RowSparseSGD
    assert sgd.defaults == dict(lr=0.3, momentum=0.7, weight_decay=0.2, nesterov=False)
    settings = OptimizerSettings("adamw", lr=0.3, betas=[0.8, 0.9], eps=1e-4, weight_decay=0.2)
    adamw = sparse.make_optimizer(settings)
    assert type(adamw) is RowSparseAdamW
    assert adamw.defaults == dict(lr=0.3, betas=(0.8, 0.9), eps=1e-4, weight_decay=0.2)
    dense = PartialFC(10, D, ArcFaceMargin(), update="dense")
    torch_sgd = dense.make_optimizer(OptimizerSettings("sgd", lr=0.3, momentum=0.7))
    assert type(torch_sgd) is torch.optim.SGD and torch_sgd.defaults["momentum"] == 0.7
    assert torch_sgd.param_groups[0]["params"] == [dense.weight]
    with pytest.raises(ValueError, match=_exact("optimizer name='lamb': choose sgd or adamw")):
        sparse.make_optimizer(OptimizerSettings("lamb"))


def test_each_sample_is_shifted_by_its_own_maximum():
    """With s = 64 a sample near a negative center (top logit +63.7) and one whose target is
    2.6 rad away and whose negatives are opposite it (every logit below -63.9) are 127 apart:
    shifting both by the batch maximum would underflow the second sample's exp to 0 in float32.
    The loss stays finite and equals the float64 reference."""
    pfc = PartialFC(3, 2, ArcFaceMargin(0.5, 64.0), update="dense")
    phi = math.pi - 2.6  # class 1 is 2.6 rad from sample 2 = (-1, 0)
    with torch.no_grad():
        pfc.weight.copy_(torch.tensor([[1.0, 0.0], [math.cos(phi), math.sin(phi)], [1.0, 0.0]]))
    x, y = torch.tensor([[1.0, 0.1], [-1.0, 0.0]]), torch.tensor([0, 1])
    loss = pfc(x, y)
    ref_loss, _, _ = dense_reference(x, pfc.weight.detach(), y, scale=64.0, m2_rad=0.5)
    assert math.isfinite(loss.item())
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)


def test_labels_of_another_integer_dtype_give_the_same_loss():
    pfc = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), sample_rate=0.5, init_std=0.3)
    x, y = _batch(20)
    with torch.no_grad():
        expected = pfc(x, y)
        for dtype in (torch.int32, torch.int16, torch.uint8):
            assert torch.equal(pfc(x, y.to(dtype)), expected)


def test_plain_steps_record_their_own_step_and_refuse_an_unapplied_one():
    pfc = PartialFC(20, D, ArcFaceMargin(), sample_rate=0.5, init_std=0.3)
    opt = RowSparseSGD(pfc, lr=0.1)
    x, y = _batch(20)
    for step in range(3):
        pfc(x, y).backward()
        assert pfc.active_rows.step == step
        opt.step()
    pfc(x, y).backward()
    with pytest.raises(RuntimeError, match=_exact(
        "PartialFC: the previous step's center gradients were never applied; call "
        "optimizer.step() between steps, or prepare_step() to accumulate gradients over "
        "several micro-batches"
    )):  # fmt: skip
        pfc(x, y)


def test_embeddings_that_are_not_a_tensor_are_named():
    pfc = PartialFC(10, D, ArcFaceMargin())
    with pytest.raises(ValueError, match=_exact(
        "PartialFC (rank 0): local_embeddings must be a 2-D tensor (B, d), got <class 'list'>"
    )):  # fmt: skip
        pfc([[0.0] * D], torch.tensor([0]))
