"""benchmarks/bench_partial_fc.py: the row-traffic floor and the limits it reports (not speed)."""

import pytest
import torch

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("bench_partial_fc") as module:
        yield module


def test_row_traffic_leaves_every_table_as_it_was(bench):
    gen = torch.Generator().manual_seed(3)
    centers = torch.randn(500, 16, generator=gen)
    momentum = torch.randn(500, 16, generator=gen).to(torch.bfloat16)
    before = centers.clone(), momentum.clone()
    seconds = bench._row_traffic_seconds([centers, momentum], active_rows=50, repeats=1)
    assert seconds > 0
    assert torch.equal(centers, before[0]) and torch.equal(momentum, before[1])


def test_limit_is_the_gemms_plus_the_row_traffic(bench):
    cfg = dict(num_classes=1000, batch=8, rate=0.1, world=1, update="sparse", steps=1)
    res = dict(
        step_s=0.5, step_min_s=0.4, step_cpu_s=0.45, gemm_s=0.2, rows_s=0.1, loss=1.0,
        active_rows_per_rank=100, state_bytes=4096 * 1000, layer_peak_bytes=5_000_000,
        peak_rss_bytes=9_000_000, gemm_path="float32 (float32)",
    )  # fmt: skip
    out = bench._summarise(cfg, res)
    assert out["row_traffic_ms"] == 100.0
    assert out["limit_ms"] == 300.0
    assert out["cpu_ratio_to_limit"] == 1.5  # 0.45 s of CPU time over the 0.3 s floor
    assert out["cpu_ratio_to_gemm"] == 2.25
    dense = bench._summarise(
        dict(cfg, update="dense"), {k: v for k, v in res.items() if k != "rows_s"}
    )
    assert "limit_ms" not in dense
