"""Partial FC in bfloat16 compute on 1, 2 and 3 gloo ranks.

Tolerances (u = 2^-8, the bfloat16 unit roundoff; s = 32; d = 16):
* forward, against a float64 reference built on the *rounded* operands (normalised
  embeddings and centers rounded to bfloat16, norms from the float32 centers): float32
  accumulation only, 1e-5;
* against the float32 reference: a unit-vector dot product with both operands off by at most
  u changes by at most 2u (rigorously: the loss by at most 2us = 0.25), typically by
  ``u sqrt(2/d)``; we assert the loss within ``s u sqrt(2/d)`` = 0.044 and every gradient within
  a relative (Frobenius) ``2u + s u sqrt(2/d)`` = 0.052 (the coefficient operand's own
  rounding plus the probabilities' response to the logit error);
* N ranks against 1 rank in the same precision: the reductions' order only, 1e-5.

These bounds are those of the emulated path (rounded operands, float32 products), pinned here
with ``gemm_path="emulated"`` so that they hold on every CPU; a CPU with bfloat16 units picks
the native path under ``"auto"``, whose products are also rounded to bfloat16 (checked
against the emulated path in ``test_native_path_agrees_with_emulated_on_a_tiny_layer``).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from partialfc.classifier import PartialFC, RowSparseSGD, init_center_rows
from partialfc.losses.gemm_precision import round_to_dtype
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import dense_reference, margin_logits
from tests.distributed import run_ranks

D, C, S, STD, SEED = 16, 11, 32.0, 0.25, 3
U = 2.0**-8
LOSS_TOL = S * U * math.sqrt(2 / D)
GRAD_RTOL = 2 * U + S * U * math.sqrt(2 / D)
BATCH_SIZES = {1: [9], 2: [6, 3], 3: [4, 0, 5]}
# name -> (num_subcenters, negative_cos_threshold, storage dtype)
CASES = {
    "arcface": (1, None, torch.float32),
    "subcenter": (3, None, torch.float32),
    "pfc_star": (1, 0.2, torch.float32),
    "bf16_storage": (1, None, torch.bfloat16),
}
DTYPES = ("float32", "bfloat16")


def _batch(batch: int):
    gen = torch.Generator().manual_seed(100)
    return torch.randn(batch, D, generator=gen), torch.randint(0, C, (batch,), generator=gen)


def _local(t, sizes, rank):
    start = sum(sizes[:rank])
    return t[start : start + sizes[rank]]


def _body(rank: int, world: int) -> dict:
    sizes = BATCH_SIZES[world]
    x, y = _batch(sum(sizes))
    out = {}
    for name, (k, thr, storage) in CASES.items():
        for dtype in DTYPES:
            pfc = PartialFC(C, D, ArcFaceMargin(0.5, S), num_subcenters=k,
                            negative_cos_threshold=thr, storage_dtype=storage,
                            compute_dtype=dtype, gemm_path="emulated", seed=SEED,
                            init_std=STD)  # fmt: skip
            xl = _local(x, sizes, rank).clone().requires_grad_(True)
            loss = pfc(xl, _local(y, sizes, rank))
            loss.backward()
            out[name, dtype] = dict(
                loss=loss.item(),
                grad_x=xl.grad.clone(),
                grad_w=pfc.active_rows.center_grad().clone(),
                path=pfc.precision.path,
            )
    # sampled steps: rows outside the active set, and their momentum, keep their bits
    for storage in (torch.float32, torch.bfloat16):
        pfc = PartialFC(40, D, ArcFaceMargin(0.5, S), sample_rate=0.3, storage_dtype=storage,
                        compute_dtype="bfloat16", seed=SEED, init_std=STD)  # fmt: skip
        opt = RowSparseSGD(pfc, lr=0.5, momentum=0.9, weight_decay=5e-4)
        checks = []
        for step in range(3):
            gen = torch.Generator().manual_seed(step)
            xs, ys = torch.randn(6, D, generator=gen), torch.randint(0, 40, (6,), generator=gen)
            table = pfc.centers.data.clone()
            momentum = opt.tables["momentum_buffer"].data.clone()
            pfc(_local(xs, [3] * world, rank) if world > 1 else xs,
                _local(ys, [3] * world, rank) if world > 1 else ys).backward()  # fmt: skip
            rows = pfc.active_rows.rows.clone()
            opt.step()
            idle = torch.ones(table.shape[0], dtype=torch.bool)
            idle[rows] = False
            checks.append(
                dict(
                    idle=int(idle.sum()),
                    table_same=torch.equal(pfc.centers.data[idle], table[idle]),
                    momentum_same=torch.equal(
                        opt.tables["momentum_buffer"].data[idle], momentum[idle]
                    ),
                    active_moved=not torch.equal(pfc.centers.data[rows], table[rows]),
                )
            )
        out["sampled", str(storage)] = checks
    return {  # tensors travel between processes by value, not through shared memory
        key: {k: v.numpy().copy() if isinstance(v, torch.Tensor) else v for k, v in val.items()}
        if isinstance(val, dict)
        else val
        for key, val in out.items()
    }


@functools.cache
def _run(world: int) -> list[dict]:
    return run_ranks(_body, world_size=world)


def _global(results, name, dtype):
    parts = [r[name, dtype] for r in results]
    return (
        parts[0]["loss"],
        torch.cat([torch.from_numpy(p["grad_x"]) for p in parts]),
        torch.cat([torch.from_numpy(p["grad_w"]) for p in parts]),
    )


def _centers(k, storage):
    w = init_center_rows(C, D, k, SEED, 0, C, std=STD)
    return round_to_dtype(w, torch.bfloat16) if storage == torch.bfloat16 else w


def _rounded_operand_loss(x, y, w, k, thr):
    """float64 loss of the bfloat16-operand layer: rounded unit embeddings and centers."""
    xr = round_to_dtype(F.normalize(x, dim=1), torch.bfloat16).double()
    inv = 1.0 / w.double().norm(dim=1)
    cos = (xr @ round_to_dtype(w, torch.bfloat16).double().t()) * inv
    if k > 1:
        cos = cos.view(cos.shape[0], -1, k).max(dim=2).values
    logits, target = margin_logits(
        None, None, y, scale=S, m2_rad=0.5, num_subcenters=1, negative_cos_threshold=thr,
        cosines=cos,
    )  # fmt: skip
    return F.cross_entropy(logits, target).item()


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_compute_matches_float32_reference(world, name):
    results = _run(world)
    k, thr, storage = CASES[name]
    x, y = _batch(sum(BATCH_SIZES[world]))
    w = _centers(k, storage)
    ref_loss, ref_gx, ref_gw = dense_reference(
        x, w, y, scale=S, m2_rad=0.5, num_subcenters=k, negative_cos_threshold=thr
    )
    ref_gx = ref_gx * world  # backbone_grad_reduction="mean": DDP averages over the ranks
    loss32, gx32, gw32 = _global(results, name, "float32")
    loss16, gx16, gw16 = _global(results, name, "bfloat16")
    assert {r[name, "bfloat16"]["path"] for r in results} == {"emulated"}
    # float32 compute is the float32 layer
    assert loss32 == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-5)
    # bfloat16 compute: exactly the rounded-operand math in the forward ...
    assert loss16 == pytest.approx(_rounded_operand_loss(x, y, w, k, thr), rel=1e-5, abs=1e-5)
    # ... and within the derived bfloat16 tolerance of the float32 reference
    assert abs(loss16 - float(ref_loss)) <= LOSS_TOL
    assert _rel(gx16, ref_gx) <= GRAD_RTOL
    assert _rel(gw16, ref_gw) <= GRAD_RTOL
    assert loss16 != loss32  # the operands really were rounded


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_on_n_ranks_equals_one_rank(world, name):
    one = _global(_run(1), name, "bfloat16")
    many = _global(_run(world), name, "bfloat16")
    assert many[0] == pytest.approx(one[0], rel=1e-5)
    torch.testing.assert_close(many[1] / world, one[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(many[2], one[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("storage", ["torch.float32", "torch.bfloat16"])
def test_unsampled_rows_and_state_keep_their_bits(world, storage):
    for rank_result in _run(world):
        for check in rank_result["sampled", storage]:
            assert check["idle"] > 0
            assert check["table_same"] and check["momentum_same"]
            assert check["active_moved"]


def test_native_path_agrees_with_emulated_on_a_tiny_layer():
    """torch's CPU bfloat16 GEMM (slow here, but small) rounds its output to bfloat16: one
    more relative error u on each ``w.x``, so logits move by at most ``s u`` (0.125)."""
    x, y = _batch(9)
    res = {}
    for path in ("native", "emulated"):
        pfc = PartialFC(C, D, ArcFaceMargin(0.5, S), compute_dtype="bfloat16", gemm_path=path,
                        seed=SEED, init_std=STD)  # fmt: skip
        assert pfc.precision.path == path
        xl = x.clone().requires_grad_(True)
        loss = pfc(xl, y)
        loss.backward()
        res[path] = (loss.item(), xl.grad, pfc.active_rows.center_grad())
    assert res["native"][0] == pytest.approx(res["emulated"][0], abs=S * U)
    assert _rel(res["native"][1], res["emulated"][1]) <= GRAD_RTOL
    assert _rel(res["native"][2], res["emulated"][2]) <= GRAD_RTOL


def test_native_backward_reads_the_rows_of_forward_once():
    """On the native path forward keeps the bfloat16 operands of the active rows for
    backward: the table is read once per step, and a table changed between forward and
    backward (which only the optimizer may do, after backward) does not reach the gradient."""
    x, y = _batch(9)
    grads, reads = {}, {}
    for changed in (False, True):
        pfc = PartialFC(C, D, ArcFaceMargin(0.5, S), compute_dtype="bfloat16", gemm_path="native",
                        seed=SEED, init_std=STD)  # fmt: skip
        calls: list[int] = []

        def counted(rows, out=None, read=pfc.centers.read, calls=calls):
            calls.append(rows.numel())
            return read(rows, out)

        pfc.centers.read = counted
        xl = x.clone().requires_grad_(True)
        loss = pfc(xl, y)
        if changed:
            pfc.centers.data.mul_(-3.0)
        loss.backward()
        grads[changed], reads[changed] = xl.grad, calls
    assert reads[False] == [C]  # forward's one read of the 11 active rows; none in backward
    torch.testing.assert_close(grads[True], grads[False], rtol=0, atol=0)


def test_dense_update_mode_matches_sparse_in_bfloat16():
    x, y = _batch(9)
    grads = {}
    for update in ("sparse", "dense"):
        pfc = PartialFC(C, D, ArcFaceMargin(0.5, S), update=update, compute_dtype="bfloat16",
                        seed=SEED, init_std=STD)  # fmt: skip
        pfc(x, y).backward()
        grads[update] = pfc.weight.grad if update == "dense" else pfc.active_rows.center_grad()
    torch.testing.assert_close(grads["dense"], grads["sparse"], rtol=1e-5, atol=1e-7)


def test_float16_compute_is_refused_on_cpu():
    with pytest.raises(ValueError, match="compute_dtype=float16 needs a GPU"):
        PartialFC(C, D, ArcFaceMargin(0.5, S), compute_dtype="float16")
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        PartialFC(C, D, ArcFaceMargin(0.5, S), compute_dtype="fp8")


def test_backward_gemms_use_rounded_operands():
    """Both gradient GEMMs see bfloat16-rounded coefficients, embeddings and centers: rebuild
    them from the record in float64 (float32 accumulation only, 1e-5)."""
    x, y = _batch(9)
    pfc = PartialFC(C, D, ArcFaceMargin(0.5, S), compute_dtype="bfloat16", gemm_path="emulated",
                    seed=SEED, init_std=STD)  # fmt: skip
    xl = x.clone().requires_grad_(True)
    pfc(xl, y).backward()
    rec = pfc.active_rows
    r = lambda t: round_to_dtype(t, torch.bfloat16).double()  # noqa: E731
    q, x_hat, w = rec.coefficients, rec.embeddings, rec.read_weight().clone()
    g = r(q) @ r(x_hat)
    g -= w.double() * ((g * w.double()).sum(1) / w.double().norm(dim=1) ** 2).unsqueeze(1)
    torch.testing.assert_close(rec.center_grad().double(), g, rtol=1e-5, atol=1e-6)
    g_hat = r(q).t() @ r(w)  # d loss / d x_hat, then through the normalisation
    norm = x.double().norm(dim=1, keepdim=True)
    unit = x.double() / norm
    expected = (g_hat - unit * (unit * g_hat).sum(1, keepdim=True)) / norm
    torch.testing.assert_close(xl.grad.double(), expected, rtol=1e-5, atol=1e-6)
