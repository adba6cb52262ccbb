"""Row-sparse AdamW against torch.optim.AdamW from an explicit copy of the initial centers,
its defaults and argument checks, and optimizer state round trips."""

from __future__ import annotations

import pytest
import torch

from partialfc.classifier import PartialFC, RowSparseAdamW, RowSparseSGD
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import assert_close_at_scale, dense_reference

D = 8


def _batch(c, b=12, seed=0):
    gen = torch.Generator().manual_seed(2000 + seed)
    return torch.randn(b, D, generator=gen), torch.randint(0, c, (b,), generator=gen)


def _centers_copy(pfc):
    """The table's float32 values, copied (never a view of the table the optimizer updates)."""
    return pfc.centers.data.detach().float().clone()


def _run_against_torch_adamw(steps, lr, **kwargs):
    pfc = PartialFC(15, D, ArcFaceMargin(0.5, 16.0), init_std=0.3)
    opt = RowSparseAdamW(pfc, lr=lr, **kwargs) if lr is not None else RowSparseAdamW(pfc)
    w = _centers_copy(pfc).requires_grad_(True)
    ref_kwargs = dict(kwargs, **({"lr": lr} if lr is not None else {}))
    ref_opt = torch.optim.AdamW([w], **ref_kwargs)
    for step in range(steps):
        x, y = _batch(15, seed=step)
        pfc(x, y).backward()
        _, _, gw = dense_reference(x, w, y, scale=16.0, m2_rad=0.5)
        w.grad = gw.float()
        opt.step()
        ref_opt.step()
    return pfc, opt, w, ref_opt


@pytest.mark.parametrize(
    ("lr", "kwargs"),
    [
        (0.5, {"betas": (0.9, 0.999), "weight_decay": 0.05}),
        (0.3, {"betas": (0.5, 0.9), "eps": 1e-3, "weight_decay": 0.2}),
        (None, {}),  # every default is torch's
    ],
    ids=["large_lr", "other_hyperparameters", "defaults"],
)
def test_rowsparse_adamw_at_rate_one_matches_torch_adamw_from_a_copy(lr, kwargs):
    """At sample rate 1 every row is active every step, so row-sparse AdamW is torch's AdamW.
    A large learning rate makes the step, not the initial value, dominate the weights."""
    pfc, opt, w, ref_opt = _run_against_torch_adamw(4, lr, **kwargs)
    moved = (_centers_copy(pfc) - w.detach()).abs().max()
    assert moved <= 2e-6
    state = ref_opt.state[w]
    for name in ("exp_avg", "exp_avg_sq"):  # float32 gradients summed in another order
        assert_close_at_scale(opt.tables[name].data, state[name])
    assert torch.equal(opt.row_steps, torch.full((15,), 4, dtype=torch.int32))


def test_adamw_first_step_moves_each_row_by_lr_times_sign_of_gradient():
    """Bias-corrected first step: m / sqrt(v) = g / |g| (eps aside), so w' = w(1 - lr wd) -
    lr sign(g) elementwise, whatever the gradient's size."""
    pfc = PartialFC(15, D, ArcFaceMargin(0.5, 16.0), init_std=0.3)
    opt = RowSparseAdamW(pfc, lr=0.1, eps=1e-12, weight_decay=0.5)
    w0 = _centers_copy(pfc)
    x, y = _batch(15)
    pfc(x, y).backward()
    _, _, gw = dense_reference(x, w0, y, scale=16.0, m2_rad=0.5)
    opt.step()
    expected = w0 * (1 - 0.1 * 0.5) - 0.1 * torch.sign(gw.float())
    torch.testing.assert_close(_centers_copy(pfc), expected, rtol=0, atol=1e-6)


