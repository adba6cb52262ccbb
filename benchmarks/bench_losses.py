"""Loss-family speed: the ArcFace head against its bare cosine GEMMs, and the triplet miners.

Head (default B = 512, d = 512, C = 100,000, float32): one training step of
``MarginSoftmaxHead(C, d, ArcFaceMargin(0.5, 64))`` — forward and backward — against the limit,
the three GEMMs any such head must run:

    forward   cos    = x_hat @ W^T          (B x d) x (d x C)
    backward  grad_x = G @ W                (B x C) x (C x d)
              grad_W = G^T @ x_hat          (C x B) x (B x d)

each writing a fresh output as a training step does. Also timed: the unfused composition
(``F.normalize``, matmul, ``margin(cos, y)``, ``F.cross_entropy``) for comparison. Rounds are
interleaved (limit, fused head, unfused) and the medians are compared.

Triplet (default B = 1,800 = 180 identities x 10, d = 128): forward + backward of
``TripletLoss`` with each mining mode; peak resident memory is reported as a check that nothing
B x B x B is built.

``fused_vs_unfused`` records how far the fused head's gradients are from the composition's.
Prints one JSON object; ``--out`` also writes it (atomically). ``--device cuda`` runs the same
on a GPU (timings synchronised).

    python benchmarks/bench_losses.py [--batch 512] [--dim 512] [--classes 100000]
        [--triplet-batch 1800] [--repeats 5] [--threads N] [--out bench_losses.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from partialfc.atomic import atomic_write_bytes
from partialfc.losses.heads import MarginSoftmaxHead
from partialfc.losses.margins import ArcFaceMargin
from partialfc.losses.triplet import TripletLoss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _max_relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def bench_head(batch: int, dim: int, classes: int, repeats: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    margin = ArcFaceMargin(0.5, 64.0)
    head = MarginSoftmaxHead(classes, dim, margin).to(device)
    x = torch.randn(batch, dim, device=device, requires_grad=True)
    labels = torch.randint(0, classes, (batch,), device=device)
    weight = head.weight.detach()
    x_hat = F.normalize(x.detach(), dim=1)
    grad_logits = torch.randn(batch, classes, device=device)

    def limit():
        x_hat @ weight.T
        grad_logits @ weight
        grad_logits.T @ x_hat

    def fused():
        head.weight.grad = None
        x.grad = None
        head(x, labels).backward()

    def unfused():
        head.weight.grad = None
        x.grad = None
        cos = F.normalize(x, dim=1) @ F.normalize(head.weight, dim=1).T
        F.cross_entropy(margin(cos, labels), labels).backward()

    # agreement of the fused head with the plain composition (values and gradients)
    fused()
    fused_grads = (x.grad.clone(), head.weight.grad.clone())
    unfused()
    agreement = {
        "grad_embeddings_max_rel_diff": _max_relative_difference(fused_grads[0], x.grad),
        "grad_centers_max_rel_diff": _max_relative_difference(fused_grads[1], head.weight.grad),
    }
    runs = {"limit": limit, "fused": fused, "unfused": unfused}
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(_seconds(fn, device))
    median = {name: statistics.median(values) for name, values in times.items()}
    flops = 3 * 2 * batch * dim * classes
    return {
        "batch": batch,
        "embedding_dim": dim,
        "num_classes": classes,
        "dtype": "float32",
        "limit_gemm_s": median["limit"],
        "limit_gemm_gflops": flops / median["limit"] / 1e9,
        "fused_head_s": median["fused"],
        "unfused_head_s": median["unfused"],
        "fused_over_limit": median["fused"] / median["limit"],
        "unfused_over_limit": median["unfused"] / median["limit"],
        "best_fused_over_best_limit": min(times["fused"]) / min(times["limit"]),
        "target_fused_over_limit": 1.3,
        "fused_vs_unfused": agreement,
        "all_seconds": times,
    }


def bench_triplet(
    batch: int, per_identity: int, dim: int, repeats: int, device: torch.device
) -> dict:
    torch.manual_seed(0)
    labels = torch.arange(batch // per_identity, device=device).repeat_interleave(per_identity)
    x = torch.randn(len(labels), dim, device=device, requires_grad=True)
    results = {}
    for mining in ("semihard", "batch_hard", "all"):
        loss_fn = TripletLoss(0.2, mining)

        def step(loss_fn=loss_fn):
            x.grad = None
            loss_fn(x, labels).backward()

        step()
        seconds = [_seconds(step, device) for _ in range(repeats)]
        stats = loss_fn.last_stats
        results[mining] = {
            "forward_backward_s": statistics.median(seconds),
            "num_triplets": stats.num_triplets,
            "active_fraction": stats.active_fraction,
        }
    return {
        "batch": len(labels),
        "identities": batch // per_identity,
        "per_identity": per_identity,
        "embedding_dim": dim,
        "mining": results,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_device_mib": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
        "bxbxb_bool_mask_would_be_mib": len(labels) ** 3 / 2**20,
    }


def write_atomically(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--triplet-batch", type=int, default=1800)
    parser.add_argument("--triplet-per-identity", type=int, default=10)
    parser.add_argument("--triplet-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load_before = os.getloadavg()
    report = {
        "benchmark": "losses",
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "load_average_before": load_before,
        "head": bench_head(args.batch, args.dim, args.classes, args.repeats, device),
        "triplet": bench_triplet(
            args.triplet_batch, args.triplet_per_identity, args.triplet_dim, args.repeats, device
        ),
        "load_average_after": os.getloadavg(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        write_atomically(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
