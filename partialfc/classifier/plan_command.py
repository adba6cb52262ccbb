"""``partialfc plan``: per-rank memory and bytes per step of a Partial FC run, before it runs.

The numbers come from :func:`partialfc.classifier.plan.plan_run`; this module only reads the
arguments and prints the plan as a table or as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from partialfc.classifier.plan import (
    DTYPE_BYTES,
    GIB,
    METHODS,
    OPTIMIZERS,
    PHASES,
    STORAGE_DTYPES,
    RunPlan,
    RunSpec,
    plan_run,
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "--classes", type=int, required=True, help="number of classes C (all ranks)"
    )
    parser.add_argument("--ranks", type=int, default=8, help="ranks (GPUs) N")
    parser.add_argument("--batch", type=int, default=128, help="batch per rank b (global: N b)")
    parser.add_argument("--dim", type=int, default=512, help="embedding dimension d")
    parser.add_argument("--sample-rate", type=float, default=0.1, help="Partial FC sample rate r")
    parser.add_argument("--subcenters", type=int, default=1, help="sub-centers per class K")
    parser.add_argument(
        "--storage-dtype", choices=STORAGE_DTYPES, default="float32", help="dtype of the centers"
    )
    parser.add_argument(
        "--state-dtype",
        choices=STORAGE_DTYPES,
        default=None,
        help="dtype of the optimizer state (default: the storage dtype)",
    )
    parser.add_argument(
        "--compute-dtype", choices=tuple(DTYPE_BYTES), default="float32", help="GEMM operands"
    )
    parser.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="sgd", help="row-sparse optimizer"
    )
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0: no state)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="compute device")
    parser.add_argument(
        "--storage",
        choices=("device", "host"),
        default="device",
        help="where centers and optimizer state live (host: pinned memory next to the GPU)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="partialfc",
        help="partialfc: this layer (row-sparse); dense: update='dense' with torch SGD; "
        "model-parallel: the full softmax of the Partial FC paper's memory analysis",
    )
    parser.add_argument(
        "--gemm-path",
        choices=("auto", "native", "emulated"),
        default="auto",
        help="low-precision GEMM path (auto: native on CUDA, emulated on a CPU)",
    )
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="the layer's chunk_rows: active rows a step walks at a time (default: the "
        "layer's default for --device, 2^20 on cuda, 2048 on cpu); smaller chunks launch more "
        "ops per step and keep less scratch (about 5 x chunk x d x 4 bytes)",
    )
    parser.add_argument(
        "--device-memory-gib", type=float, default=80.0, help="memory of one device, GiB"
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=0.0,
        help="device memory kept for the backbone, activations, CUDA context and NCCL, GiB",
    )
    parser.add_argument(
        "--ranks-per-node", type=int, default=8, help="ranks per node (host memory per node)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    return RunSpec(
        num_classes=args.classes,
        ranks=args.ranks,
        batch_per_rank=args.batch,
        embedding_dim=args.dim,
        sample_rate=args.sample_rate,
        num_subcenters=args.subcenters,
        storage_dtype=args.storage_dtype,
        state_dtype=args.state_dtype,
        compute_dtype=args.compute_dtype,
        optimizer=args.optimizer,
        momentum=args.momentum,
        device=args.device,
        storage=args.storage,
        method=args.method,
        gemm_path=args.gemm_path,
        chunk_rows=args.chunk_rows,
    )


# RunSpec field -> the option that sets it, so that an error names what the user typed
_OPTIONS = {
    "num_classes": "--classes",
    "ranks": "--ranks",
    "batch_per_rank": "--batch",
    "embedding_dim": "--dim",
    "sample_rate": "--sample-rate",
    "num_subcenters": "--subcenters",
    "momentum": "--momentum",
    "compute_dtype": "--compute-dtype",
    "method": "--method",
    "chunk_rows": "--chunk-rows",
}


def _as_options(problem: str) -> str:
    for field_name, option in _OPTIONS.items():
        if problem.startswith(field_name + " ") or problem.startswith(field_name + "="):
            return option + problem[len(field_name) :]
    return problem


def _argument_error(args: argparse.Namespace) -> str | None:
    for name in ("device_memory_gib", "reserve_gib"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            return f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}"
    if args.ranks_per_node < 1:
        return f"--ranks-per-node must be >= 1, got {args.ranks_per_node}"
    return None


def _gib(value: int) -> str:
    return f"{value / GIB:.3f}"


def format_plan(plan: RunPlan, device_memory_gib: float, reserve_gib: float, per_node: int) -> str:
    """The plan as text tables (GiB, MiB)."""
    s = plan.spec
    lines = [
        f"{s.method}: C = {s.num_classes:,} on {s.ranks} ranks ({plan.classes_per_rank:,} classes "
        f"on rank 0), b = {s.batch_per_rank} per rank (B = {s.global_batch:,}), d = "
        f"{s.embedding_dim}, r = {s.sample_rate}, K = {s.num_subcenters}",
        f"storage {s.storage_dtype} on the {s.storage}, state {s.state_dtype or s.storage_dtype}, "
        f"compute {s.compute_dtype} ({s.path}), {s.optimizer}"
        + (f" momentum {s.momentum}" if s.optimizer == "sgd" else "")
        + f", device {s.device}, chunk_rows {s.chunk:,}",
        f"active rows per rank and step: {plan.active_rows:,}; centers + optimizer state "
        f"{_gib(plan.state_bytes())} GiB per rank",
        "",
        f"{'allocation (rank 0)':58s} {'category':16s} {'where':6s} {'GiB':>9s}  phases",
    ]
    for item in sorted(plan.items, key=lambda i: (i.where, -i.bytes)):
        phases = ",".join(p for p in PHASES if p in item.phases)
        lines.append(
            f"{item.name[:58]:58s} {item.category:16s} {item.where:6s} {_gib(item.bytes):>9s}  "
            f"{phases}"
        )
    lines += ["", f"{'peak per phase, GiB':20s}" + "".join(f"{p:>11s}" for p in PHASES)]
    for where, phases in sorted(plan.peaks.items()):
        lines.append(f"{where:20s}" + "".join(f"{_gib(phases[p]):>11s}" for p in PHASES))
    if plan.messages:
        lines += ["", f"{'collective per step':42s} {'op':14s} {'MiB':>9s} {'MiB on link':>12s}"]
        for m in plan.messages:
            mib, wire_mib = m.bytes / 2**20, m.wire_bytes / 2**20
            lines.append(f"{m.name[:42]:42s} {m.op:14s} {mib:>9.3f} {wire_mib:>12.3f}")
        wire = sum(m.wire_bytes for m in plan.messages)
        lines.append(f"{'total':42s} {'':14s} {'':>9s} {wire / 2**20:>12.3f}")
    if plan.bus_bytes_per_step:
        lines.append(f"host <-> device per step: {plan.bus_bytes_per_step / 2**20:.1f} MiB")
    lines.append(f"GEMM work per step and rank: {plan.gemm_flops_per_step / 1e9:.1f} GFLOP")
    device = plan.peak("device")
    need = device / GIB + reserve_gib
    verdict = "fits" if need <= device_memory_gib else "does NOT fit"
    lines += [
        "",
        f"device peak {_gib(device)} GiB + reserve {reserve_gib:g} GiB = {need:.3f} GiB: "
        f"{verdict} in {device_memory_gib:g} GiB",
    ]
    if "host" in plan.peaks:
        host = plan.peak("host")
        lines.append(
            f"host peak {_gib(host)} GiB per rank, {_gib(host * per_node)} GiB per node of "
            f"{per_node} ranks"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    problem = _argument_error(args)
    spec = spec_from_args(args)
    problem = problem or spec.error()
    if problem:
        problem = _as_options(problem)
        print(f"partialfc plan: {problem}", file=sys.stderr)
        return 2
    plan = plan_run(spec)
    device_bytes = int(args.device_memory_gib * GIB)
    reserve = int(args.reserve_gib * GIB)
    if args.json:
        out = plan.to_dict()
        out["device_memory_bytes"] = device_bytes
        out["reserve_bytes"] = reserve
        out["fits"] = plan.fits(device_bytes, reserve)
        out["host_peak_bytes_per_node"] = plan.peak("host") * args.ranks_per_node
        print(json.dumps(out, indent=1))
    else:
        print(format_plan(plan, args.device_memory_gib, args.reserve_gib, args.ranks_per_node))
    return 0