def test_adamw_state_dtype_is_honoured():
    pfc = PartialFC(15, D, ArcFaceMargin(0.5, 16.0))
    opt = RowSparseAdamW(pfc, state_dtype=torch.bfloat16)
    assert {t.data.dtype for t in opt.tables.values()} == {torch.bfloat16}
    assert {t.data.dtype for t in RowSparseAdamW(pfc).tables.values()} == {torch.float32}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"betas": (1.0, 0.999)}, "betas"),
        ({"betas": (1.5, 0.999)}, "betas"),
        ({"betas": (-0.1, 0.999)}, "betas"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"betas": (0.9, 1.5)}, "betas"),
        ({"betas": (0.9, -0.1)}, "betas"),
        ({"eps": 0.0}, "eps > 0"),
        ({"eps": -1e-8}, "eps > 0"),
        ({"weight_decay": -0.1}, "weight_decay >= 0"),
        ({"eps": 0.0, "weight_decay": 0.0}, "eps > 0"),
    ],
)
def test_adamw_rejects_out_of_range_hyperparameters(kwargs, message):
    pfc = PartialFC(15, D, ArcFaceMargin())
    with pytest.raises(ValueError, match=message):
        RowSparseAdamW(pfc, **kwargs)


def test_adamw_accepts_boundary_hyperparameters():
    pfc = PartialFC(15, D, ArcFaceMargin())
    for kwargs in (
        {"betas": (0.0, 0.0)},
        {"betas": (0.0, 0.999)},
        {"betas": (0.9, 0.0)},
        {"weight_decay": 0.0},
    ):
        opt = RowSparseAdamW(pfc, **kwargs)
        assert all(opt.param_groups[0][k] == v for k, v in kwargs.items())


def test_adamw_state_dict_round_trip_continues_identically():
    def make():
        return RowSparseAdamW(PartialFC(30, D, ArcFaceMargin(), sample_rate=0.3), lr=0.05)

    opt = make()
    for step in range(3):
        x, y = _batch(30, b=4, seed=step)
        opt.partial_fc(x, y).backward()
        opt.step()
    state = opt.state_dict()
    assert (state["row_steps"] != state["row_steps"].max()).any()  # per-row counts differ
    fresh = make()
    fresh.partial_fc.centers.data.copy_(opt.partial_fc.centers.data)
    fresh.partial_fc.sampling_step = opt.partial_fc.sampling_step
    fresh.load_state_dict(state)
    assert torch.equal(fresh.row_steps, opt.row_steps)
    for o in (opt, fresh):
        x, y = _batch(30, b=4, seed=9)
        o.partial_fc(x, y).backward()
        o.step()
    assert torch.equal(fresh.partial_fc.centers.data, opt.partial_fc.centers.data)
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(fresh.tables[name].data, opt.tables[name].data)


def test_state_loading_rejects_what_does_not_fit():
    pfc = PartialFC(20, D, ArcFaceMargin())
    opt = RowSparseAdamW(pfc)
    with pytest.raises(ValueError, match=r"'exp_avg' of shape \(25, 8\) does not fit"):
        opt.load_rows("exp_avg", 0, torch.zeros(25, D))
    with pytest.raises(ValueError, match=r"\(10, 8\) does not fit"):
        opt.load_rows("exp_avg", 15, torch.zeros(10, D))
    with pytest.raises(ValueError, match=r"\(5, 7\) does not fit"):
        opt.load_rows("exp_avg_sq", 0, torch.zeros(5, D - 1))
    opt.load_rows("exp_avg", 15, torch.ones(5, D))
    table = opt.tables["exp_avg"].data
    assert table[15:].eq(1).all() and table[:15].eq(0).all()

    sgd_state = RowSparseSGD(PartialFC(20, D, ArcFaceMargin()), lr=0.1).state_dict()
    with pytest.raises(ValueError, match="'RowSparseSGD', not RowSparseAdamW"):
        opt.load_state_dict(sgd_state)
    other_block = RowSparseAdamW(PartialFC(21, D, ArcFaceMargin())).state_dict()
    with pytest.raises(ValueError, match=r"covers classes \(0, 21\), this rank owns \(0, 20\)"):
        opt.load_state_dict(other_block)


# ---------------------------------------------------------------- SGD and the shared base


