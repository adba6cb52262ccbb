"""Single-process checks: sharding, sampling, storage rounding, the optimizer handshake, and
row-sparse optimizers against torch's own SGD / AdamW."""

from __future__ import annotations

import pytest
import torch

from partialfc.classifier import (
    PartialFC,
    RowSparseAdamW,
    RowSparseSGD,
    class_block,
    class_blocks,
    init_center_rows,
    sample_active_classes,
    sampling_budget,
)
from partialfc.classifier.sampling import _skip_positives, sampling_generator
from partialfc.classifier.storage import RowTable, stochastic_round_to_bfloat16
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import dense_reference

D = 8


def test_class_blocks_are_contiguous_and_balanced():
    blocks = class_blocks(11, 3)
    assert [(b.start, b.stop) for b in blocks] == [(0, 4), (4, 8), (8, 11)]
    assert class_block(10, 1, 4).size == 3 and class_block(10, 3, 4).size == 2
    with pytest.raises(ValueError, match="num_classes=2 is smaller than world_size=3"):
        class_block(2, 0, 3)


def test_budget_and_sampling():
    assert sampling_budget(1000, 0.1) == 100  # no float round-up to 101
    assert sampling_budget(7, 0.3) == 3  # ceil(2.1)
    assert sampling_budget(5, 1.0) == 5
    positives = torch.tensor([3, 17, 40])
    a = sample_active_classes(positives, 50, 10, sampling_generator(0, 5, 1))
    b = sample_active_classes(positives, 50, 10, sampling_generator(0, 5, 1))
    c = sample_active_classes(positives, 50, 10, sampling_generator(0, 6, 1))
    d = sample_active_classes(positives, 50, 10, sampling_generator(0, 5, 2))
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    assert a.numel() == 10 and torch.isin(positives, a).all()
    assert torch.equal(a, torch.sort(torch.unique(a)).values)
    many = torch.arange(0, 50, 3)  # 17 positives exceed the budget of 10: all kept, no negatives
    assert torch.equal(sample_active_classes(many, 50, 10, sampling_generator(0, 0, 0)), many)


def test_sampled_negatives_are_uniform():
    counts = torch.zeros(20)
    for step in range(2000):
        counts[sample_active_classes(torch.tensor([0]), 20, 5, sampling_generator(1, step, 0))] += 1
    assert counts[0] == 2000
    # each of the 19 negatives is drawn with probability 4/19: expect 421 +- 18 (sd)
    assert (counts[1:] - 2000 * 4 / 19).abs().max() < 80


def test_permutation_path_is_uniform_too():
    # 11 negatives of 19 non-positives: too dense for distinct draws, a permutation is used
    counts = torch.zeros(20)
    for step in range(2000):
        a = sample_active_classes(torch.tensor([7]), 20, 12, sampling_generator(2, step, 0))
        assert a.numel() == 12 and torch.unique(a).numel() == 12
        counts[a] += 1
    assert counts[7] == 2000
    rest = torch.cat([counts[:7], counts[8:]])
    assert (rest - 2000 * 11 / 19).abs().max() < 90  # sd ~ 22


