"""Partial FC on 1, 2 and 3 gloo ranks against an independent single-process dense reference.

One spawned run per world size performs every check (spawning costs seconds); the test
functions then assert on what the ranks returned.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from partialfc.classifier import (
    PartialFC,
    RowSparseSGD,
    class_blocks,
    gather_full_centers,
    init_center_rows,
    load_partial_fc_checkpoint,
    sampling_budget,
    save_partial_fc_checkpoint,
)
from partialfc.losses.margins import ArcFaceMargin, CombinedMargin, CosFaceMargin
from tests.classifier.reference import dense_reference
from tests.distributed import run_ranks

D = 16
STD = 0.25  # centers of norm ~1 keep center gradients O(1), so 1e-5 is a meaningful tolerance
SEED = 3

# name -> (margin, reference margin kwargs, num_subcenters, num_classes, threshold)
EXACT_CASES = {
    "arcface": (ArcFaceMargin(0.5, 32.0), dict(scale=32.0, m2_rad=0.5), 1, 11, None),
    "cosface": (CosFaceMargin(0.35, 32.0), dict(scale=32.0, m3=0.35), 1, 11, None),
    "combined": (
        CombinedMargin(m1=0.9, m2_rad=0.3, m3=0.2, scale=32.0),
        dict(scale=32.0, m1=0.9, m2_rad=0.3, m3=0.2),
        1,
        11,
        None,
    ),
    "subcenter": (ArcFaceMargin(0.5, 32.0), dict(scale=32.0, m2_rad=0.5), 3, 11, None),
    "pfc_star": (ArcFaceMargin(0.5, 32.0), dict(scale=32.0, m2_rad=0.5), 1, 11, 0.2),
}
BATCH_SIZES = {1: [9], 2: [6, 3], 3: [4, 0, 5]}  # differing sizes, one empty rank


def _global_batch(step: int, batch: int, num_classes: int, label_pool: int | None = None):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(batch, D, generator=gen)
    pool = label_pool or num_classes
    y = torch.randint(0, pool, (batch,), generator=gen) * (num_classes // pool)
    return x, y


def _local(t: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
    start = sum(sizes[:rank])
    return t[start : start + sizes[rank]]


def _forward_backward(pfc, x, y, sizes, rank):
    xl = _local(x, sizes, rank).clone().requires_grad_(True)
    loss = pfc(xl, _local(y, sizes, rank))
    loss.backward()
    return loss.item(), xl.grad.clone(), pfc.active_rows


def _body(rank: int, world: int, ckpt_dir: str) -> dict:
    torch.manual_seed(0)
    out: dict = {"block": (class_blocks(11, world)[rank].start, class_blocks(11, world)[rank].stop)}
    sizes = BATCH_SIZES[world]
    batch = sum(sizes)

    # r = 1: exact against the dense reference
    for name, (margin, _, k, c, thr) in EXACT_CASES.items():
        pfc = PartialFC(c, D, margin, num_subcenters=k, negative_cos_threshold=thr, seed=SEED,
                        init_std=STD)  # fmt: skip
        x, y = _global_batch(0, batch, c)
        loss, gx, rec = _forward_backward(pfc, x, y, sizes, rank)
        out[name] = dict(
            loss=loss, grad_x=gx, rows=rec.rows.clone(), grad_w=rec.center_grad().clone()
        )

    # "sum" convention: the embedding gradient is the plain partial derivative
    pfc = PartialFC(11, D, ArcFaceMargin(0.5, 32.0), seed=SEED, init_std=STD,
                    backbone_grad_reduction="sum")  # fmt: skip
    x, y = _global_batch(0, batch, 11)
    out["arcface_sum"] = dict(grad_x=_forward_backward(pfc, x, y, sizes, rank)[1])

    # r < 1: sampling, union-restricted loss, two SGD steps
    c, r = 60, 0.2
    pfc = PartialFC(c, D, ArcFaceMargin(0.5, 32.0), sample_rate=r, seed=SEED, init_std=STD)
    opt = RowSparseSGD(pfc, lr=0.5, momentum=0.9, weight_decay=5e-4)
    sampled = []
    for step in range(2):
        before_w = pfc.centers.data.clone()
        before_m = opt.tables["momentum_buffer"].data.clone()
        x, y = _global_batch(10 + step, batch, c, label_pool=6)
        loss, gx, rec = _forward_backward(pfc, x, y, sizes, rank)
        rows, grad = rec.rows.clone(), rec.center_grad().clone()
        opt.step()
        sampled.append(dict(loss=loss, rows=rows, grad=grad, before_w=before_w,
                            before_m=before_m, after_w=pfc.centers.data.clone(),
                            after_m=opt.tables["momentum_buffer"].data.clone()))  # fmt: skip
    out["sampled"] = sampled
    out["sampled_block"] = (pfc.block.start, pfc.block.stop, pfc.budget)
    twin = PartialFC(c, D, ArcFaceMargin(0.5, 32.0), sample_rate=r, seed=SEED, init_std=STD)
    x, y = _global_batch(10, batch, c, label_pool=6)
    with torch.no_grad():
        twin(_local(x, sizes, rank), _local(y, sizes, rank))
    twin.sampling_step = 0
    out["twin_rows_step0"] = twin._select_active_classes(y).clone()

    # bad input on one rank: every rank raises, nobody hangs, the group stays usable
    errors = []
    bad_label = 11 if rank == world - 1 else 0
    pfc = PartialFC(11, D, ArcFaceMargin(), seed=SEED)
    for xl, yl in (
        (torch.randn(2, D), torch.tensor([0, bad_label])),
        (torch.randn(0, D), torch.zeros(0, dtype=torch.long)),  # globally empty batch
    ):
        try:
            pfc(xl, yl)
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    out["errors"] = errors

    # checkpoint: world 2 saves after two steps and continues; world 3 loads and continues
    out["ckpt"] = _checkpoint_run(rank, world, ckpt_dir, sizes, batch)
    return _to_numpy(out)


def _to_numpy(obj):
    """Tensors travel between processes by value (numpy), not through shared-memory handles."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().numpy().copy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def _to_torch(obj):
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: _to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(v) for v in obj)
    return obj


