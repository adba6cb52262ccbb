"""Backbone sizes and CPU training throughput, as JSON.

For every model: parameters, forward MACs per image (``gmacs``; ``gflops = 2 × gmacs``), and
for the timed models fp32 channels-last forward+backward+SGD images/s on this CPU, with the
achieved GFLOP/s (a training step ≈ 3 × forward FLOPs) next to a bare fp32 GEMM measured in
the same process, i.e. how close the backbone gets to the machine's matmul limit.

    python benchmarks/bench_models.py --threads 2 --out bench_models.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from partialfc.models import MODELS, build_model, complexity

# (name, input size, channels, batch) timed by default; the large models are only counted
DEFAULT_TIMED = [
    ("iresnet_small", 28, 1, 128),
    ("mobilefacenet", 28, 1, 128),
    ("mobilefacenet", 112, 3, 16),
    ("iresnet18", 112, 3, 8),
]


def gemm_gflops(n: int = 1024, iters: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e9


def train_throughput(name, input_size, in_channels, batch, warmup, iters) -> float:
    model = build_model(name, input_size=input_size, in_channels=in_channels)
    model = model.to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, in_channels, input_size, input_size)
    x = x.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for i in range(warmup + iters):
        if i == warmup:
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    return batch * iters / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-timing", action="store_true", help="only count params and MACs")
    parser.add_argument("--out", default=None, help="write the JSON here as well as stdout")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    counts = []
    for name in MODELS:
        for size, ch in ((112, 3), (28, 1)):
            with torch.device("meta"):
                model = build_model(name, input_size=size, in_channels=ch)
            counts.append({"model": name, "input": [ch, size, size], **complexity(model).to_dict()})

    timings = []
    gemm = gemm_gflops()
    if not args.no_timing:
        for name, size, ch, batch in DEFAULT_TIMED:
            with torch.device("meta"):
                fwd_gflops = complexity(build_model(name, input_size=size, in_channels=ch)).gflops
            ips = train_throughput(name, size, ch, batch, args.warmup, args.iters)
            achieved = ips * 3 * fwd_gflops
            timings.append(
                {
                    "model": name,
                    "input": [ch, size, size],
                    "batch": batch,
                    "train_images_per_s": round(ips, 1),
                    "achieved_gflop_per_s": round(achieved, 2),
                    "fraction_of_gemm": round(achieved / gemm, 3),
                }
            )
    result = {
        "machine": {"processor": platform.processor(), "threads": args.threads},
        "torch": torch.__version__,
        "units": "gmacs = 1e9 multiply-accumulates per image forward; gflops = 2 * gmacs",
        "fp32_gemm_gflop_per_s": round(gemm, 1),
        "counts": counts,
        "train_fp32_channels_last": timings,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