def test_skip_positives_enumerates_the_non_positives_in_order():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        positives = torch.sort(torch.randperm(n, generator=gen)[: n // 3]).values
        others = torch.tensor([c for c in range(n) if c not in set(positives.tolist())])
        draws = torch.arange(others.numel())
        assert torch.equal(_skip_positives(draws, positives), others)


def test_large_block_draw_is_positive_preserving_and_distinct():
    positives = torch.tensor([0, 5, 99_999, 123_456, 999_999])
    a = sample_active_classes(positives, 1_000_000, 100_000, sampling_generator(0, 0, 0))
    assert a.numel() == 100_000 and torch.isin(positives, a).all()
    assert bool((a[1:] > a[:-1]).all()) and int(a[-1]) < 1_000_000
    # ten equal slices of the block get ~10,000 each (sd ~ 95)
    per_slice = torch.bincount(a // 100_000, minlength=10)
    assert (per_slice - 10_000).abs().max() < 500


def test_stochastic_rounding_is_unbiased():
    value = 1.0 + 2.0**-10  # between two bfloat16 neighbours 1 and 1 + 2^-7
    x = torch.full((200_000,), value)
    rounded = stochastic_round_to_bfloat16(x.clone(), torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert rounded.double().mean().item() == pytest.approx(value, abs=3e-5)
    assert x.to(torch.bfloat16).float().unique().tolist() == [1.0]  # nearest would lose it


def test_row_table_reads_and_writes_rows():
    fill = torch.randn(6, D)
    table = RowTable(6, D, torch.bfloat16, "cpu", "cpu", fill)
    rows = torch.tensor([1, 4])
    got = table.read(rows)
    assert got.dtype == torch.float32
    assert torch.equal(got, fill[rows].to(torch.bfloat16).float())
    before = table.data.clone()
    table.write(rows, torch.ones(2, D), None)
    assert torch.equal(table.data[rows].float(), torch.ones(2, D))
    idle = torch.tensor([0, 2, 3, 5])
    assert torch.equal(table.data[idle], before[idle])


def _batch(c, b=12, seed=0):
    gen = torch.Generator().manual_seed(1000 + seed)  # not the centers' stream
    return torch.randn(b, D, generator=gen), torch.randint(0, c, (b,), generator=gen)


def test_constructor_and_input_errors():
    m = ArcFaceMargin()
    for rate in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="sample_rate must be in"):
            PartialFC(10, D, m, sample_rate=rate)
    with pytest.raises(ValueError, match="margin must be a CombinedMargin"):
        PartialFC(10, D, margin=lambda c, t: c)
    with pytest.raises(ValueError, match='update="dense"'):
        PartialFC(10, D, m, update="dense", storage_dtype=torch.bfloat16)
    pfc = PartialFC(10, D, m)
    with pytest.raises(ValueError, match="outside"):
        pfc(torch.randn(2, D), torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="embedding_dim=8"):
        pfc(torch.randn(2, D + 1), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="2 entries for 3 embeddings"):
        pfc(torch.randn(3, D), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="empty"):
        pfc(torch.randn(0, D), torch.zeros(0, dtype=torch.long))


def test_handshake_step_consumes_rows_once():
    pfc = PartialFC(30, D, ArcFaceMargin(), sample_rate=0.3)
    opt = RowSparseSGD(pfc, lr=0.1)
    x, y = _batch(30)
    pfc(x, y)
    with pytest.raises(RuntimeError, match="before loss.backward"):
        opt.step()
    pfc(x, y).backward()
    with pytest.raises(RuntimeError, match="never applied"):
        pfc(x, y)
    opt.step()
    assert pfc.active_rows is None
    before = pfc.centers.data.clone()
    opt.step()  # nothing recorded: nothing moves
    assert torch.equal(pfc.centers.data, before)
    with torch.no_grad():
        pfc(x, y)  # evaluation forward records nothing
    assert pfc.active_rows is None
    stale = pfc(x, y)
    pfc(x, y)  # reuses the logits buffer the first graph needs
    with pytest.raises(RuntimeError, match="stale"):
        stale.backward()


@pytest.mark.parametrize("k, threshold", [(1, None), (2, None), (3, 0.2)])
def test_chunked_layer_matches_the_dense_reference(k, threshold):
    c = 13  # chunks of 4 rows: many chunks, a short last one
    pfc = PartialFC(c, D, ArcFaceMargin(0.5, 16.0), num_subcenters=k, init_std=0.3, seed=2,
                    negative_cos_threshold=threshold, chunk_rows=4)  # fmt: skip
    x, y = _batch(c, b=9, seed=4)
    x = x.requires_grad_(True)
    loss = pfc(x, y)
    loss.backward()
    w = pfc.local_centers_float32()
    ref_loss, ref_gx, ref_gw = dense_reference(x, w, y, scale=16.0, m2_rad=0.5,
                                               num_subcenters=k,
                                               negative_cos_threshold=threshold)  # fmt: skip
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_gx, rtol=1e-4, atol=1e-6)
    record = pfc.active_rows
    torch.testing.assert_close(record.center_grad().double(), ref_gw, rtol=1e-4, atol=1e-6)
    # a chunk of rows, with the coupled weight decay folded in
    part = record.center_grad(5, 11, weight_decay=0.25)
    torch.testing.assert_close(part.double(), ref_gw[5:11] + 0.25 * w[5:11].double(),
                               rtol=1e-4, atol=1e-6)  # fmt: skip


def test_staged_table_caches_the_active_rows_and_matches(monkeypatch):
    # a table in another memory (host storage next to a GPU) is read once per step into a
    # device cache; forced here on CPU, the result equals the direct path bit for bit
    kw = dict(sample_rate=0.3, init_std=0.3, seed=7, storage_dtype=torch.bfloat16)
    direct = PartialFC(40, D, ArcFaceMargin(), **kw)
    staged = PartialFC(40, D, ArcFaceMargin(), **kw)
    staged.centers.staged = True
    opts = [RowSparseSGD(m, lr=0.2) for m in (direct, staged)]
    for step in range(3):
        x, y = _batch(40, seed=step)
        losses = []
        for m, opt in zip((direct, staged), opts, strict=True):
            loss = m(x, y)
            loss.backward()
            if m is staged:
                assert m.active_rows.weight_cache is not None
            opt.step()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    assert direct.active_rows is None and torch.equal(direct.centers.data, staged.centers.data)


def test_subcenters_of_a_sampled_class_are_all_active():
    k = 3
    pfc = PartialFC(40, D, ArcFaceMargin(), sample_rate=0.25, num_subcenters=k)
    x, y = _batch(40)
    pfc(x, y).backward()
    rows = pfc.active_rows.rows
    classes = rows.view(-1, k) // k
    assert (classes == classes[:, :1]).all() and (rows.view(-1, k) % k == torch.arange(k)).all()
    assert classes.shape[0] == max(10, y.unique().numel())
    assert torch.isin(y.unique(), classes[:, 0]).all()


def test_rowsparse_sgd_at_rate_one_matches_dense_mode_with_torch_sgd():
    # chunks of 7 rows exercise the chunked update loop
    sparse = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), init_std=0.3, chunk_rows=7)
    dense = PartialFC(20, D, ArcFaceMargin(0.5, 16.0), init_std=0.3, update="dense")
    opt_s = RowSparseSGD(sparse, lr=0.2, momentum=0.9, weight_decay=5e-4, nesterov=True)
    opt_d = torch.optim.SGD(dense.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-4,
                            nesterov=True)  # fmt: skip
    for step in range(3):
        x, y = _batch(20, seed=step)
        ls, ld = sparse(x, y), dense(x, y)
        assert ls.item() == pytest.approx(ld.item(), rel=1e-6)
        ls.backward()
        ld.backward()
        opt_s.step()
        opt_d.step()
        opt_d.zero_grad()
    torch.testing.assert_close(sparse.centers.data, dense.weight.detach(), rtol=1e-5, atol=1e-6)