def _checkpoint_model():
    pfc = PartialFC(11, D, ArcFaceMargin(0.5, 32.0), seed=SEED, init_std=STD)
    return pfc, RowSparseSGD(pfc, lr=0.5, momentum=0.9, weight_decay=5e-4)


def _checkpoint_run(rank, world, ckpt_dir, sizes, batch):
    result = {}
    if world not in (2, 3):
        return result
    pfc, opt = _checkpoint_model()
    if world == 2:
        for step in range(2):
            x, y = _global_batch(20 + step, batch, 11)
            _forward_backward(pfc, x, y, sizes, rank)
            opt.step()
        save_partial_fc_checkpoint(ckpt_dir, pfc, opt)
    else:
        for wrong in (dict(num_classes=12), dict(embedding_dim=D + 1)):
            kw = dict(num_classes=11, embedding_dim=D) | wrong
            other = PartialFC(kw["num_classes"], kw["embedding_dim"], ArcFaceMargin())
            try:
                load_partial_fc_checkpoint(ckpt_dir, other)
                result.setdefault("load_errors", []).append(None)
            except ValueError as exc:
                result.setdefault("load_errors", []).append(str(exc))
        load_partial_fc_checkpoint(ckpt_dir, pfc, opt)
    result["centers_at_save"] = gather_full_centers(pfc) if world == 3 else None
    losses = []
    for step in (2, 3):
        x, y = _global_batch(20 + step, batch, 11)
        losses.append(_forward_backward(pfc, x, y, sizes, rank)[0])
        opt.step()
    result["losses"] = losses
    return result


@functools.lru_cache(maxsize=1)
def _runs() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(Path(tmp) / "pfc_ckpt")
        return {w: _to_torch(run_ranks(_body, w, (ckpt,), timeout_s=240)) for w in (1, 2, 3)}


@pytest.fixture(scope="module")
def runs():
    return _runs()


def _full_table(c: int, k: int) -> torch.Tensor:
    return init_center_rows(c, D, k, SEED, 0, c, std=STD)


def _assert_close(actual, expected, what):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"{what}: {m}")  # fmt: skip


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_rate_one_equals_dense_reference(runs, world, case):
    _, ref_kwargs, k, c, thr = EXACT_CASES[case]
    sizes = BATCH_SIZES[world]
    x, y = _global_batch(0, sum(sizes), c)
    loss, gx, gw = dense_reference(
        x, _full_table(c, k), y, num_subcenters=k, negative_cos_threshold=thr, **ref_kwargs
    )
    for rank, res in enumerate(runs[world]):
        r = res[case]
        _assert_close(torch.tensor(r["loss"]), loss, f"{case} loss rank {rank}")
        # default "mean" convention: DDP averages over ranks, so each rank carries world x grad
        _assert_close(r["grad_x"], world * _local(gx, sizes, rank), f"{case} grad_x rank {rank}")
        block = class_blocks(c, world)[rank]
        assert torch.equal(
            r["rows"], torch.arange(block.start * k, block.stop * k) - block.start * k
        )
        _assert_close(r["grad_w"], gw[block.start * k : block.stop * k], f"{case} grad_w {rank}")


@pytest.mark.parametrize("world", [2, 3])
def test_sum_convention_gives_plain_gradient(runs, world):
    sizes = BATCH_SIZES[world]
    x, y = _global_batch(0, sum(sizes), 11)
    _, gx, _ = dense_reference(x, _full_table(11, 1), y, scale=32.0, m2_rad=0.5)
    for rank, res in enumerate(runs[world]):
        _assert_close(res["arcface_sum"]["grad_x"], _local(gx, sizes, rank), "grad_x (sum)")


