"""The memory plan: hand-worked numbers, the layer's own buffers after a step, the project's
measured CPU peaks, the Partial FC paper's model-parallel figures, and the command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from partialfc.classifier import PartialFC, RowSparseAdamW, RowSparseSGD
from partialfc.classifier import storage as storage_module
from partialfc.classifier.plan import RunSpec, plan_run
from partialfc.cli import main
from partialfc.losses.margins import ArcFaceMargin
from tests.benchmarks.scripts import benchmark_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _bytes(plan, prefix: str) -> int:
    return sum(i.bytes for i in plan.items if i.name.startswith(prefix))


# ---------------------------------------------------------------- the paper (§3.2.2)
@pytest.mark.parametrize(
    "gpus, total, share",
    [
        # 125K classes per GPU, 64 samples per GPU, d = 512, float32: weight + gradient +
        # momentum = 3 * 4 * 512 * 125000 = 768 MB; logits + their gradient = 2 * 4 * (64 k) *
        # 125000; gathered embeddings 64 k * 512 * 4
        (8, 768_000_000 + 512_000_000 + 1_048_576, 0.40),
        (80, 768_000_000 + 5_120_000_000 + 10_485_760, 0.87),
    ],
)
def test_model_parallel_memory_of_the_paper(gpus, total, share):
    plan = plan_run(RunSpec(125_000 * gpus, gpus, 64, 512, method="model-parallel"))
    assert plan.peak("device") == total  # the paper: 1.3 GB at 8 GPUs, 5.9 GB at 80
    assert round(total / 1e9, 1) == (1.3 if gpus == 8 else 5.9)
    assert plan.by_category()["logits"] / total == pytest.approx(share, abs=0.005)


# ---------------------------------------------------------------- hand-worked pieces
def test_init_chunks_of_a_hundred_thousand_classes():
    # chunk 0: rows 0..65535 drawn (block) and cut (out): 2 * 65536 * 2048 B; chunk 1: 34464
    # rows twice while chunk 0's rows are still referenced: 65536 * 2048 + 2 * 34464 * 2048
    plan = plan_run(RunSpec(100_000, 1, 256, 512, device="cpu"))
    assert _bytes(plan, "table fill") == 134_217_728 + 2 * 70_582_272
    assert plan.peaks["device"]["init"] == 100_000 * 2048 + 275_382_272


def test_step_items_of_a_float32_sgd_rank():
    plan = plan_run(RunSpec(1_000_000, 1, 256, 512, sample_rate=0.1, device="cpu"))
    assert plan.active_rows == 100_000
    assert _bytes(plan, "centers") == 1_000_000 * 512 * 4
    assert _bytes(plan, "optimizer state (") == 1_000_000 * 512 * 4
    assert _bytes(plan, "scores") == 100_000 * 256 * 4
    assert _bytes(plan, "row chunk") == 2048 * 512 * 4  # CPU chunks of 2048 rows
    assert plan.gemm_flops_per_step == 6 * 100_000 * 256 * 512


def test_positives_above_the_budget_take_the_batch():
    # r * C_local = 10 classes but a global batch of 64 can hold 64 distinct local classes
    plan = plan_run(RunSpec(100, 1, 64, 8, sample_rate=0.1, device="cpu"))
    assert plan.active_classes == 64


def test_messages_of_eight_ranks():
    plan = plan_run(RunSpec(10_000_000, 8, 128, 512))
    by_name = {m.name.split(" (")[0]: m for m in plan.messages}
    gathered = 1024 * 512 * 4
    assert by_name["embeddings"].bytes == gathered
    assert by_name["embeddings"].wire_bytes == 7 * gathered // 8  # ring all-gather: 1,835,008
    assert by_name["embedding gradient of the global batch"].wire_bytes == 7 * gathered // 4
    assert by_name["labels"].bytes == 1024 * 8
    assert by_name["sum of exp and target logit"].bytes == 2 * 1024 * 4
    assert plan_run(RunSpec(10_000_000, 1, 128, 512)).messages == []
    paper = {m.name: m for m in plan_run(RunSpec(10**6, 8, 128, method="model-parallel")).messages}
    assert paper["embedding gradient"].op == "reduce_scatter"
    assert paper["embedding gradient"].wire_bytes == 7 * gathered // 8


def test_host_storage_keeps_the_tables_on_the_host():
    spec = RunSpec(10_000_000, 1, 512, 512, storage="host", storage_dtype="bfloat16")
    plan = plan_run(spec)
    on_host = {i.name for i in plan.items if i.where == "host"}
    assert {"centers", "optimizer state (1 tables, bfloat16)"} <= on_host
    assert _bytes(plan, "device copy of the active rows") == 1_000_000 * 512 * 4
    # rows, their momentum (bfloat16 both) and the row indices, each way
    assert plan.bus_bytes_per_step == 2 * 1_000_000 * 512 * (2 + 2) + 2 * 1_000_000 * 8
    assert plan.peak("host") >= 2 * 10_000_000 * 512 * 2


def test_device_chunks_and_noise_pool_on_a_gpu():
    assert storage_module.DEVICE_CHUNK_ROWS == 2**20  # the numbers below are worked for it
    # 1.25M classes per rank, r = 0.1: 125,000 active rows, one chunk of 125,000 rows
    plan = plan_run(RunSpec(10_000_000, 8, 128, 512, storage_dtype="bfloat16"))
    assert _bytes(plan, "row chunk") == 125_000 * 512 * 4
    assert _bytes(plan, "staging chunk of the centers") == 125_000 * 512 * 2
    assert _bytes(plan, "radial pass") == 125_000 * (512 + 2) * 4
    # 64,000,000 values per write -> a pool of 2^26 int32 values, stored twice on the device;
    # drawn once on the host (2^26 int32) and doubled there (2 x 2^26) before it moves
    assert _bytes(plan, "stochastic-rounding") == 2 * 2**26 * 4
    assert _bytes(plan, "noise pool draw") == 3 * 2**26 * 4
    assert plan.peaks["host"]["optimizer"] == 3 * 2**26 * 4
    # the optimizer's temporaries: a chunk rounded to bfloat16
    assert _bytes(plan, "bfloat16 rounding") == 125_000 * 512 * 2
    # 12.5M classes per rank: 1,250,000 active rows, chunks of 2^20 and 201,424 rows, so two
    # write sizes: 2^29 values (a pool of 2^29) and 103,129,088 (a pool of 2^27)
    plan = plan_run(RunSpec(100_000_000, 8, 128, 512, storage_dtype="bfloat16"))
    assert plan.active_rows == 1_250_000
    assert _bytes(plan, "row chunk") == 2**20 * 512 * 4
    assert _bytes(plan, "stochastic-rounding") == 2 * (2**29 + 2**27) * 4
    assert _bytes(plan, "noise pool draw") == 3 * 2**29 * 4


def test_fit_and_errors():
    plan = plan_run(RunSpec(64_000_000, 8, 128, 512))
    assert plan.fits(80 * 2**30) and not plan.fits(32 * 2**30)
    big = plan_run(RunSpec(128_000_000, 8, 128, 512))  # 16M classes per rank
    # forward of rank 0: 1.6M active rows in chunks of c = 2^20 rows; B = 1024, d = 512
    n, c, d, big_b = 1_600_000, 2**20, 512, 1024
    table = 16_000_000 * d * 4  # 32.8 GB, twice: centers and momentum
    chunks = 4 * c * d * 4  # layer rows, optimizer rows, center gradient, momentum (2 GiB each)
    radial = c * (d + 2) * 4
    scores = n * big_b * 4  # 6.6 GB
    indices = n * 8 + 2 * n * 4 + 2 * big_b * 8 + big_b * 8  # rows, 1/|w| and s/|w|, labels
    batch = 128 * d * 4 + big_b * d * 4 + 8 * 128 * d * 4  # x_hat, gathered, gather blocks
    sampling = 6 * n * 8  # the draw's int64 vectors (draws, unique, sort)
    forward = 2 * table + chunks + radial + scores + indices + batch + sampling
    assert big.peaks["device"]["forward"] == forward == big.peak("device")
    assert 77 * 2**30 < forward < 78 * 2**30
    assert big.fits(80 * 2**30, 2 * 2**30) and not big.fits(80 * 2**30, 3 * 2**30)
    with pytest.raises(ValueError, match="batch_per_rank must be a positive integer"):
        plan_run(RunSpec(1000, 1, 0))
    with pytest.raises(ValueError, match="sample_rate must be in"):
        plan_run(RunSpec(1000, sample_rate=1.5))
    with pytest.raises(ValueError, match="method dense"):
        plan_run(RunSpec(1000, storage_dtype="bfloat16", method="dense"))


# ---------------------------------------------------------------- the layer's own buffers
@pytest.mark.parametrize("chunk_setting", ["cpu", "device", 1000], ids=lambda c: f"chunk-{c}")
@pytest.mark.parametrize(
    "storage, optimizer, k",
    [(torch.float32, "sgd", 1), (torch.bfloat16, "sgd", 1), (torch.bfloat16, "adamw", 2)],
)
def test_buffers_after_a_step_are_the_planned_ones(
    storage, optimizer, k, chunk_setting, monkeypatch
):
    """The layer's reused buffers after a real step, byte for byte. ``chunk-cpu``: the CPU's
    default chunk; ``chunk-device``: the accelerator's chunk (``chunk_rows=2**20``: one chunk
    of all 3,000 / 6,000 active rows) run on the CPU and planned for a GPU (every chunk-sized
    buffer then holds all active rows); ``chunk-1000``: a chosen chunk, on the layer and in
    the spec."""
    monkeypatch.setattr(storage_module, "_NOISE_POOLS", {})
    layer_chunk = {"cpu": None, "device": 2**20}.get(chunk_setting, chunk_setting)
    classes, d, batch, rate = 30_000, 16, 32, 0.1
    pfc = PartialFC(
        classes,
        d,
        ArcFaceMargin(),
        sample_rate=rate,
        num_subcenters=k,
        storage_dtype=storage,
        chunk_rows=layer_chunk,
    )
    opt = RowSparseAdamW(pfc) if optimizer == "adamw" else RowSparseSGD(pfc, lr=0.1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d, generator=gen, requires_grad=True)
    pfc(x, torch.randint(0, classes, (batch,), generator=gen)).backward()
    opt.step()
    dtype = str(storage).removeprefix("torch.")
    device = "cuda" if chunk_setting == "device" else "cpu"
    spec_chunk = chunk_setting if isinstance(chunk_setting, int) else None
    plan = plan_run(
        RunSpec(
            classes,
            1,
            batch,
            d,
            rate,
            k,
            dtype,
            optimizer=optimizer,
            device=device,
            chunk_rows=spec_chunk,
        )
    )
    chunk = {"cpu": 2048, "device": 3_000 * k}.get(chunk_setting, chunk_setting)

    def held(buffer):
        return buffer._storage.numel() * buffer._storage.element_size()

    assert plan.active_rows == pfc.budget * k
    assert _bytes(plan, "centers") == pfc.centers.nbytes()
    state = sum(t.nbytes() for t in opt.tables.values())
    state += opt.row_steps.numel() * 4 if optimizer == "adamw" else 0
    assert _bytes(plan, "optimizer state (") + _bytes(plan, "AdamW per-row") == state
    assert plan.state_bytes() == pfc.centers.nbytes() + state
    assert _bytes(plan, "scores") == held(pfc._scores_buffer)
    assert _bytes(plan, "row chunk") == held(pfc._chunk_buffer) == chunk * d * 4
    assert _bytes(plan, "optimizer row chunk") == held(opt._weight_scratch)
    assert _bytes(plan, "center gradient chunk") == held(opt._grad_scratch)
    assert _bytes(plan, "optimizer state chunks") == sum(held(b) for b in opt._scratch.values())
    assert _bytes(plan, "1 / |w| and s / |w|") == held(pfc._inv_norm_buffer)
    assert _bytes(plan, "radial pass") == held(opt._radial_scratch) == chunk * (d + 2) * 4
    if storage == torch.bfloat16:
        assert _bytes(plan, "staging chunk of the centers") == held(pfc.centers._staging)
        stagings = sum(held(t._staging) for t in opt.tables.values())
        assert _bytes(plan, "optimizer state staging") == stagings
        pools = storage_module._NOISE_POOLS
        assert _bytes(plan, "stochastic-rounding") == sum(
            p.numel() * 4 for (dev, _), p in pools.items() if dev == "cpu"
        )


def _phase_peaks_of_the_second_step(pfc, opt, x, y) -> dict[str, int]:
    """Peak live bytes of the CPU allocator in each phase of a second step, counted from before
    the layer was built (torch.profiler's allocation and free events, in time order)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer, optimizer = pfc(), None
        optimizer = opt(layer)
        for step in range(2):
            with record_function(f"phase:forward:{step}"):
                loss = layer(x, y)
            with record_function(f"phase:backward:{step}"):
                loss.backward()
                del loss
            with record_function(f"phase:optimizer:{step}"):
                optimizer.step()
            x.grad = None
    events = prof.profiler.kineto_results.events()
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    phases = sorted(
        (e.start_ns(), e.end_ns(), e.name().split(":")[1])
        for e in events
        if e.name().startswith("phase:") and e.name().endswith(":1")
    )
    live, i, peaks = 0, 0, {}
    for start, end, name in phases:
        while i < len(memory) and memory[i][0] < start:
            live += memory[i][1]
            i += 1
        peak = live
        while i < len(memory) and memory[i][0] <= end:
            live += memory[i][1]
            i += 1
            peak = max(peak, live)
        peaks[name] = peak
    return peaks


@pytest.mark.parametrize(
    "accelerator_chunk, storage, compute, optimizer, k",
    [
        (False, "float32", "float32", "sgd", 1),
        (True, "float32", "float32", "sgd", 1),
        (False, "float32", "bfloat16", "sgd", 1),  # emulated: rounded operands
        (True, "bfloat16", "bfloat16", "adamw", 2),  # emulated, bfloat16 rows and moments
    ],
)
def test_phase_peaks_of_a_real_step(accelerator_chunk, storage, compute, optimizer, k, monkeypatch):
    """Everything the step allocates, not only the reused buffers: the allocator's peak per
    phase of a real second step against the plan's (the draw's index vectors are random in
    size, so within 1 %). ``accelerator_chunk``: one chunk of all active rows, planned for a
    GPU (whose first-step noise-pool draw is on the host; the second step has none)."""
    monkeypatch.setattr(storage_module, "_NOISE_POOLS", {})
    classes, d, batch, rate = 30_000, 128, 64, 0.1
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d, generator=gen, requires_grad=True)
    y = torch.randint(0, classes, (batch,), generator=gen)

    def layer():
        return PartialFC(
            classes,
            d,
            ArcFaceMargin(),
            sample_rate=rate,
            num_subcenters=k,
            storage_dtype=getattr(torch, storage),
            compute_dtype=compute,
            gemm_path="auto" if compute == "float32" else "emulated",
            chunk_rows=2**20 if accelerator_chunk else None,
        )

    def make_optimizer(pfc):
        return RowSparseAdamW(pfc) if optimizer == "adamw" else RowSparseSGD(pfc, lr=0.1)

    measured = _phase_peaks_of_the_second_step(layer, make_optimizer, x, y)
    spec = RunSpec(
        classes,
        1,
        batch,
        d,
        rate,
        k,
        storage,
        compute_dtype=compute,
        optimizer=optimizer,
        device="cuda" if accelerator_chunk else "cpu",
        gemm_path="auto" if compute == "float32" else "emulated",
    )
    planned = plan_run(spec).peaks["device"]
    for phase in ("forward", "backward", "optimizer"):
        assert planned[phase] == pytest.approx(measured[phase], rel=0.01), phase