def test_dense_mode_moves_unsampled_rows_sparse_mode_does_not():
    kw = dict(sample_rate=0.2, init_std=0.3)
    sparse = PartialFC(50, D, ArcFaceMargin(), **kw)
    dense = PartialFC(50, D, ArcFaceMargin(), update="dense", **kw)
    opt_s = RowSparseSGD(sparse, lr=0.1)
    opt_d = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    start = sparse.centers.data.clone()
    for step in range(2):
        x, y = _batch(50, b=4, seed=step)
        sparse(x, y).backward()
        dense(x, y).backward()
        active = sparse.active_rows.rows
        opt_s.step()
        opt_d.step()
        opt_d.zero_grad()
    idle = torch.ones(50, dtype=torch.bool)
    idle[active] = False
    moved_dense = (dense.weight.detach() != start).all(dim=1)
    moved_sparse = (sparse.centers.data != start).any(dim=1)
    assert moved_dense.all()  # weight decay and momentum move every row in dense mode
    assert moved_sparse.sum() < 50 and not moved_sparse[idle & ~moved_sparse].any()


@pytest.mark.parametrize(
    "kw", [{}, {"storage_dtype": torch.bfloat16}, {"update": "dense"}], ids=["f32", "bf16", "dense"]
)
def test_local_centers_float32_is_a_copy(kw):
    """A snapshot taken before a step keeps the old values, and writing into it leaves the
    table alone (a view would make every before/after comparison trivially equal)."""
    pfc = PartialFC(10, D, ArcFaceMargin(), init_std=0.3, **kw)
    opt = (
        RowSparseSGD(pfc, lr=0.5)
        if pfc.update != "dense"
        else torch.optim.SGD(pfc.parameters(), lr=0.5)
    )
    snapshot = pfc.local_centers_float32()
    assert snapshot.dtype == torch.float32
    x, y = _batch(10)
    pfc(x, y).backward()
    opt.step()
    after = pfc.local_centers_float32()
    assert not torch.equal(after, snapshot)  # the step moved the table, not the snapshot
    after.zero_()
    assert pfc.local_centers_float32().abs().sum() > 0


