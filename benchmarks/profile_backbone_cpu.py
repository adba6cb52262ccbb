"""Where one IResNet training step spends its time on a CPU: float32 against bfloat16 autocast,
contiguous against channels_last (``torch.profiler``, one thread).

For each model and each of the four variants: one warm-up step, then one profiled step
(forward + backward + SGD step on a mean-squared loss of the embeddings, so the head does not
count); the table keeps the operators with the largest self CPU time. The report also states
the machine's measured float32 / bfloat16 GEMM rates and the CPU capability, which decide
whether bfloat16 can be faster.

    python benchmarks/profile_backbone_cpu.py --out benchmarks/results/backbone_bf16_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

MODELS = {  # name -> (input size, channels, batch)
    "iresnet_small": (28, 1, 128),  # the Omniglot main job
    "iresnet18": (112, 3, 8),  # the face recipe's family at its real resolution
}


def profile_step(name: str, size: int, channels: int, batch: int, bf16: bool, last: bool, top):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from partialfc.models import build_model

    torch.manual_seed(0)
    model = build_model(name, embedding_dim=128, input_size=size, in_channels=channels)
    fmt = torch.channels_last if last else torch.contiguous_format
    model = model.to(memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, channels, size, size).to(memory_format=fmt)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            emb = model(x)
        loss = emb.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (oneDNN primitive creation, lazy allocations)
    t0 = time.process_time()  # CPU time: the machine may be shared
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    seconds = time.process_time() - t0
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return dict(
        model=name,
        input=[batch, channels, size, size],
        autocast="bfloat16" if bf16 else "off (float32)",
        memory_format="channels_last" if last else "contiguous",
        step_s=round(seconds, 3),
        top_ops=[
            dict(
                op=e.key,
                self_cpu_ms=round(e.self_cpu_time_total / 1e3, 2),
                share=round(e.self_cpu_time_total / total, 3),
                calls=e.count,
            )
            for e in rows
        ],
    )


def main(argv=None) -> int:
    import torch
    from bench_partial_fc import gemm_rates  # this directory is on sys.path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--top", type=int, default=8, help="operators kept per profile")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for name in args.models:
        size, channels, batch = MODELS[name]
        for bf16 in (False, True):
            for last in (False, True):
                rec = profile_step(name, size, channels, batch, bf16, last, args.top)
                results.append(rec)
                print(json.dumps({k: rec[k] for k in rec if k != "top_ops"}), flush=True)
    for name in args.models:
        base = next(r for r in results if r["model"] == name and r["autocast"].startswith("off")
                    and r["memory_format"] == "contiguous")  # fmt: skip
        for r in results:
            if r["model"] == name:
                r["step_vs_fp32_contiguous"] = round(r["step_s"] / base["step_s"], 2)
    report = dict(
        benchmark="backbone_bf16_profile_cpu",
        machine=dict(
            platform=platform.platform(),
            cpus=os.cpu_count(),
            torch=torch.__version__,
            mkldnn_bf16_supported=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            load_average_at_end=[round(v, 2) for v in os.getloadavg()],
            **gemm_rates(1),
        ),
        notes=(
            "one profiled training step after one warm-up, 1 thread; step_s = process CPU "
            "time of the step incl. the profiler's overhead; operator times are the "
            "profiler's (wall-clock, so inflated alike on a loaded machine); share = the "
            "operator's self time / all self time"
        ),
        results=results,
    )
    text = json.dumps(report, indent=1)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(args.out, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