def test_pfc_star_actually_filters():
    x, y = _global_batch(0, 9, 11)
    cos = torch.nn.functional.normalize(x) @ torch.nn.functional.normalize(_full_table(11, 1)).t()
    negatives = torch.ones_like(cos, dtype=torch.bool).scatter_(1, y[:, None], False)
    assert int(((cos > 0.2) & negatives).sum()) >= 5  # the PFC* case filters something
    with_filter = dense_reference(x, _full_table(11, 1), y, scale=32.0, m2_rad=0.5,
                                  negative_cos_threshold=0.2)[0]  # fmt: skip
    without = dense_reference(x, _full_table(11, 1), y, scale=32.0, m2_rad=0.5)[0]
    assert with_filter < without - 1e-3  # filtered terms left the denominator


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sampling_positives_budget_and_union_loss(runs, world):
    sizes = BATCH_SIZES[world]
    c = 60
    for step in range(2):
        x, y = _global_batch(10 + step, sum(sizes), c, label_pool=6)
        union = []
        for res in runs[world]:
            start, stop, budget = res["sampled_block"]
            rows = res["sampled"][step]["rows"]
            assert budget == sampling_budget(stop - start, 0.2)
            positives = torch.unique(y[(y >= start) & (y < stop)]) - start
            assert torch.isin(positives, rows).all(), "a positive class was not active"
            assert rows.numel() == max(budget, positives.numel())
            assert rows.numel() == torch.unique(rows).numel()
            union.append(rows + start)
        union = torch.cat(union)
        assert union.numel() < c  # sampling really dropped classes
        # the table this step started from (step 1: after the first row-sparse update)
        table = torch.cat([res["sampled"][step]["before_w"] for res in runs[world]])
        if step == 0:
            torch.testing.assert_close(table, _full_table(c, 1), rtol=0, atol=0)
        loss, _, gw = dense_reference(x, table, y, scale=32.0, m2_rad=0.5, columns=union)
        for res in runs[world]:
            s = res["sampled"][step]
            _assert_close(torch.tensor(s["loss"]), loss, f"union loss step {step}")
            _assert_close(s["grad"], gw[s["rows"] + res["sampled_block"][0]], "sampled grad_w")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_unsampled_rows_and_momentum_bit_identical(runs, world):
    lr, mom, wd = 0.5, 0.9, 5e-4
    for res in runs[world]:
        s0, s1 = res["sampled"]
        n = s0["before_w"].shape[0]
        for s in (s0, s1):
            idle = torch.ones(n, dtype=torch.bool)
            idle[s["rows"]] = False
            assert idle.any() and (~idle).any()
            assert torch.equal(s["after_w"][idle], s["before_w"][idle])
            assert torch.equal(s["after_m"][idle], s["before_m"][idle])
        # active rows follow torch.optim.SGD exactly (step 0: buf = g + wd * w)
        w0 = s0["before_w"][s0["rows"]]
        buf = s0["grad"] + wd * w0
        _assert_close(s0["after_m"][s0["rows"]], buf, "momentum after step 0")
        _assert_close(s0["after_w"][s0["rows"]], w0 - lr * buf, "centers after step 0")
        # a row active in step 0 and idle in step 1 keeps its step-0 momentum
        kept = s0["rows"][~torch.isin(s0["rows"], s1["rows"])]
        assert kept.numel() > 0
        assert torch.equal(s1["after_m"][kept], s0["after_m"][kept])
        # step 1 on rows active both times: buf = mom * buf + g
        both = s1["rows"][torch.isin(s1["rows"], s0["rows"])]
        pos1 = torch.searchsorted(s1["rows"], both)
        g1 = s1["grad"][pos1] + wd * s1["before_w"][both]
        _assert_close(s1["after_m"][both], mom * s0["after_m"][both] + g1, "momentum step 1")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_same_seed_same_sampling(runs, world):
    for res in runs[world]:
        assert torch.equal(res["twin_rows_step0"], res["sampled"][0]["rows"])
        assert not torch.equal(res["sampled"][0]["rows"], res["sampled"][1]["rows"])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_bad_input_raises_on_every_rank(runs, world):
    for rank, res in enumerate(runs[world]):
        label_error, empty_error = res["errors"]
        assert label_error is not None
        if rank == world - 1:
            assert "outside [0, num_classes=11)" in label_error and "11" in label_error
        else:
            assert f"rank(s) [{world - 1}]" in label_error
        assert empty_error is not None and "empty" in empty_error


def test_checkpoint_saved_on_two_ranks_continues_on_three(runs):
    two, three = runs[2], runs[3]
    for res in three:
        load_errors = res["ckpt"]["load_errors"]
        assert "num_classes=11" in load_errors[0] and "manifest.json" in load_errors[0]
        assert "embedding_dim=16" in load_errors[1]
        for got, want in zip(res["ckpt"]["losses"], two[0]["ckpt"]["losses"], strict=True):
            assert got == pytest.approx(want, rel=1e-5)
    for res in two:
        assert res["ckpt"]["losses"] == pytest.approx(two[0]["ckpt"]["losses"], rel=0)