def test_rowsparse_adamw_at_rate_one_matches_torch_adamw():
    pfc = PartialFC(15, D, ArcFaceMargin(0.5, 16.0), init_std=0.3)
    opt = RowSparseAdamW(pfc, lr=1e-2, weight_decay=0.05)
    w = pfc.local_centers_float32().requires_grad_(True)
    ref_opt = torch.optim.AdamW([w], lr=1e-2, weight_decay=0.05)
    for step in range(3):
        x, y = _batch(15, seed=step)
        pfc(x, y).backward()
        _, _, gw = dense_reference(x, w, y, scale=16.0, m2_rad=0.5)
        w.grad = gw.float()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(pfc.centers.data, w.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt.tables["exp_avg"].data, ref_opt.state[w]["exp_avg"])


def test_adamw_bias_correction_counts_only_active_steps():
    pfc = PartialFC(40, D, ArcFaceMargin(), sample_rate=0.1)
    opt = RowSparseAdamW(pfc, lr=1e-2)
    seen = torch.zeros(40, dtype=torch.int32)
    for step in range(3):
        x, y = _batch(40, b=2, seed=step)
        pfc(x, y).backward()
        seen[pfc.active_rows.rows] += 1
        opt.step()
    assert torch.equal(opt.row_steps, seen) and seen.max() >= 1 and (seen == 0).any()


def test_optimizer_state_dict_round_trip_and_lr_scheduler():
    pfc = PartialFC(20, D, ArcFaceMargin(), sample_rate=0.5)
    opt = RowSparseSGD(pfc, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = _batch(20)
    pfc(x, y).backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    state = opt.state_dict()
    fresh = RowSparseSGD(PartialFC(20, D, ArcFaceMargin(), sample_rate=0.5), lr=1.0)
    fresh.load_state_dict(state)
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.05) and fresh.num_steps == 1
    assert torch.equal(fresh.tables["momentum_buffer"].data, opt.tables["momentum_buffer"].data)
    with pytest.raises(ValueError, match="RowSparseSGD"):
        RowSparseAdamW(PartialFC(20, D, ArcFaceMargin())).load_state_dict(state)


def test_bfloat16_storage_tracks_float32_storage():
    kw = dict(sample_rate=0.5, init_std=0.3, seed=1, chunk_rows=5)  # chunked conversions
    f32 = PartialFC(64, D, ArcFaceMargin(0.5, 16.0), **kw)
    b16 = PartialFC(64, D, ArcFaceMargin(0.5, 16.0), storage_dtype=torch.bfloat16, **kw)
    assert b16.centers.data.dtype == torch.bfloat16 and b16.centers.nbytes() == 64 * D * 2
    opts = [RowSparseSGD(f32, lr=0.2), RowSparseSGD(b16, lr=0.2)]
    assert opts[1].tables["momentum_buffer"].data.dtype == torch.bfloat16
    for step in range(20):
        x, y = _batch(64, b=16, seed=step)
        losses = []
        for pfc, opt in zip((f32, b16), opts, strict=True):
            loss = pfc(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=0.02)
    drift = (b16.centers.data.float() - f32.centers.data).norm() / f32.centers.data.norm()
    assert drift < 0.02


