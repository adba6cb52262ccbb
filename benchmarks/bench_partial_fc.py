"""Partial FC layer benchmark: step time (forward + backward + optimizer) and peak memory.

Each configuration runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``)
belongs to it alone. The layer's memory is ``peak RSS - RSS before the layer was built`` (after
a one-step warm-up on a tiny layer, so library start-up buffers are not counted); the
reference is the persistent state (centers + optimizer state). The speed limit is the bare
float32 GEMM time of the active rows (three GEMMs: logits, embedding grad, center grad) with
the same thread count; ``ratio_to_gemm = step_s / gemm_s``. With ``compute_dtype`` bfloat16
or float16 the limit is the three GEMMs in that precision on the path the layer takes: the
native low-precision GEMM where the hardware has one, else the float32 GEMM of rounded operands
(the fastest bfloat16 arithmetic on a CPU without bfloat16 units). The report states the
measured float32 and native bfloat16 GEMM rates of the machine and its CPU capability.

A row-sparse update must also gather the active rows of the centers and of their optimizer
state and scatter them back: ``row_traffic_ms`` is the bare time of that memory traffic
(``index_select`` + ``index_copy_`` once per table), and ``limit_ms = gemm_limit_ms +
row_traffic_ms`` is the floor of a step built from separate GEMM and gather/scatter kernels
(``cpu_ratio_to_limit = step_cpu_ms / limit_ms``).

    python benchmarks/bench_partial_fc.py --out benchmarks/results/partial_fc.json
    python benchmarks/bench_partial_fc.py --preset quick          # seconds, smoke check
    python benchmarks/bench_partial_fc.py --preset ten-million    # one 10^7-class run (~21 GB)
    python benchmarks/bench_partial_fc.py --preset mixed --threads 1   # compute_dtype rows

Output: JSON with the machine facts and one record per configuration.
"""

from __future__ import annotations

import argparse
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

PRESETS = {
    "quick": [
        dict(num_classes=10_000, batch=128, rate=0.1, world=1, update="sparse", steps=3),
        dict(num_classes=10_000, batch=128, rate=0.1, world=2, update="sparse", steps=3),
    ],
    "default": [
        *[
            dict(num_classes=c, batch=256, rate=r, world=1, update=u, steps=s)
            for c, s in ((10_000, 10), (100_000, 4), (1_000_000, 2))
            for r in (0.1, 0.3, 1.0)
            for u in ("sparse", "dense")
        ],
        dict(num_classes=1_000_000, batch=128, rate=0.1, world=1, update="sparse", steps=3),
        dict(num_classes=1_000_000, batch=512, rate=0.1, world=1, update="sparse", steps=3),
        dict(
            num_classes=1_000_000,
            batch=256,
            rate=0.1,
            world=1,
            update="sparse",
            steps=4,
            storage_dtype="bfloat16",
        ),  # fmt: skip
        dict(num_classes=100_000, batch=256, rate=0.1, world=2, update="sparse", steps=6),
        dict(num_classes=1_000_000, batch=256, rate=0.1, world=2, update="sparse", steps=4),
        dict(num_classes=100_000, batch=256, rate=0.1, world=4, update="sparse", steps=4),
    ],
    "cuda": [
        *[
            dict(
                num_classes=1_000_000,
                batch=512,
                rate=0.1,
                world=1,
                update=u,
                steps=5,
                device="cuda",
            )  # fmt: skip
            for u in ("sparse", "dense")
        ],
        dict(
            num_classes=10_000_000,
            batch=512,
            rate=0.1,
            world=1,
            update="sparse",
            steps=5,
            device="cuda",
            storage_device="cpu",
            storage_dtype="bfloat16",
        ),  # fmt: skip
    ],
    "mixed": [
        *[
            dict(
                num_classes=c,
                batch=256,
                rate=0.1,
                world=1,
                update="sparse",
                steps=s,
                compute_dtype=dt,
            )  # fmt: skip
            for c, s in ((100_000, 4), (1_000_000, 2))
            for dt in ("float32", "bfloat16")
        ],
        dict(
            num_classes=1_000_000,
            batch=256,
            rate=0.1,
            world=1,
            update="sparse",
            steps=2,
            compute_dtype="bfloat16",
            storage_dtype="bfloat16",
        ),  # fmt: skip
        # torch's native bfloat16 GEMM, at a size where its rate on the machine shows
        *[
            dict(
                num_classes=10_000,
                batch=256,
                rate=0.1,
                world=1,
                update="sparse",
                steps=2,
                compute_dtype=dt,
                gemm_path=path,
            )  # fmt: skip
            for dt, path in (("float32", "auto"), ("bfloat16", "emulated"), ("bfloat16", "native"))
        ],
    ],
    "cuda-mixed": [
        dict(
            num_classes=c,
            batch=512,
            rate=0.1,
            world=1,
            update="sparse",
            steps=5,
            device="cuda",
            compute_dtype=dt,
        )  # fmt: skip
        for c in (1_000_000, 10_000_000)
        for dt in ("float32", "bfloat16", "float16")
    ],
    "ten-million": [
        dict(
            num_classes=10_000_000,
            batch=128,
            rate=0.1,
            world=1,
            update="sparse",
            steps=3,
            storage_dtype="bfloat16",  # bf16 centers + bf16 momentum: 2048 B/class, 20.5 GB
        ),  # fmt: skip
    ],
}
DIM = 512


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _clock(device: str):
    """CPU time of this process on a CPU (a shared machine stretches wall time, not CPU time;
    with one thread it is the cost of the work), wall time on an accelerator."""
    return time.process_time if device == "cpu" else time.perf_counter