# ---------------------------------------------------------------- measured CPU peaks
@pytest.fixture(scope="module")
def bench():
    with benchmark_script("bench_plan") as module:
        yield module


def test_stored_cpu_peaks_from_1e5_to_1e7_within_15_percent(bench):
    rows = [r for r in bench.stored_comparisons() if r["num_classes"] >= 100_000]
    assert len(rows) >= 30 and max(r["num_classes"] for r in rows) == 10_000_000
    off = [r for r in rows if not 0.85 <= r["ratio"] <= 1.15]
    assert not off, off


def test_configurations_measured_for_the_plan_within_15_percent(bench):
    report = json.loads((RESULTS / "plan_vs_measured_cpu.json").read_text())
    measured = report["measured"]
    assert {r.get("optimizer") for r in measured} >= {"adamw"}
    for record in measured:
        again = bench.compare(
            dict(
                record,
                layer_peak_gb=record["measured_peak_gb"],
                state_gb=record["measured_state_gb"],
            ),
            "measured here",
        )
        assert 0.85 <= again["ratio"] <= 1.15, record


# ---------------------------------------------------------------- the command
def test_command_json(capsys):
    argv = ["plan", "--classes", "64000000", "--ranks", "8", "--batch", "128", "--json"]
    assert main(argv + ["--device-memory-gib", "80"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["classes_per_rank"] == 8_000_000 and out["active_rows"] == 800_000
    assert out["fits"] is True
    assert out["peak_bytes"]["device"] == plan_run(RunSpec(64_000_000, 8, 128)).peak("device")
    assert main(argv + ["--device-memory-gib", "32"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is False


def test_command_table(capsys):
    assert main(["plan", "--classes", "1000000", "--ranks", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "scores / softmax gradient" in out and "fits in 80 GiB" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--batch", "0"], "--batch must be a positive integer, got 0"),
        (["--sample-rate", "0"], "--sample-rate must be in (0, 1], got 0.0"),
        (["--device-memory-gib", "-1"], "--device-memory-gib must be"),
        (["--compute-dtype", "float16", "--device", "cpu"], "float16 needs device cuda"),
        (["--chunk-rows", "0"], "--chunk-rows must be a positive integer or None, got 0"),
    ],
)
def test_command_names_the_bad_option(capsys, extra, message):
    assert main(["plan", "--classes", "1000"] + extra) == 2
    assert message in capsys.readouterr().err


def _chunk_scratch(chunk: int, n: int, d: int) -> int:
    """Device bytes of 64M / 8 / bfloat16 (SGD momentum, float32 GEMMs) that follow the chunk,
    alive in every phase of the step, worked from the layer: four float32 chunk buffers (rows
    of the softmax, of the optimizer, their gradient, the momentum) and the radial pass
    ``c (d + 2)``, two bfloat16 staging chunks (centers, momentum), and a stochastic-rounding
    noise pool per distinct write size, ``max(2^20, 2^ceil(log2(rows d)))`` int32 values kept
    twice."""
    c = min(chunk, n)
    pools = 0
    for rows in {c, n % chunk if n > chunk else 0} - {0}:
        pools += 2 * 4 * max(2**20, 2 ** math.ceil(math.log2(rows * d)))
    return 4 * c * d * 4 + c * (d + 2) * 4 + 2 * c * d * 2 + pools


def test_chunk_rows_trades_the_step_scratch(capsys):
    """64M classes on 8 GPUs, bfloat16 centers and momentum: the plan at ``--chunk-rows
    65536`` and at the default 2^20 differ in the forward phase by exactly the chunk-sized
    scratch, recomputed here; 800,000 active rows a rank are 13 chunks of 2^16 (the last of
    13,568 rows: a second, smaller noise pool) or one chunk."""
    n, d = 800_000, 512
    assert _chunk_scratch(
        2**16, n, d
    ) == 4 * 2**16 * 512 * 4 + 2**16 * 514 * 4 + 2 * 2**16 * 1024 + 8 * (2**25 + 2**23)
    argv = [
        "plan",
        "--classes",
        "64000000",
        "--ranks",
        "8",
        "--storage-dtype",
        "bfloat16",
        "--json",
    ]
    peaks = {}
    for chunk in (None, 2**16):
        assert main(argv + ([] if chunk is None else ["--chunk-rows", str(chunk)])) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["active_rows"] == n and out["spec"]["chunk_rows"] == chunk
        peaks[chunk] = out["peaks"]["device"]["forward"]
    saved = peaks[None] - peaks[2**16]
    assert saved == _chunk_scratch(2**20, n, d) - _chunk_scratch(2**16, n, d)
    assert round(saved / 2**30, 2) == 12.10  # 1.53 GiB per float32 buffer of 800,000 rows
    with pytest.raises(ValueError, match="chunk_rows must be a positive integer"):
        plan_run(RunSpec(1000, chunk_rows=0))
    assert plan_run(RunSpec(1000, chunk_rows=7)).spec.chunk == 7
    assert RunSpec(1000).chunk == 2**20 and RunSpec(1000, device="cpu").chunk == 2048
