"""Side by side with InsightFace's ``arcface_torch`` Partial FC (``PartialFC_V2``): step time and
peak memory, same batches, same process layout, float32 and mixed precision.

The two reference files are read from a local copy of ``deepinsight/insightface`` given by
``--insightface``: the repository root (``recognition/arcface_torch/``) or a directory that
holds ``partial_fc_v2.py`` and ``losses.py``. They are imported as they are, never copied into
this repository. Both layers run in a ``torch.distributed`` gloo group (one process, or
``--world 2`` ranks on one machine) on the same random embeddings and labels (d = 512), with
SGD (momentum 0.9, weight decay 5e-4) as ``arcface_torch`` trains: V2 under
``torch.optim.SGD`` on its ``nn.Parameter``, ours under :class:`RowSparseSGD`. Margin: ArcFace
m = 0.5, s = 64 on both (``CombinedMarginLoss(64, 1, 0.5, 0)``).

Precision modes, matched:

* ``float32``: V2 ``fp16=False``; ours ``compute_dtype="float32"``.
* ``mixed``: V2 ``fp16=True`` (its logits GEMM under ``torch.cuda.amp.autocast``, then
  ``.float()``) against ours ``compute_dtype="float16"`` on a GPU; on a CPU V2's autocast
  region becomes ``torch.autocast("cpu", bfloat16)`` (fp16 GEMMs are slow on CPUs) against
  ours ``compute_dtype="bfloat16"`` (the report records which GEMM path ran: the native bf16
  GEMM where the CPU has bf16 units, else the float32 GEMM of rounded operands).

V2 calls ``.cuda()`` on its sampling tensors; on a CPU-only run ``torch.Tensor.cuda`` is
replaced by the identity while V2 runs (its only change). Every configuration runs in a fresh
subprocess: memory is ``peak RSS - RSS before the layer was built`` (CPU) or
``torch.cuda.max_memory_allocated`` (GPU).

    python benchmarks/bench_vs_arcface_torch.py --insightface /path/to/insightface \\
        --classes 100000 --out benchmarks/results/vs_arcface_torch_cpu.json
    python benchmarks/bench_vs_arcface_torch.py --insightface DIR --device cuda \\
        --classes 1000000 10000000 --batch 512 --out benchmarks/results/vs_arcface_torch_gpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

DIM = 512
FILES = ("partial_fc_v2.py", "losses.py")


def find_reference_files(root: Path) -> Path:
    """The directory holding ``partial_fc_v2.py`` and ``losses.py`` under ``root``."""
    for candidate in (root, root / "recognition" / "arcface_torch"):
        if all((candidate / name).is_file() for name in FILES):
            return candidate
    raise SystemExit(
        f"--insightface {root}: neither it nor recognition/arcface_torch/ under it holds "
        f"{' and '.join(FILES)}"
    )


def _load(directory: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"arcface_torch_{name}", directory / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _build(cfg: dict, rank: int):
    """(layer, optimizer, autocast context factory, description) for ``cfg``."""
    import contextlib

    import torch

    device, mixed = cfg["device"], cfg["precision"] == "mixed"
    if cfg["layer"] == "arcface_torch_v2":
        directory = Path(cfg["reference_dir"])
        losses = _load(directory, "losses.py")
        v2 = _load(directory, "partial_fc_v2.py")
        margin = losses.CombinedMarginLoss(64.0, 1.0, 0.5, 0.0)
        layer = v2.PartialFC_V2(margin, DIM, cfg["num_classes"], cfg["rate"], fp16=mixed)
        layer = layer.to(device)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        if mixed and device == "cpu":  # V2's own autocast region, as bfloat16 on the CPU
            torch.cuda.amp.autocast = lambda enabled=True, **_: torch.autocast(
                "cpu", dtype=torch.bfloat16, enabled=enabled
            )
            return layer, opt, contextlib.nullcontext, "fp16=True (its autocast: CPU bfloat16)"
        return layer, opt, contextlib.nullcontext, "fp16=True" if mixed else "fp32"
    from partialfc.classifier import PartialFC, RowSparseSGD
    from partialfc.losses.margins import ArcFaceMargin

    compute = "float32" if not mixed else ("float16" if device == "cuda" else "bfloat16")
    layer = PartialFC(cfg["num_classes"], DIM, ArcFaceMargin(0.5, 64.0), sample_rate=cfg["rate"],
                      compute_dtype=compute, device=device, seed=0)  # fmt: skip
    opt = RowSparseSGD(layer, lr=0.1, momentum=0.9, weight_decay=5e-4)
    return layer, opt, contextlib.nullcontext, f"compute_dtype={layer.precision.describe()}"


def _rank_body(rank: int, world: int, cfg: dict, init_file: str, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=1800))  # fmt: skip
    device = cfg["device"]
    if device == "cpu" and cfg["layer"] == "arcface_torch_v2":
        torch.Tensor.cuda = lambda self, *a, **k: self  # V2's sampling calls .cuda()
    local_batch = cfg["batch"] // world
    batches = []
    for step in range(cfg["steps"] + 1):  # the same batches for both layers
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(local_batch, DIM, generator=gen)
        y = torch.randint(0, cfg["num_classes"], (local_batch,), generator=gen)
        batches.append((x.to(device), y.to(device)))
    base_rss = _rss_bytes()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    layer, opt, autocast, mode = _build(cfg, rank)
    times, cpu_times, losses = [], [], []
    for step, (x, y) in enumerate(batches):
        x = x.clone().requires_grad_(True)
        dist.barrier()
        if device == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        with autocast():
            loss = layer(x, y.clone())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        if step > 0:  # step 0 warms up
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        losses.append(float(loss.detach()))
    result = dict(
        rank=rank,
        mode=mode,
        step_s=sorted(times)[len(times) // 2],
        step_min_s=min(times),
        step_cpu_s=min(cpu_times),
        first_loss=losses[0],
        layer_peak_bytes=_peak_rss_bytes() - base_rss,
    )
    if device == "cuda":
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated() - base_cuda
    dist.destroy_process_group()
    queue.put(result)


def _worker(cfg: dict) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rdv")
        if cfg["world"] == 1:
            import queue as q

            box = q.Queue()
            _rank_body(0, 1, cfg, init, box)
            return box.get()
        ctx = mp.get_context("spawn")
        box = ctx.Queue()
        procs = [ctx.Process(target=_rank_body, args=(r, cfg["world"], cfg, init, box))
                 for r in range(cfg["world"])]  # fmt: skip
        for p in procs:
            p.start()
        results = sorted((box.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join()
    first = dict(results[0])
    for key in ("step_s", "step_min_s", "step_cpu_s", "layer_peak_bytes", "device_peak_bytes"):
        if key in first:
            first[key] = max(r[key] for r in results)
    return first


def _machine(device: str, threads: int) -> dict:
    import torch

    from partialfc.losses.gemm_precision import cpu_has_native_bfloat16

    facts = dict(
        platform=platform.platform(),
        cpus=os.cpu_count(),
        threads=threads,
        torch=torch.__version__,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_native_bfloat16=cpu_has_native_bfloat16(),
        load_average_at_end=[round(v, 2) for v in os.getloadavg()],
    )
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name()
    return facts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--insightface", type=Path, help="local deepinsight/insightface copy")
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=256, help="global batch")
    parser.add_argument("--world", type=int, default=1, help="gloo ranks (1 or 2)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", nargs="+", default=["float32", "mixed"],
                        choices=("float32", "mixed"))  # fmt: skip
    parser.add_argument("--layers", nargs="+", default=["partialfc", "arcface_torch_v2"],
                        choices=("partialfc", "arcface_torch_v2"))  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(_worker(json.loads(args.worker))))
        return 0
    if args.insightface is None:
        parser.error("--insightface DIR is required (a local deepinsight/insightface copy)")
    reference_dir = find_reference_files(args.insightface.resolve())
    records = []
    for num_classes in args.classes:
        for precision in args.precision:
            for layer in args.layers:
                cfg = dict(layer=layer, num_classes=num_classes, rate=args.rate,
                           batch=args.batch, world=args.world, steps=args.steps,
                           threads=args.threads, device=args.device, precision=precision,
                           reference_dir=str(reference_dir))  # fmt: skip
                t0 = time.time()
                proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cfg)],
                                      capture_output=True, text=True, check=False)  # fmt: skip
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                rec = {k: v for k, v in cfg.items() if k != "reference_dir"}
                if proc.returncode != 0 or not lines:
                    rec["error"] = proc.stderr.strip().splitlines()[-3:] or ["no output"]
                else:
                    res = json.loads(lines[-1][len("RESULT ") :])
                    rec.update(
                        mode=res["mode"],
                        step_ms=round(res["step_s"] * 1e3, 1),
                        step_min_ms=round(res["step_min_s"] * 1e3, 1),
                        step_cpu_ms=round(res["step_cpu_s"] * 1e3, 1),
                        layer_peak_gb=round(res["layer_peak_bytes"] / 1e9, 3),
                        first_loss=round(res["first_loss"], 4),
                    )
                    if "device_peak_bytes" in res:
                        rec["device_peak_gb"] = round(res["device_peak_bytes"] / 1e9, 3)
                rec["wall_s"] = round(time.time() - t0, 1)
                records.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    ratios = []
    for num_classes in args.classes:
        for precision in args.precision:
            pair = {r["layer"]: r for r in records
                    if r["num_classes"] == num_classes and r["precision"] == precision
                    and "error" not in r}  # fmt: skip
            if len(pair) == 2:
                ours, ref = pair["partialfc"], pair["arcface_torch_v2"]
                mem = "device_peak_gb" if args.device == "cuda" else "layer_peak_gb"
                # CPU: process CPU time (a shared machine stretches wall time, not CPU time)
                key = "step_min_ms" if args.device == "cuda" else "step_cpu_ms"
                ratios.append(
                    dict(
                        num_classes=num_classes,
                        precision=precision,
                        speedup_vs_v2=round(ref[key] / ours[key], 2),
                        speedup_basis=key,
                        memory_vs_v2=round(ours[mem] / max(ref[mem], 1e-9), 3),
                    )
                )
    report = dict(
        benchmark="partial_fc_vs_arcface_torch_v2",
        reference=dict(
            files={
                name: hashlib.sha256((reference_dir / name).read_bytes()).hexdigest()
                for name in FILES
            },  # fmt: skip
        ),
        setup=dict(
            embedding_dim=DIM,
            batch=args.batch,
            sample_rate=args.rate,
            world=args.world,
            optimizer="SGD momentum 0.9, weight decay 5e-4, lr 0.1",
            margin="ArcFace m=0.5, s=64",
            device=args.device,
        ),  # fmt: skip
        machine=_machine(args.device, args.threads),
        notes=(
            "step = forward + backward + optimizer step, median and best wall time of the "
            "timed steps after one warm-up, and the best process CPU time (step_cpu_ms: on a "
            "shared CPU machine wall time stretches with the load, CPU time much less; "
            "with 1 thread it is the cost of the step); speedup_vs_v2 = V2 / ours on "
            "speedup_basis; memory = peak RSS growth while the "
            "layer is built and stepped (CPU) or peak allocated device memory (GPU); mixed = "
            "V2 fp16=True (GPU) or bfloat16 autocast (CPU) against our compute_dtype float16 "
            "(GPU) or bfloat16 (CPU)"
        ),
        results=records,
        ratios=ratios,
    )
    text = json.dumps(report, indent=1)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(args.out, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