def test_init_is_independent_of_the_sharding():
    full = init_center_rows(100_000, 4, 2, seed=7, class_start=0, class_stop=100_000)
    part = init_center_rows(100_000, 4, 2, seed=7, class_start=65_000, class_stop=70_000)
    assert torch.equal(part, full[65_000 * 2 : 70_000 * 2])


def test_unaligned_block_is_filled_with_its_rows_of_the_global_init(monkeypatch):
    import partialfc.classifier.partial_fc as module

    monkeypatch.setattr(module, "world_info", lambda group=None: (1, 3))  # rank 1 of 3
    pfc = PartialFC(200_000, 4, ArcFaceMargin(), seed=3, storage_dtype=torch.bfloat16)
    assert (pfc.block.start, pfc.block.stop) == (66_667, 133_334)  # straddles a 65536 chunk
    full = init_center_rows(200_000, 4, 1, 3, 0, 200_000)
    assert torch.equal(pfc.centers.data, full[66_667:133_334].to(torch.bfloat16))


def _chunked_steps(chunk_rows, optimizer, k, steps=3):
    """Loss, embedding gradient, diagnostics and centers of a few steps at ``chunk_rows``."""
    from partialfc.classifier import RowSparseAdamW
    from partialfc.classifier.diagnostics import partial_fc_diagnostics

    c = 50
    pfc = PartialFC(c, D, ArcFaceMargin(0.5, 16.0), sample_rate=0.6, num_subcenters=k,
                    init_std=0.3, seed=3, chunk_rows=chunk_rows)  # fmt: skip
    if optimizer == "adamw":
        opt = RowSparseAdamW(pfc, lr=0.05, weight_decay=0.1)
    else:
        opt = RowSparseSGD(pfc, lr=0.2, momentum=0.9, weight_decay=5e-4)
    out = []
    for step in range(steps):
        x, y = _batch(c, b=10, seed=step)
        x = x.requires_grad_(True)
        loss = pfc(x, y)
        loss.backward()
        diagnostics = partial_fc_diagnostics(x.detach(), y, pfc)
        opt.step()
        out.append((loss.detach(), x.grad, diagnostics, pfc.centers.data.clone()))
    return pfc, opt, out


@pytest.mark.parametrize("optimizer, k", [("sgd", 1), ("adamw", 2)])
def test_results_do_not_depend_on_chunk_rows(optimizer, k):
    """Chunks of 7 rows (several chunks and a short last one among the 30 / 60 active rows)
    give the default chunk's loss, embedding gradient, centers and optimizer state bit for bit
    after three steps (the diagnostics to float32 rounding)."""
    small_layer, small_opt, small = _chunked_steps(7, optimizer, k)
    default_layer, default_opt, default = _chunked_steps(None, optimizer, k)
    assert small_layer.chunk_rows == 7 and default_layer.chunk_rows == 2048
    assert small_layer.centers.chunk_rows == 7
    assert all(t.chunk_rows == 7 for t in small_opt.tables.values())
    assert small_layer.budget * k > 2 * 7  # several chunks really ran
    for (l7, g7, d7, w7), (ld, gd, dd, wd) in zip(small, default, strict=True):
        assert torch.equal(l7, ld)
        assert torch.equal(g7, gd)
        # the diagnostics' cosines come from GEMMs of chunk-shaped operands, whose kernels
        # may sum d products in another order: equal to float32 rounding
        assert d7 == pytest.approx(dd, rel=1e-6, abs=1e-7)
        assert torch.equal(w7, wd)
    for name, table in small_opt.tables.items():
        assert torch.equal(table.data, default_opt.tables[name].data), name


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "64"])
def test_chunk_rows_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=r"chunk_rows must be a positive int or None, got"):
        PartialFC(10, D, ArcFaceMargin(), chunk_rows=bad)
    with pytest.raises(ValueError, match=r"chunk_rows must be a positive int"):
        RowTable(4, D, torch.float32, "cpu", "cpu", chunk_rows=bad)