def _best_seconds(work, repeats: int, device: str) -> float:
    """Best time of ``repeats + 1`` calls of ``work()`` in :func:`_clock`'s time (the extra
    call covers the first touch of output pages, which the minimum then leaves out)."""
    best, clock = float("inf"), _clock(device)
    for _ in range(repeats + 1):
        _sync(device)
        t0 = clock()
        work()
        _sync(device)
        best = min(best, clock() - t0)
    return best


def _gemm_seconds(
    batch: int, active_rows: int, repeats: int = 3, device: str = "cpu", precision=None
) -> float:
    """Bare time of the three GEMMs of one step over ``active_rows`` centers: float32, or the
    operands of ``precision`` on its path (a native low-precision GEMM, or float32)."""
    import torch

    native = precision is not None and precision.path == "native"
    dtype = precision.dtype if native else torch.float32
    x = torch.randn(batch, DIM, device=device, dtype=dtype)
    w = torch.randn(active_rows, DIM, device=device, dtype=dtype)
    g = torch.randn(batch, active_rows, device=device, dtype=dtype)

    def three_gemms():
        if native:
            precision.mm(x, w.t(), rounded=True)
            precision.mm(g, w, rounded=True)
            precision.mm(g.t(), x, rounded=True)
        else:
            torch.mm(x, w.t())
            torch.mm(g, w)
            torch.mm(g.t(), x)

    return _best_seconds(three_gemms, repeats, device)


def _row_traffic_seconds(tables, active_rows: int, repeats: int = 3, device: str = "cpu") -> float:
    """Bare time of the row traffic any row-sparse update of one step must do: gather the
    active rows of each persistent table (centers, then every optimizer-state table) once and
    scatter them back once, with torch's ``index_select`` / ``index_copy_`` on the real tables
    and a random sorted set of ``active_rows`` rows (the values written are the values read)."""
    import torch

    num_rows = tables[0].shape[0]
    gen = torch.Generator().manual_seed(0)
    rows = torch.randperm(num_rows, generator=gen)[:active_rows].sort().values.to(tables[0].device)
    buffers = [t.new_empty(active_rows, t.shape[1]) for t in tables]

    def gather_and_scatter():
        for table, buf in zip(tables, buffers, strict=True):
            torch.index_select(table, 0, rows, out=buf)
            table.index_copy_(0, rows, buf)

    return _best_seconds(gather_and_scatter, repeats, device)


