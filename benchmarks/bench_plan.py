"""The memory plan (``partialfc plan``) against measured peaks, and against the Partial FC paper.

Three parts, one JSON report:

* ``stored``: every CPU record of the layer benchmark in ``benchmarks/results`` (peak RSS minus
  the RSS before the layer was built, ``bench_partial_fc.py``), predicted by
  :func:`partialfc.classifier.plan.plan_run` with the record's settings: predicted / measured
  for the layer peak and for the working set (peak minus centers and optimizer state).
* ``measured``: configurations the stored records lack (AdamW, no momentum, sub-centers,
  bfloat16 optimizer state under float32 centers, 10^7 classes at d = 64), each measured here in
  a fresh process the same way (``--measure``; about two minutes on one core).
* ``paper``: the Partial FC paper's model-parallel memory analysis (An et al., arXiv
  2010.05222, §3.2.2: 1.3 GB per GPU at 8 GPUs, 5.9 GB at 80, logits 40 % -> 87 %) and the
  classifier share of its 8-GPU runs at 10M and 64M classes.

    python benchmarks/bench_plan.py --measure --out benchmarks/results/plan_vs_measured_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STORED = (
    "partial_fc_cpu.json",
    "partial_fc_cpu_b128.json",
    "partial_fc_cpu_r01_quiet.json",
    "partial_fc_mixed_cpu.json",
    "partial_fc_mixed_cpu_c1e5.json",
    "partial_fc_ten_million_cpu.json",
)
MEASURE = [
    dict(num_classes=100_000, batch=256, rate=0.1, optimizer="adamw", dim=512),
    dict(
        num_classes=1_000_000,
        batch=256,
        rate=0.1,
        optimizer="adamw",
        dim=512,
        storage_dtype="bfloat16",
    ),
    dict(
        num_classes=1_000_000, batch=256, rate=0.1, momentum=0.0, dim=512, storage_dtype="bfloat16"
    ),
    dict(num_classes=1_000_000, batch=256, rate=0.1, dim=512, state_dtype="bfloat16"),
    dict(num_classes=300_000, batch=256, rate=0.1, subcenters=3, dim=512),
    dict(num_classes=10_000_000, batch=128, rate=0.1, dim=64, storage_dtype="bfloat16"),
]


def spec_of(record: dict):
    """The :class:`RunSpec` of a benchmark record (CPU, one process per rank)."""
    from partialfc.classifier.plan import RunSpec

    world = record.get("world", 1)
    path = record.get("gemm_path", "auto")
    return RunSpec(
        num_classes=record["num_classes"],
        ranks=world,
        batch_per_rank=record["batch"] // world,
        embedding_dim=record.get("dim", 512),
        sample_rate=record["rate"],
        num_subcenters=record.get("subcenters", 1),
        storage_dtype=record.get("storage_dtype", "float32"),
        state_dtype=record.get("state_dtype"),
        compute_dtype=record.get("compute_dtype", "float32"),
        optimizer=record.get("optimizer", "sgd"),
        momentum=record.get("momentum", 0.9),
        device="cpu",
        method="partialfc" if record.get("update", "sparse") == "sparse" else "dense",
        gemm_path=path if path in ("native", "emulated") else "auto",
    )


def compare(record: dict, source: str) -> dict:
    """Predicted against measured layer peak (and working set) of one record."""
    from partialfc.classifier.plan import plan_run

    plan = plan_run(spec_of(record))
    predicted = plan.peak("device")
    measured = record["layer_peak_gb"] * 1e9
    state = record["state_gb"] * 1e9
    keys = (
        "num_classes",
        "batch",
        "rate",
        "world",
        "update",
        "storage_dtype",
        "compute_dtype",
        "gemm_path",
        "optimizer",
        "momentum",
        "state_dtype",
        "subcenters",
        "dim",
    )
    out = {k: record[k] for k in keys if k in record}
    peak_phase = max(plan.peaks["device"], key=plan.peaks["device"].get)
    out.update(
        source=source,
        measured_peak_gb=round(measured / 1e9, 3),
        predicted_peak_gb=round(predicted / 1e9, 3),
        ratio=round(predicted / measured, 3),
        predicted_phase=peak_phase,
        measured_state_gb=round(state / 1e9, 3),
        measured_working_gb=round((measured - state) / 1e9, 3),
        predicted_working_gb=round((predicted - plan.state_bytes()) / 1e9, 3),
    )
    return out


def stored_comparisons() -> list[dict]:
    out = []
    for name in STORED:
        report = json.loads((RESULTS / name).read_text())
        for record in report["results"]:
            if "layer_peak_gb" in record:
                out.append(compare(record, name))
    return out


def measure_one(cfg: dict) -> dict:
    """One configuration in this process: layer peak RSS over the RSS before it was built."""
    import torch

    sys.path.insert(0, str(HERE))
    from bench_partial_fc import _peak_rss_bytes, _rss_bytes, _warm_up_libraries

    from partialfc.classifier import PartialFC, RowSparseAdamW, RowSparseSGD
    from partialfc.losses.margins import ArcFaceMargin

    torch.set_num_threads(1)
    dim, batch = cfg.get("dim", 512), cfg["batch"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, dim, generator=gen).requires_grad_(True)
    y = torch.randint(0, cfg["num_classes"], (batch,), generator=gen)
    _warm_up_libraries("cpu", 1)
    base = _rss_bytes()
    storage = getattr(torch, cfg.get("storage_dtype", "float32"))
    state = getattr(torch, cfg["state_dtype"]) if "state_dtype" in cfg else None
    pfc = PartialFC(
        cfg["num_classes"],
        dim,
        ArcFaceMargin(),
        sample_rate=cfg["rate"],
        num_subcenters=cfg.get("subcenters", 1),
        storage_dtype=storage,
    )
    if cfg.get("optimizer", "sgd") == "adamw":
        opt = RowSparseAdamW(pfc, lr=1e-3, state_dtype=state)
    else:
        opt = RowSparseSGD(pfc, lr=0.1, momentum=cfg.get("momentum", 0.9), state_dtype=state)
    state_bytes = pfc.centers.nbytes() + sum(t.nbytes() for t in opt.tables.values())
    if hasattr(opt, "row_steps"):
        state_bytes += opt.row_steps.numel() * opt.row_steps.element_size()
    for _ in range(cfg.get("steps", 2)):
        pfc(x, y).backward()
        opt.step()
        x.grad = None
    return dict(
        cfg,
        layer_peak_gb=round((_peak_rss_bytes() - base) / 1e9, 3),
        state_gb=round(state_bytes / 1e9, 3),
        active_rows_per_rank=pfc.budget * pfc.num_subcenters,
    )


def measured_comparisons() -> list[dict]:
    out = []
    for cfg in MEASURE:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(cfg)],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            out.append(dict(cfg, error=(proc.stderr.strip().splitlines() or ["no output"])[-1]))
            continue
        record = json.loads(lines[-1][len("RESULT ") :])
        out.append(compare(record, "measured here"))
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def paper_checks() -> dict:
    """The paper's model-parallel analysis, and the classifier share of its 8-GPU runs."""
    from partialfc.classifier.plan import RunSpec, plan_run

    analysis = []
    for gpus, fc_gb, logit_share in ((8, 1.3, 0.40), (80, 5.9, 0.87)):
        # §3.2.2: N = 64 samples per GPU, d = 512, ~125K classes per GPU, float32, SGD momentum
        plan = plan_run(RunSpec(125_000 * gpus, gpus, 64, 512, method="model-parallel"))
        total = plan.peak("device")
        analysis.append(
            dict(
                gpus=gpus,
                classes=125_000 * gpus,
                batch_per_gpu=64,
                paper_fc_gb=fc_gb,
                predicted_fc_gb=round(total / 1e9, 3),
                paper_logit_share=logit_share,
                predicted_logit_share=round(plan.by_category()["logits"] / total, 3),
            )
        )
    runs = []
    # CVPR 2022 Table 6 (ResNet100, V100 32 GB, mixed precision; memory = the whole GPU) and
    # the 64M / 128M-class runs of arXiv 2010.05222v4 on 8 x 80 GB
    setups = [
        ("model parallel, 2M, Table 6", 2_000_000, 128, 1.0, "model-parallel", 18.9),
        ("PFC-0.1, 2M, Table 6", 2_000_000, 128, 0.1, "partialfc", 11.8),
        ("model parallel, 10M, Table 6", 10_000_000, 16, 1.0, "model-parallel", 32.0),
        ("PFC-0.1, 10M, Table 6", 10_000_000, 64, 0.1, "partialfc", 14.1),
        ("PFC-0.1, 64M, 8 x 80 GB (runs)", 64_000_000, 128, 0.1, "partialfc", None),
        ("PFC-0.1, 128M, 8 x 80 GB (fails)", 128_000_000, 128, 0.1, "partialfc", None),
    ]
    for name, classes, batch, rate, method, paper_gb in setups:
        plan = plan_run(RunSpec(classes, 8, batch, 512, sample_rate=rate, method=method))
        runs.append(
            dict(
                run=name,
                classes=classes,
                gpus=8,
                batch_per_gpu=batch,
                sample_rate=rate,
                paper_gpu_memory_gb=paper_gb,
                predicted_classifier_gb=round(plan.peak("device") / 1e9, 2),
                predicted_by_category_gb={
                    k: round(v / 1e9, 3) for k, v in plan.by_category().items()
                },
                wire_mib_per_step=round(sum(m.wire_bytes for m in plan.messages) / 2**20, 2),
            )
        )
    return dict(model_parallel_analysis=analysis, eight_gpu_runs=runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="also measure the extra configs")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(measure_one(json.loads(args.worker))))
        return 0
    stored = stored_comparisons()
    measured = measured_comparisons() if args.measure else []
    rows = [r for r in stored + measured if "ratio" in r]
    in_range = [r for r in rows if r["num_classes"] >= 100_000]
    report = dict(
        benchmark="plan_vs_measured",
        notes=(
            "measured = peak RSS - RSS before the layer was built (bench_partial_fc.py's method), "
            "one process per rank, CPU; predicted = plan_run(...).peak('device') of rank 0; "
            "working = peak - (centers + optimizer state); ratio = predicted / measured"
        ),
        summary=dict(
            records=len(rows),
            records_c_ge_1e5=len(in_range),
            ratio_min_c_ge_1e5=min(r["ratio"] for r in in_range),
            ratio_max_c_ge_1e5=max(r["ratio"] for r in in_range),
            ratio_min_all=min(r["ratio"] for r in rows),
            ratio_max_all=max(r["ratio"] for r in rows),
        ),
        stored=stored,
        measured=measured,
        paper=paper_checks(),
    )
    text = json.dumps(report, indent=1)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(args.out, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
