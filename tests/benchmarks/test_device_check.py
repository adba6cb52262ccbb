"""benchmarks/device_check.py: its dry run (the GPU run's code on the CPU), the time boxes and
the profiler table (not speed)."""

import json
import math
import time
from types import SimpleNamespace

import pytest

from tests.benchmarks.scripts import benchmark_script

CLASSES, DIM, RATE = 10_000, 64, 0.1


@pytest.fixture(scope="module")
def check():
    with benchmark_script("device_check") as module:
        yield module


@pytest.fixture(scope="module")
def dry_run(check, tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check") / "dry.json"
    assert check.main(["--dry-run", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_dry_run_records_every_configuration(dry_run):
    parts = dry_run["parts"]
    assert dry_run["dry_run"] is True and dry_run["v2"] is None
    assert parts["environment"]["status"] == "ok"
    steps = {k: v for k, v in parts.items() if k.startswith("step/")}
    expected = {f"step/partialfc/C=1e+04/{m}/B={b}" for m in ("fp32", "bf16", "fp16")
                for b in (32, 16)}  # fmt: skip
    assert set(steps) == expected
    assert all(v["status"] == "ok" for v in steps.values())
    assert len(parts["summary"]["rows"]) == 6


def test_dry_run_values_are_plausible(dry_run):
    peaks = dry_run["parts"]["environment"]["peak_flops_measured"]
    for name, rec in dry_run["parts"].items():
        if not name.startswith("step/"):
            continue
        batch, mode = rec["batch"], rec["mode"]
        assert rec["active_rows"] == math.ceil(RATE * CLASSES)
        flops = 3 * 2 * batch * 1000 * DIM  # three GEMMs over the 1,000 active rows
        assert rec["gemm_flops"] == flops
        assert rec["gemm_limit_measured_peak_ms"] == pytest.approx(flops / peaks[mode] * 1e3)
        assert rec["step_ms"] > 0 and rec["step_min_ms"] <= rec["step_ms"]
        assert rec["timed_steps"] == 2 and all(math.isfinite(v) for v in rec["losses"])
        # the sampling's two host reads, and the GradScaler's read of its inf check with fp16
        assert rec["host_syncs"] == (3 if mode == "fp16" else 2)
        profile = rec["profile"]
        assert profile["kernels_per_step"] > 50 and profile["top_kernels"]
        assert 0 < profile["busy_us_per_step"] <= profile["span_us_per_step"]
        assert profile["idle_between_kernels_us_per_step"] >= 0


def _event(start, end, name):
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), name=name)


def test_kernel_table_busy_idle_and_ranking(check):
    events = [_event(0, 10, "a"), _event(5, 12, "b"), _event(20, 25, "a"), _event(26, 27, "c")]
    table = check.kernel_table(events, steps=1)
    assert table["kernels_per_step"] == 4
    assert table["busy_us_per_step"] == 18  # [0, 12] and [20, 25] and [26, 27]
    assert table["span_us_per_step"] == 27
    assert table["idle_between_kernels_us_per_step"] == 9
    assert [g["gap_us"] for g in table["largest_gaps_us"]] == [8, 1]
    assert table["largest_gaps_us"][0] == {"gap_us": 8, "after": "b", "before": "a"}
    top = table["top_kernels"][0]
    assert (top["name"], top["count_per_step"], top["us_per_step"]) == ("a", 2, 15)
    assert top["share_of_busy"] == pytest.approx(15 / 18, abs=1e-4)


def test_a_part_past_its_budget_keeps_what_it_measured(check, tmp_path):
    out = tmp_path / "run.json"
    run = check.Run(out, budget_s=30, meta={})

    def slow(record):
        record["measured"] = 1
        time.sleep(5)

    rec = run.part("slow", 0.5, slow)
    assert rec["status"] == "timeout" and rec["measured"] == 1 and rec["seconds"] < 3
    on_disk = json.loads(out.read_text())["parts"]["slow"]
    assert on_disk["status"] == "timeout" and on_disk["measured"] == 1
    broken = run.part("broken", 5, lambda record: 1 / 0)
    assert broken["status"] == "error" and "ZeroDivisionError" in broken["error"]
    run.deadline = time.monotonic() + 1  # 1 s of the run left: a 20 s part does not start
    assert run.part("late", 20, slow)["status"] == "skipped"


def test_gemm_limit_formula(check):
    assert check.gemm_flops(512, 100_000, 512) == 6 * 512 * 100_000 * 512
    assert check.spec_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert check.spec_peak_flops("unknown", "fp32") is None