def gemm_rates(threads: int) -> dict:
    """Measured GEMM rates of this machine (GFLOP/s of process CPU time, best of 3): float32 at
    1024^3 and torch's native bfloat16 at 256^3 (smaller: it can be a slow fallback), plus the
    CPU capability."""
    import torch

    from partialfc.losses.gemm_precision import cpu_has_native_bfloat16

    torch.set_num_threads(threads)
    rates = {}
    for dtype, n in ((torch.float32, 1024), (torch.bfloat16, 256)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            torch.mm(a, b)
            best = min(best, time.process_time() - t0)
        rates[f"{str(dtype).removeprefix('torch.')}_{n}"] = round(2 * n**3 / best / 1e9, 2)
    return dict(
        gemm_gflops=rates,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_native_bfloat16=cpu_has_native_bfloat16(),
        threads=threads,
    )


def _warm_up_libraries(device: str, world: int) -> None:
    """One step of a 64-class layer, so that the first use of the BLAS / OpenMP / collective
    libraries (their own buffers, ~0.1 GB) is not counted as the measured layer's memory."""
    import torch

    from partialfc.classifier import PartialFC, RowSparseSGD
    from partialfc.losses.margins import ArcFaceMargin

    tiny = PartialFC(max(64, world), DIM, ArcFaceMargin(), sample_rate=0.5, device=device)
    opt = RowSparseSGD(tiny, lr=0.1)
    x = torch.randn(8, DIM, device=device, requires_grad=True)
    tiny(x, torch.arange(8, device=device) % max(64, world)).backward()
    opt.step()


def _rank_body(rank: int, world: int, cfg: dict, init_file: str | None, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg["threads"])
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=600))  # fmt: skip
    from partialfc.classifier import PartialFC, RowSparseSGD
    from partialfc.losses.margins import ArcFaceMargin

    dtype = getattr(torch, cfg.get("storage_dtype", "float32"))
    device = cfg.get("device", "cpu")
    local_batch = cfg["batch"] // world + (1 if rank < cfg["batch"] % world else 0)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(local_batch, DIM, generator=gen).to(device).requires_grad_(True)
    y = torch.randint(0, cfg["num_classes"], (local_batch,), generator=gen).to(device)
    _warm_up_libraries(device, world)
    base_rss = _rss_bytes()
    pfc = PartialFC(cfg["num_classes"], DIM, ArcFaceMargin(), sample_rate=cfg["rate"],
                    update=cfg["update"], storage_dtype=dtype, seed=0, device=device,
                    storage_device=cfg.get("storage_device"),
                    compute_dtype=cfg.get("compute_dtype", "float32"),
                    gemm_path=cfg.get("gemm_path", "auto"))  # fmt: skip
    if cfg["update"] == "sparse":
        opt = RowSparseSGD(pfc, lr=0.1, momentum=cfg.get("momentum", 0.9), weight_decay=5e-4)
        state_bytes = pfc.centers.nbytes() + sum(t.nbytes() for t in opt.tables.values())
    else:
        opt = torch.optim.SGD(pfc.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        state_bytes = 2 * pfc.weight.numel() * 4  # weights + momentum (the dense grad is extra)
    built_rss = _rss_bytes()
    times, cpu_times = [], []
    for step in range(cfg["steps"] + 1):
        if world > 1:
            dist.barrier()
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = pfc(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        x.grad = None
        _sync(device)
        if world > 1:
            dist.barrier()
        if step > 0:  # step 0 warms up (first touch of buffers, lazy optimizer state)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    active = pfc.budget * pfc.num_subcenters
    result = dict(
        rank=rank,
        step_s=sorted(times)[len(times) // 2],
        step_min_s=min(times),
        step_cpu_s=min(cpu_times),
        loss=float(loss.detach()),
        active_rows_per_rank=active,
        state_bytes=state_bytes,
        layer_peak_bytes=_peak_rss_bytes() - base_rss,
        build_bytes=built_rss - base_rss,
        peak_rss_bytes=_peak_rss_bytes(),
        gemm_path=pfc.precision.describe(),
    )
    precision = pfc.precision
    if cfg["update"] == "sparse" and rank == 0:  # before the GEMM operands take the room
        tables = [pfc.centers.data, *(t.data for t in opt.tables.values())]
        result["rows_s"] = _row_traffic_seconds(tables, active, device=device)
    if device.startswith("cuda"):
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated()
    del pfc, opt, loss  # the GEMM limit below needs room for full-size float32 operands
    if rank == 0:
        result["gemm_s"] = _gemm_seconds(cfg["batch"], active, device=device, precision=precision)
    if world > 1:
        dist.destroy_process_group()
    queue.put(result) if queue is not None else print(json.dumps(result))


def _worker(cfg: dict) -> dict:
    world = cfg["world"]
    if world == 1:
        import queue as q

        box = q.Queue()
        _rank_body(0, 1, cfg, None, box)
        return box.get()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    box = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rdv")
        procs = [ctx.Process(target=_rank_body, args=(r, world, cfg, init, box))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        results = sorted((box.get(timeout=1800) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join()
    first = dict(results[0])
    first["step_s"] = max(r["step_s"] for r in results)
    first["step_min_s"] = max(r["step_min_s"] for r in results)
    first["layer_peak_bytes"] = max(r["layer_peak_bytes"] for r in results)
    first["state_bytes"] = max(r["state_bytes"] for r in results)
    return first


def _summarise(cfg: dict, res: dict) -> dict:
    out = dict(cfg)
    out.update(
        step_ms=round(res["step_s"] * 1e3, 2),
        step_min_ms=round(res.get("step_min_s", res["step_s"]) * 1e3, 2),
        gemm_limit_ms=round(res["gemm_s"] * 1e3, 2),
        ratio_to_gemm=round(res["step_s"] / res["gemm_s"], 2),
        step_cpu_ms=round(res["step_cpu_s"] * 1e3, 2),
        cpu_ratio_to_gemm=round(res["step_cpu_s"] / res["gemm_s"], 2),
        active_rows_per_rank=res["active_rows_per_rank"],
        state_gb=round(res["state_bytes"] / 1e9, 3),
        layer_peak_gb=round(res["layer_peak_bytes"] / 1e9, 3),
        peak_over_state=round(res["layer_peak_bytes"] / res["state_bytes"], 3),
        process_peak_rss_gb=round(res["peak_rss_bytes"] / 1e9, 3),
        state_bytes_per_class=round(res["state_bytes"] * cfg["world"] / cfg["num_classes"], 1),
        loss=round(res["loss"], 4),
        gemm_path=res["gemm_path"],
    )
    if "rows_s" in res:  # sparse update: the GEMMs plus the row traffic they cannot avoid
        limit = res["gemm_s"] + res["rows_s"]
        out.update(
            row_traffic_ms=round(res["rows_s"] * 1e3, 2),
            limit_ms=round(limit * 1e3, 2),
            cpu_ratio_to_limit=round(res["step_cpu_s"] / limit, 2),
        )
    if "device_peak_bytes" in res:
        out["device_peak_gb"] = round(res["device_peak_bytes"] / 1e9, 3)
    return out


def storage_accuracy(num_classes=2000, in_dim=128, dim=128, steps=300, batch=256, rate=0.1):
    """Train a linear backbone + Partial FC with float32 vs bfloat16 center storage (same data,
    same seeds) and report held-out nearest-center accuracy and the final training loss."""
    import torch
    import torch.nn.functional as F

    from partialfc.classifier import PartialFC, RowSparseSGD
    from partialfc.losses.margins import ArcFaceMargin

    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    prototypes = torch.randn(num_classes, in_dim, generator=gen)

    def sample(n, g):
        labels = torch.randint(0, num_classes, (n,), generator=g)
        return prototypes[labels] + 2.5 * torch.randn(n, in_dim, generator=g), labels

    test_x, test_y = sample(10_000, torch.Generator().manual_seed(1))
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        torch.manual_seed(0)
        backbone = torch.nn.Linear(in_dim, dim)
        pfc = PartialFC(num_classes, dim, ArcFaceMargin(0.5, 32.0), sample_rate=rate,
                        storage_dtype=dtype, seed=0)  # fmt: skip
        opt_b = torch.optim.SGD(backbone.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        opt_c = RowSparseSGD(pfc, lr=0.05, momentum=0.9, weight_decay=5e-4)
        data = torch.Generator().manual_seed(2)
        losses = []
        for _ in range(steps):
            x, y = sample(batch, data)
            loss = pfc(backbone(x), y)
            loss.backward()
            opt_b.step()
            opt_c.step()
            opt_b.zero_grad()
            losses.append(loss.item())
        with torch.no_grad():
            emb = F.normalize(backbone(test_x), dim=1)
            centers = F.normalize(pfc.local_centers_float32(), dim=1)
            acc = (emb @ centers.t()).argmax(dim=1).eq(test_y).float().mean().item()
        out[name] = dict(
            held_out_top1=round(acc, 4),
            final_loss_mean_last_20=round(sum(losses[-20:]) / 20, 4),
            center_bytes_per_class=pfc.centers.nbytes() // num_classes,
        )
    return dict(
        benchmark="partial_fc_storage_dtype_accuracy",
        setup=dict(
            num_classes=num_classes,
            in_dim=in_dim,
            embedding_dim=dim,
            steps=steps,
            batch=batch,
            sample_rate=rate,
            margin="ArcFace 0.5 rad, s=32",
            data="Gaussian clusters around random prototypes, noise sd 2.5",
        ),  # fmt: skip
        results=out,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument(
        "--select",
        default=None,
        help="only the preset's configurations matching all KEY=VALUE pairs, e.g. world=2,rate=0.1",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--storage-accuracy", action="store_true", help="only the float32 vs bfloat16 comparison"
    )
    args = parser.parse_args(argv)
    if args.storage_accuracy:
        text = json.dumps(storage_accuracy(), indent=1)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        print(text)
        return 0
    if args.worker:
        print("RESULT " + json.dumps(_worker(json.loads(args.worker))))
        return 0
    configs = PRESETS[args.preset]
    if args.select:
        wanted = dict(pair.split("=", 1) for pair in args.select.split(","))
        configs = [c for c in configs if all(str(c.get(k)) == v for k, v in wanted.items())]
        if not configs:
            parser.error(f"--select {args.select!r} matches no configuration of {args.preset}")
    records = []
    for cfg in configs:
        cfg = dict(cfg, threads=max(1, args.threads // cfg["world"]))
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(cfg)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            rec = dict(cfg, error=proc.stderr.strip().splitlines()[-1:] or ["no output"])
        else:
            rec = _summarise(cfg, json.loads(lines[-1][len("RESULT ") :]))
        records.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
    report = dict(
        benchmark="partial_fc_layer",
        embedding_dim=DIM,
        machine=dict(
            platform=platform.platform(),
            cpus=os.cpu_count(),
            threads=args.threads,
            gemm_rates=gemm_rates(args.threads),
            load_average_at_end=[round(v, 2) for v in os.getloadavg()],
        ),
        notes=(
            "step = forward + backward + optimizer (median and best of the timed steps after one "
            "warm-up; on a shared machine the best is closer to what the code costs); "
            "gemm_limit = bare time of the 3 GEMMs over the active rows in the layer's compute "
            "precision on its path (float32 GEMMs for float32 and emulated bfloat16), process "
            "CPU time on a CPU; step_cpu_ms / cpu_ratio_to_gemm: the step in process CPU time "
            "(what counts on a loaded machine); row_traffic = bare gather + scatter of the "
            "active rows of the centers and of each optimizer-state table, once each (the "
            "memory traffic any row-sparse update needs; sparse mode only); limit = gemm_limit "
            "+ row_traffic, cpu_ratio_to_limit = step_cpu / limit; "
            "layer_peak = "
            "peak RSS - RSS before building the layer (measured after a one-step warm-up of "
            "the libraries on a 64-class layer); state = centers + optimizer state"
        ),
        results=records,
    )
    text = json.dumps(report, indent=1)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(args.out, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
