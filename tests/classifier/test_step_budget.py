"""What one Partial FC training step launches on the accelerator code path (counted on the CPU
by ``benchmarks/step_op_budget.py``): host syncs, ops and per-step allocations stay pinned."""

import pytest
import torch

from tests.benchmarks.scripts import benchmark_script

BATCH, DIM, RATE = 64, 16, 0.1
SMALL, LARGE = 20_000, 700_000  # 2,000 and 70,000 active rows: one and two chunks of 2^16
#: the step's host reads: the counts of out-of-range labels, positives and local rows (one
#: read), and the distinct negatives of the draw
PINNED_SYNCS = {"Tensor.tolist": 1, "aten::_unique2": 1}
#: ATen ops of one step (forward, backward, optimizer) at most, views included: 1.5 times the
#: 140 of arcface_torch's PartialFC_V2 counted the same way (208 measured)
MAX_OPS = 210


@pytest.fixture(scope="module")
def budget():
    with benchmark_script("step_op_budget") as module:
        yield module


@pytest.fixture(scope="module")
def steps(budget):
    """Per-step tallies of two steps after a warm-up at C = SMALL and LARGE."""
    out = {}
    for num_classes in (SMALL, LARGE):
        setup = budget.StepSetup(num_classes, batch=BATCH, dim=DIM, rate=RATE)
        layer, opt = budget.build_partialfc(setup)
        out[num_classes] = budget.count_steps(layer, opt, setup, steps=2)
    return out


def test_counter_recognises_host_reads_and_fresh_allocations(budget):
    t = torch.arange(10)
    with budget.counting() as counter:
        t.nonzero()  # data-shaped output
        int(t.sum())  # a value read (sum, then _local_scalar_dense)
        t[t > 3]  # boolean mask: indices first
        t[t > 3] = 0  # one mask, one value: a masked fill, no host read
        t.tolist()  # no dispatch, wrapped
        t.add_(1)  # in place: no allocation
        t.view(2, 5)  # a view: no allocation, no kernel
    tally = counter.tally
    assert dict(tally.sync_ops) == {
        "aten::nonzero": 1,
        "aten::_local_scalar_dense": 1,
        "aten::index": 1,
        "Tensor.tolist": 1,
    }
    assert tally.syncs == 4
    # nonzero (9, 1) int64 (0 is not) + sum () int64 + gt (10,) bool twice + index (6,) int64
    assert tally.allocated_bytes == 9 * 8 + 8 + 10 + 10 + 6 * 8
    assert tally.largest_allocation_bytes == 9 * 8
    assert tally.ops - tally.kernels >= 1  # the view launches nothing


@pytest.mark.parametrize("num_classes", [SMALL, LARGE])
def test_host_syncs_are_pinned(steps, num_classes):
    for record in steps[num_classes]:
        assert dict(record["step"].sync_ops) == PINNED_SYNCS
        assert record["backward"].syncs == 0 and record["optimizer"].syncs == 0


def test_op_count_is_bounded_and_independent_of_the_classes(steps):
    counts = {c: [r["step"].ops for r in recs] for c, recs in steps.items()}
    kernels = {c: [r["step"].kernels for r in recs] for c, recs in steps.items()}
    assert max(max(v) for v in counts.values()) <= MAX_OPS
    assert set(counts[SMALL]) == set(counts[LARGE])
    assert set(kernels[SMALL]) == set(kernels[LARGE])


def test_no_step_allocation_grows_like_a_row_buffer(steps):
    """The per-step allocations that grow with C are the sampling's int64 index vectors (a few
    per active row), never a float (n, d) row buffer or an (n, B) score buffer (reused)."""
    small, large = (steps[c][-1]["step"] for c in (SMALL, LARGE))
    extra_rows = int(RATE * LARGE) - int(RATE * SMALL)
    growth_per_row = (large.allocated_bytes - small.allocated_bytes) / extra_rows
    assert 0 < growth_per_row < 128  # about ten int64 index vectors
    # no single allocation as large as two int64 per active row: a float32 (n, d) row buffer
    # is 4 d = 64 bytes a row, an (n, B) score buffer 4 B = 256
    assert large.largest_allocation_bytes < 16 * int(RATE * LARGE)


def test_targets_against_v2(budget):
    def run(layer, c, ops, syncs):
        return {"layer": layer, "num_classes": c, "ops": ops, "kernels": ops - 10, "syncs": syncs}

    runs = [run("partialfc", 10, 150, 2), run("arcface_torch_v2", 10, 100, 4),
            run("partialfc", 100, 151, 5), run("arcface_torch_v2", 100, 100, 4)]  # fmt: skip
    out = budget.targets(runs)
    assert [r["met"] for r in out["rows"]] == [True, False]  # 150 = 1.5 x 100; 5 syncs > 4
    assert out["rows"][0]["ops_over_v2"] == 1.5 and out["rows"][0]["kernels_over_v2"] == 1.556
    assert out["ops_independent_of_C"] is False


def test_ops_grow_with_the_number_of_chunks(budget):
    """``chunk_rows`` trades ops for memory: at SMALL's 2,000 active rows, chunks of 2^20
    (the default), 1000, 500 and 250 rows run 1, 2, 4 and 8 chunks; in each phase (forward,
    backward, optimizer) every chunk past the first adds the same ops (its GEMMs, reads,
    updates and writes), and no host sync."""
    phases = ("forward", "backward", "optimizer")
    ops = {}
    for chunk_rows, chunks in ((None, 1), (1000, 2), (500, 4), (250, 8)):
        setup = budget.StepSetup(SMALL, batch=BATCH, dim=DIM, rate=RATE, chunk_rows=chunk_rows)
        layer, opt = budget.build_partialfc(setup)
        assert layer.budget == 2000
        (record,) = budget.count_steps(layer, opt, setup, steps=1)
        assert dict(record["step"].sync_ops) == PINNED_SYNCS
        ops[chunks] = {phase: record[phase].ops for phase in phases}
    for phase in phases:
        per_chunk = ops[2][phase] - ops[1][phase]
        assert per_chunk > 0, phase
        for chunks in (4, 8):
            assert ops[chunks][phase] == ops[1][phase] + (chunks - 1) * per_chunk, (phase, chunks)
