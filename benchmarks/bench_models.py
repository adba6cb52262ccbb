"""Backbone sizes and CPU training throughput, as JSON.

For every model: parameters, forward MACs per image (``gmacs``; ``gflops = 2 × gmacs``), and
for the timed models fp32 channels-last forward+backward+SGD images/s on this CPU, with the
achieved GFLOP/s (a training step ≈ 3 × forward FLOPs) next to a bare fp32 GEMM measured in
the same process, i.e. how close the backbone gets to the machine's matmul limit. Each timed
model is also run in the plain (NCHW) layout, alternating with channels-last, so that
``channels_last_speedup`` (what ``train.channels_last`` buys) is a ratio measured side by side.

    python benchmarks/bench_models.py --threads 2 --out bench_models.json
    python benchmarks/bench_models.py --threads 1 --timed iresnet_small:28:1:128
"""

from __future__ import annotations

import argparse
import json
import os
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


def train_throughput(
    name, input_size, in_channels, batch, warmup, iters, channels_last: bool = True
) -> float:
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = build_model(name, input_size=input_size, in_channels=in_channels)
    model = model.to(memory_format=layout).train()
    x = torch.randn(batch, in_channels, input_size, input_size)
    x = x.to(memory_format=layout)
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
    parser.add_argument(
        "--timed",
        action="append",
        default=None,
        metavar="NAME:SIZE:CHANNELS:BATCH",
        help="a model to time (repeatable); default: "
        + ", ".join(f"{n}:{s}:{c}:{b}" for n, s, c, b in DEFAULT_TIMED),
    )
    args = parser.parse_args()
    timed = DEFAULT_TIMED
    if args.timed:
        timed = []
        for spec in args.timed:
            parts = spec.split(":")
            if len(parts) != 4 or parts[0] not in MODELS or not all(p.isdigit() for p in parts[1:]):
                parser.error(f"--timed {spec!r}: expected NAME:SIZE:CHANNELS:BATCH, NAME in "
                             f"{sorted(MODELS)}")  # fmt: skip
            timed.append((parts[0], *map(int, parts[1:])))
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
        for name, size, ch, batch in timed:
            with torch.device("meta"):
                fwd_gflops = complexity(build_model(name, input_size=size, in_channels=ch)).gflops
            rates = {True: [], False: []}
            for _ in range(2):  # alternate the layouts: a load change hits both
                for channels_last in (True, False):
                    rates[channels_last].append(
                        train_throughput(
                            name, size, ch, batch, args.warmup, args.iters, channels_last
                        )
                    )
            ips, plain = max(rates[True]), max(rates[False])
            achieved = ips * 3 * fwd_gflops
            timings.append(
                {
                    "model": name,
                    "input": [ch, size, size],
                    "batch": batch,
                    "train_images_per_s": round(ips, 1),
                    "achieved_gflop_per_s": round(achieved, 2),
                    "fraction_of_gemm": round(achieved / gemm, 3),
                    "train_images_per_s_plain_layout": round(plain, 1),
                    "channels_last_speedup": round(ips / plain, 2),
                }
            )
    result = {
        "machine": {
            "processor": platform.processor(),
            "threads": args.threads,
            "cores": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_average_1min": round(os.getloadavg()[0], 2),
        },
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
