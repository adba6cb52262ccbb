"""Gradient accumulation in Partial FC: one optimizer step over k micro-batches of b equals one
step over one batch of k·b (the negative sample drawn once, from the union of the positives).

Checked on the embedding gradients and on the centers and optimizer state after the step, with
all classes active (r = 1) and with sampled negatives (r < 1), for SGD with momentum and AdamW,
on one process and on 2 gloo ranks (each rank holds half of the classes and half of the batch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.classifier import PartialFC
from partialfc.losses.contract import OptimizerSettings
from partialfc.losses.margins import CombinedMargin
from tests.classifier.reference import assert_close_at_scale
from tests.distributed import run_ranks

NUM_CLASSES, DIM, MICRO, K = 40, 8, 6, 3


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(MICRO * K, DIM, generator=gen)
    y = torch.randint(0, NUM_CLASSES, (MICRO * K,), generator=gen)
    return x, y


def _head(sample_rate: float, optimizer: str, compute_dtype: str = "float32"):
    head = PartialFC(
        NUM_CLASSES,
        DIM,
        CombinedMargin(m2_rad=0.3, scale=16.0),
        sample_rate=sample_rate,
        seed=3,
        compute_dtype=compute_dtype,
        gemm_path="emulated",  # float32 products on every CPU: only the summation order differs
    )
    settings = OptimizerSettings(name=optimizer, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return head, head.make_optimizer(settings)


def _one_batch(x, y, sample_rate, optimizer, steps=2, compute_dtype="float32"):
    head, opt = _head(sample_rate, optimizer, compute_dtype)
    grads = []
    for _ in range(steps):
        e = x.clone().requires_grad_(True)
        head(e, y).backward()
        grads.append(e.grad)
        opt.step()
    return head, opt, grads


def _micro_batches(x, y, sample_rate, optimizer, steps=2, k=K, compute_dtype="float32"):
    head, opt = _head(sample_rate, optimizer, compute_dtype)
    grads = []
    b = x.shape[0] // k
    for _ in range(steps):
        head.prepare_step(y)
        parts = []
        for j in range(k):
            e = x[j * b : (j + 1) * b].clone().requires_grad_(True)
            (head(e, y[j * b : (j + 1) * b]) / k).backward()
            parts.append(e.grad)
        grads.append(torch.cat(parts))
        opt.step()
    return head, opt, grads


def _opt_state(opt):
    return {name: t.data.float() for name, t in opt.tables.items()}


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("sample_rate", [1.0, 0.3])
def test_micro_batches_equal_one_batch_of_their_union(sample_rate, optimizer):
    x, y = _batch()
    one, one_opt, one_grads = _one_batch(x, y, sample_rate, optimizer)
    acc, acc_opt, acc_grads = _micro_batches(x, y, sample_rate, optimizer)
    for g1, gk in zip(one_grads, acc_grads, strict=True):
        assert_close_at_scale(gk, g1)
    start = _head(sample_rate, optimizer)[0].local_centers_float32()
    moved = one.local_centers_float32()
    assert (moved - start).abs().max() > 1e-3  # the step moved the centers
    assert_close_at_scale(acc.local_centers_float32(), moved)
    for name, value in _opt_state(one_opt).items():
        assert_close_at_scale(_opt_state(acc_opt)[name], value)
    assert acc.sampling_step == one.sampling_step == 2  # one draw per optimizer step
    if sample_rate < 1:  # unsampled centers did not move
        untouched = (moved - start).abs().amax(dim=1) == 0
        assert 0 < int(untouched.sum()) < NUM_CLASSES


@pytest.mark.parametrize("sample_rate", [1.0, 0.3])
def test_micro_batches_equal_one_batch_in_bfloat16_compute(sample_rate):
    """bfloat16 GEMM operands: with k = 2 the loss scale 1/(kb) is the same float either way,
    so every rounded operand is the same and only the order of the float32 sums differs; a fold
    of the earlier micro-batches in float32 would be off by the bfloat16 rounding (~2^-8)."""
    x, y = _batch()
    one, _, one_grads = _one_batch(x, y, sample_rate, "sgd", compute_dtype="bfloat16")
    acc, _, acc_grads = _micro_batches(x, y, sample_rate, "sgd", k=2, compute_dtype="bfloat16")
    assert one.precision.path == acc.precision.path == "emulated"
    for g1, gk in zip(one_grads, acc_grads, strict=True):
        assert_close_at_scale(gk, g1)
    assert_close_at_scale(acc.local_centers_float32(), one.local_centers_float32())
    fp32, _, _ = _one_batch(x, y, sample_rate, "sgd")
    gap = (fp32.local_centers_float32() - one.local_centers_float32()).abs().max()
    assert gap > 1e-5  # bfloat16 compute is not float32: the comparison above can tell


def test_sampling_per_micro_batch_would_differ():
    """The test above can fail: drawing per micro-batch (no plan) gives another update."""
    x, y = _batch()
    one, _, _ = _one_batch(x, y, 0.3, "sgd", steps=1)
    head, opt = _head(0.3, "sgd")
    b = MICRO
    for j in range(K):
        e = x[j * b : (j + 1) * b].clone().requires_grad_(True)
        (head(e, y[j * b : (j + 1) * b]) / K).backward()
        opt.step()
    assert not torch.allclose(head.local_centers_float32(), one.local_centers_float32())


def test_a_micro_batch_outside_the_plan_is_an_error():
    x, y = _batch()
    head, _ = _head(0.3, "sgd")
    head.prepare_step(y[:MICRO])
    outside = torch.full((MICRO,), -1)
    outside_label = int(np.setdiff1d(np.arange(NUM_CLASSES), y.numpy())[0])
    outside.fill_(outside_label)
    with pytest.raises(ValueError, match="prepare_step"):
        head(x[:MICRO].requires_grad_(True), outside)


def _two_rank_body(rank, world_size):
    """Per sample rate: (accumulated, one batch) centers and embedding gradients of this rank.

    Rank r holds its half of every micro-batch; the one-batch run gets the concatenation of
    its halves (the same global samples; 2 ranks draw other negatives than 1 process).
    """
    x, y = _batch()
    b, half = MICRO, MICRO // world_size
    parts = [slice(j * b + rank * half, j * b + (rank + 1) * half) for j in range(K)]
    x_local = torch.cat([x[sl] for sl in parts])
    y_local = torch.cat([y[sl] for sl in parts])
    out = {}
    for rate in (1.0, 0.3):
        one, _, one_grads = _one_batch(x_local, y_local, rate, "sgd")
        acc, _, acc_grads = _micro_batches(x_local, y_local, rate, "sgd")
        out[rate] = [
            (h.local_centers_float32().numpy(), [g.numpy() for g in grads])
            for h, grads in ((acc, acc_grads), (one, one_grads))
        ]
    return out


def test_two_ranks_accumulating_equal_two_ranks_with_the_whole_batch():
    results = run_ranks(_two_rank_body, 2, timeout_s=120)
    for rate in (1.0, 0.3):
        for (acc_centers, acc_grads), (one_centers, one_grads) in (r[rate] for r in results):
            assert_close_at_scale(acc_centers, one_centers)
            for gk, g1 in zip(acc_grads, one_grads, strict=True):
                assert_close_at_scale(gk, g1)
    # with all classes active, 2 ranks also equal 1 process with the whole batch
    x, y = _batch()
    one, _, _ = _one_batch(x, y, 1.0, "sgd")
    both = np.concatenate([r[1.0][0][0] for r in results])
    assert_close_at_scale(both, one.local_centers_float32().numpy())
