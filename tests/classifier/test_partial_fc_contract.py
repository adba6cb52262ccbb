"""Partial FC's contract in one process, value by value: the exact error messages of every
misuse, the boundaries of label validation, the record an accumulated or staged step hands to
the optimizer, input dtypes, the PFC* threshold at equality and two sub-centers per class."""

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


def test_two_subcenters_match_the_dense_reference():
    pfc = PartialFC(13, D, ArcFaceMargin(0.5, 16.0), num_subcenters=2, init_std=0.3, seed=2)
    x, y = _batch(13, b=9, seed=4)
    x = x.requires_grad_(True)
    loss = pfc(x, y)
    loss.backward()
    w = pfc.local_centers_float32()
    ref_loss, ref_gx, _ = dense_reference(x, w, y, scale=16.0, m2_rad=0.5, num_subcenters=2)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_gx, rtol=1e-4, atol=1e-6)


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