def _sgd_against_dense_torch_sgd(sgd_kwargs, torch_kwargs, steps=3):
    sparse = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), init_std=0.3)
    dense = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), init_std=0.3, update="dense")
    opt_s = RowSparseSGD(sparse, **sgd_kwargs)
    opt_d = torch.optim.SGD(dense.parameters(), **torch_kwargs)
    for step in range(steps):
        x, y = _batch(20, seed=step)
        sparse(x, y).backward()
        dense(x, y).backward()
        opt_s.step()
        opt_d.step()
        opt_d.zero_grad()
    return opt_s, _centers_copy(sparse), dense.weight.detach().clone()


@pytest.mark.parametrize(
    ("sgd_kwargs", "torch_kwargs"),
    [
        # documented defaults: momentum 0.9, weight decay 5e-4, no Nesterov
        ({"lr": 0.5}, {"lr": 0.5, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False}),
        (
            {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.0},
            {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.0},
        ),
        (
            {"lr": 0.5, "momentum": 0.5, "weight_decay": 0.1, "nesterov": True},
            {"lr": 0.5, "momentum": 0.5, "weight_decay": 0.1, "nesterov": True},
        ),
    ],
    ids=["defaults", "plain", "nesterov"],
)
def test_rowsparse_sgd_at_rate_one_matches_torch_sgd(sgd_kwargs, torch_kwargs):
    _, sparse, dense = _sgd_against_dense_torch_sgd(sgd_kwargs, torch_kwargs)
    assert (sparse - dense).abs().max() <= 2e-6


def test_sgd_without_momentum_keeps_no_state_and_lr_zero_freezes_the_centers():
    pfc = PartialFC(20, D, ArcFaceMargin(), init_std=0.3)
    assert RowSparseSGD(pfc, lr=0.1, momentum=0.0).tables == {}
    opt = RowSparseSGD(pfc, lr=0.0, momentum=0.9, weight_decay=0.1)
    assert set(opt.tables) == {"momentum_buffer"}
    before = _centers_copy(pfc)
    x, y = _batch(20)
    pfc(x, y).backward()
    opt.step()
    assert torch.equal(_centers_copy(pfc), before)
    assert opt.tables["momentum_buffer"].data.abs().sum() > 0  # the state still moved
    assert (
        RowSparseSGD(pfc, lr=0.1, state_dtype=torch.bfloat16).tables["momentum_buffer"].data.dtype
        == torch.bfloat16
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\), got 1.0"),
        ({"momentum": 1.5}, "momentum must be in"),
        ({"momentum": -0.1}, "momentum must be in"),
        ({"weight_decay": -1e-4}, "weight_decay must be >= 0, got -0.0001"),
        ({"momentum": 0.0, "nesterov": True}, "^nesterov needs momentum > 0$"),
        ({"lr": -1.0}, "lr must be a finite number >= 0, got -1.0"),
        ({"lr": float("inf")}, "lr must be a finite number"),
        ({"lr": float("nan")}, "lr must be a finite number"),
        ({"lr": "0.1"}, "lr must be a finite number"),
    ],
)
def test_sgd_rejects_out_of_range_hyperparameters(kwargs, message):
    pfc = PartialFC(20, D, ArcFaceMargin())
    with pytest.raises(ValueError, match=message):
        RowSparseSGD(pfc, **{"lr": 0.1, **kwargs})


def test_sgd_accepts_boundary_hyperparameters():
    pfc = PartialFC(20, D, ArcFaceMargin())
    for kwargs in ({"momentum": 0.0}, {"weight_decay": 0.0}, {"lr": 0.0}, {"lr": 1}):
        opt = RowSparseSGD(pfc, **{"lr": 0.1, **kwargs})
        assert all(opt.param_groups[0][k] == v for k, v in kwargs.items())


def test_row_sparse_optimizers_need_a_sparse_partial_fc():
    with pytest.raises(ValueError, match="^expected a PartialFC, got Linear$"):
        RowSparseSGD(torch.nn.Linear(2, 2), lr=0.1)
    dense = PartialFC(20, D, ArcFaceMargin(), update="dense")
    expected = (
        r'^row-sparse optimizers need PartialFC\(update="sparse"\); for update="dense" use '
        r"a torch optimizer on partial_fc.parameters\(\)$"
    )
    for cls in (RowSparseSGD, RowSparseAdamW):
        with pytest.raises(ValueError, match=expected):
            cls(dense, lr=0.1)
