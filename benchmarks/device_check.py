"""GPU check of the CUDA / NCCL / mixed-precision paths (one script, JSON out).

Run on a machine with one or more CUDA devices:

    python benchmarks/device_check.py --out device_check.json [--quick]

Sections (each independent; a failure is recorded, the rest still run):

1. ``pfc_cuda_vs_cpu``: the same Partial FC step (r = 1 and r = 0.1; ArcFace, CosFace, combined
   margin, sub-centers; device storage, pinned host storage, bf16 storage) on CUDA and on CPU:
   loss, embedding gradient and updated centers must agree (fp32, TF32 off).
2. ``nccl``: Partial FC under an NCCL process group of one rank per GPU (1 rank when the
   machine has one GPU; NCCL refuses two ranks on one device) against the no-group result.
3. ``gloo_cuda_2ranks``: two ranks sharing the GPU over gloo, r = 1, against one process with
   the concatenated batch (the multi-rank semantics with CUDA tensors).
4. ``amp_training``: the training engine on CUDA with fp16 + GradScaler and with bf16
   (IResNet-50, 112x112, synthetic images): finite, decreasing loss; images/s.
5. ``pfc_speed``: Partial FC step time on the GPU at C = 1e6 and 1e7 (d = 512, B = 512,
   r = 0.1), sparse vs dense, with the bare GEMM time of the active rows as the limit and the
   peak CUDA memory.
6. ``pfc_compute_dtype``: Partial FC with ``compute_dtype`` float16 / bfloat16 on the GPU (the
   native path, float32 output): loss and gradients against float32 compute within the
   derived tolerance; step time at C = 1e6 and 1e7 (B = 512, r = 0.1) against the bare GEMM
   time of the active rows *in that dtype*, and the peak CUDA memory.
7. ``vs_arcface_torch`` (with ``--insightface DIR``, a local deepinsight/insightface copy):
   ``benchmarks/bench_vs_arcface_torch.py`` on the GPU, C = 1e6 and 1e7, B = 512, float32 and
   mixed precision (V2 ``fp16=True`` against ours ``compute_dtype=float16``); its JSON is
   embedded and written next to ``--out``.

One command for everything on a GPU machine::

    python benchmarks/device_check.py --insightface /path/to/insightface \
        --out benchmarks/results/device_check_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from partialfc.atomic import atomic_write_bytes
from partialfc.classifier import PartialFC, RowSparseSGD
from partialfc.losses.margins import ArcFaceMargin, CombinedMargin, CosFaceMargin

RESULTS: dict = {}


def section(name):
    def wrap(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                RESULTS[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), **out}
            except Exception:  # noqa: BLE001 - recorded, the other sections still run
                RESULTS[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
            print(json.dumps({name: RESULTS[name]}, indent=1, default=str), flush=True)

        return run

    return wrap


def _margins():
    return {
        "arcface": lambda: ArcFaceMargin(margin_rad=0.5, scale=64.0),
        "cosface": lambda: CosFaceMargin(margin=0.35, scale=64.0),
        "combined": lambda: CombinedMargin(m1=1.0, m2_rad=0.3, m3=0.2, scale=64.0),
    }


def _pfc_step(
    device,
    num_classes,
    dim,
    x,
    y,
    margin,
    rate,
    k=1,
    storage_dtype=torch.float32,
    storage_device=None,
    process_group=None,
    steps=2,
    active_classes=None,
):
    """Two training steps; returns losses, the last embedding gradient, the centers and the
    active classes of each step. ``active_classes`` (from another run) replaces the sampling,
    so a CPU reference uses exactly the classes the CUDA run drew (the generators differ)."""
    pfc = PartialFC(
        num_classes,
        dim,
        margin,
        sample_rate=rate,
        num_subcenters=k,
        seed=3,
        storage_dtype=storage_dtype,
        device=device,
        storage_device=storage_device,
        process_group=process_group,
    )
    if active_classes is not None:
        forced = iter(active_classes)
        pfc._select_active_classes = lambda labels_all: next(forced).to(labels_all.device)
    opt = RowSparseSGD(pfc, lr=0.1, momentum=0.9, weight_decay=5e-4)
    losses, drawn = [], []
    for _ in range(steps):
        xe = x.to(device).clone().requires_grad_(True)
        loss = pfc(xe, y.to(device))
        loss.backward()
        drawn.append((pfc.active_rows.rows.view(-1, k)[:, 0] // k).cpu())
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, xe.grad.detach().cpu(), pfc.local_centers_float32().cpu(), drawn


def _max_diff(a, b):
    return float((a.float() - b.float()).abs().max())


@section("pfc_cuda_vs_cpu")
def check_pfc_cuda_vs_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    c, d, b = 1000, 64, 96
    x = torch.randn(b, d)
    y = torch.randint(0, c, (b,))
    rows = []
    worst = 0.0
    for name, make in _margins().items():
        for rate, k, storage_dtype, storage_device in (
            (1.0, 1, torch.float32, None),
            (0.1, 1, torch.float32, None),
            (1.0, 3, torch.float32, None),
            (0.1, 1, torch.float32, "cpu"),
            (0.1, 1, torch.bfloat16, None),
        ):
            got = _pfc_step("cuda", c, d, x, y, make(), rate, k, storage_dtype, storage_device)
            ref = _pfc_step("cpu", c, d, x, y, make(), rate, k, storage_dtype,
                            active_classes=got[3])  # fmt: skip
            diff = {
                "loss": max(abs(p - q) for p, q in zip(ref[0], got[0], strict=True)),
                "emb_grad": _max_diff(ref[1], got[1]),
                "centers": _max_diff(ref[2], got[2]),
            }
            tol = 2e-2 if storage_dtype == torch.bfloat16 else 1e-4
            ok = all(v <= tol for v in diff.values())
            worst = max(worst, *diff.values()) if storage_dtype == torch.float32 else worst
            rows.append(
                {
                    "margin": name,
                    "rate": rate,
                    "subcenters": k,
                    "storage": f"{storage_dtype}@{storage_device or 'cuda'}",
                    "loss_cuda": got[0],
                    "max_abs_diff": diff,
                    "ok": ok,
                }
            )
    assert all(r["ok"] for r in rows), rows
    return {"cases": rows, "worst_fp32_abs_diff": worst}


def _rank_worker(rank, world, backend, init_file, x, y, queue):
    """One rank: its slice of the batch through Partial FC (r = 1) on its GPU."""
    try:
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        per = x.shape[0] // world
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        losses, grad, _, _ = _pfc_step(device, 1000, 64, xs, ys, ArcFaceMargin(), 1.0, steps=2)
        # world > 1 scales the embedding gradient by N (DDP mean convention); undo it here
        queue.put((rank, "ok", (losses, grad / world)))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


def _compare_ranks_with_one_process(backend: str, world: int, seed: int) -> dict:
    """N ranks over ``backend`` against one process with the concatenated batch."""
    torch.manual_seed(seed)
    x, y = torch.randn(64 * world, 64), torch.randint(0, 1000, (64 * world,))
    ref_loss, ref_grad, _, _ = _pfc_step("cuda", 1000, 64, x, y, ArcFaceMargin(), 1.0, steps=2)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, backend, f"{tmp}/rdv", x, y, queue)
        procs = [ctx.Process(target=_rank_worker, args=(r, *args)) for r in range(world)]
        for p in procs:
            p.start()
        outs = sorted((queue.get(timeout=300) for _ in range(world)), key=lambda o: o[0])
        for p in procs:
            p.join(timeout=30)
    errors = [o[2] for o in outs if o[1] != "ok"]
    assert not errors, errors
    losses = outs[0][2][0]
    diff = {
        "loss": max(abs(p - q) for p, q in zip(ref_loss, losses, strict=True)),
        "emb_grad": _max_diff(ref_grad, torch.cat([o[2][1] for o in outs])),
    }
    assert diff["loss"] < 1e-4 and diff["emb_grad"] < 1e-5, diff
    return {"world_size": world, "backend": backend, "max_abs_diff": diff, "losses": losses}


@section("nccl")
def check_nccl():
    # NCCL refuses two ranks on one device: one rank per GPU
    return _compare_ranks_with_one_process("nccl", torch.cuda.device_count(), seed=1)


@section("gloo_cuda_2ranks")
def check_gloo_cuda():
    return _compare_ranks_with_one_process("gloo", 2, seed=2)


@section("amp_training")
def check_amp_training(quick: bool):
    import numpy as np

    from partialfc.data.datasets import ArrayDataset
    from partialfc.train.config import config_from_dict
    from partialfc.train.engine import Trainer

    rng = np.random.default_rng(0)
    n_cls, per = 64, 8
    base = rng.integers(0, 256, size=(n_cls, 112, 112, 3), dtype=np.uint8)
    images = np.repeat(base, per, axis=0)
    noise = rng.integers(-20, 20, size=images.shape)
    images = np.clip(images.astype(int) + noise, 0, 255).astype(np.uint8)
    labels = np.repeat(np.arange(n_cls), per)
    out = {}
    for precision in ("fp16", "bf16"):
        cfg = config_from_dict(
            {
                "model": {"name": "iresnet50", "embedding_dim": 512},
                "data": {
                    "source": "omniglot",
                    "input_size": 112,
                    "batch_size": 128,
                    "num_workers": 2,
                    "augment": {"hflip": True},
                },
                "head": {"sample_rate": 0.5, "margin": {"m2_rad": 0.5, "scale": 64.0}},
                "optim": {"lr": 0.05},
                "schedule": {"kind": "constant"},
                "train": {
                    "epochs": 2 if quick else 6,
                    "precision": precision,
                    "device": "cuda",
                    "log_every": 1,
                    "diagnostics_every": 0,
                },
                "checkpoint": {"every_steps": 0, "at_epoch_end": False},
                "run": {"output_dir": tempfile.mkdtemp(), "name": precision, "progress": False},
            }
        )
        trainer = Trainer(cfg, train_set=ArrayDataset(images, labels))
        t0 = time.perf_counter()
        result = trainer.fit()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        losses = list(getattr(result, "losses", []) or [])
        finite = all(np.isfinite(losses)) if losses else False
        out[precision] = {
            "steps": trainer.step,
            "seconds": round(seconds, 2),
            "images_per_s": round(trainer.step * 128 / seconds, 1),
            "first_losses": [round(v, 3) for v in losses[:3]],
            "last_losses": [round(v, 3) for v in losses[-3:]],
            "finite": finite,
            "scaler_scale": float(trainer.scaler.get_scale())
            if trainer.scaler.is_enabled()
            else None,
        }
        assert finite and losses[-1] < losses[0], out[precision]
    return out


@section("pfc_speed")
def check_pfc_speed(quick: bool):
    torch.backends.cuda.matmul.allow_tf32 = False
    dim, batch, rate = 512, 512, 0.1
    rows = []
    configs = [(1_000_000, "sparse", torch.float32), (1_000_000, "dense", torch.float32)]
    if not quick:
        configs += [(10_000_000, "sparse", torch.float32), (10_000_000, "sparse", torch.bfloat16)]
    for num_classes, update, storage_dtype in configs:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        pfc = PartialFC(
            num_classes,
            dim,
            ArcFaceMargin(),
            sample_rate=rate,
            update=update,
            storage_dtype=storage_dtype,
            device="cuda",
        )
        if update == "sparse":
            opt = RowSparseSGD(pfc, lr=0.1, momentum=0.9, weight_decay=5e-4)
        else:
            opt = torch.optim.SGD(pfc.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        state_bytes = torch.cuda.memory_allocated()
        x = torch.randn(batch, dim, device="cuda")
        y = torch.randint(0, num_classes, (batch,), device="cuda")
        times = []
        for i in range(8):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            xe = x.clone().requires_grad_(True)
            loss = pfc(xe, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        step_s = sorted(times)[len(times) // 2]
        active = pfc.budget
        w = torch.randn(active, dim, device="cuda")
        g = torch.randn(batch, active, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            x @ w.t()
            g @ w
            g.t() @ x
        torch.cuda.synchronize()
        gemm_s = (time.perf_counter() - t0) / 10
        rows.append(
            {
                "num_classes": num_classes,
                "update": update,
                "storage_dtype": str(storage_dtype),
                "batch": batch,
                "rate": rate,
                "active_rows": active,
                "step_ms": round(step_s * 1e3, 3),
                "gemm_limit_ms": round(gemm_s * 1e3, 3),
                "ratio_to_gemm": round(step_s / gemm_s, 2),
                "state_gib": round(state_bytes / 2**30, 3),
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            }
        )
        print(rows[-1], flush=True)
        del pfc, opt, x, y, w, g
    return {"rows": rows}


@section("pfc_compute_dtype")
def check_pfc_compute_dtype(quick: bool):
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"agreement": [], "speed": []}
    # agreement: r = 1, small; logits move by at most s u sqrt(2/d) typically (u = 2^-8 bf16,
    # 2^-11 fp16), gradients by 2u + s u sqrt(2/d) relative (see the precision tests)
    c, d, b, s = 1000, 64, 64, 32.0
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(b, d, generator=gen).cuda(), torch.randint(0, c, (b,), generator=gen).cuda()
    ref = None
    for dtype in ("float32", "bfloat16", "float16"):
        pfc = PartialFC(c, d, ArcFaceMargin(0.5, s), compute_dtype=dtype, device="cuda",
                        seed=1, init_std=0.25)  # fmt: skip
        xe = x.clone().requires_grad_(True)
        loss = pfc(xe, y)
        loss.backward()
        got = (loss.item(), xe.grad.clone(), pfc.active_rows.center_grad().clone())
        if ref is None:
            ref = got
            continue
        u = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
        rel = [float((g - r).norm() / r.norm()) for g, r in zip(got[1:], ref[1:], strict=True)]
        row = {
            "compute_dtype": dtype,
            "path": pfc.precision.describe(),
            "loss_diff": abs(got[0] - ref[0]),
            "loss_tol": s * u * math.sqrt(2 / d),
            "grad_rel": rel,
            "grad_rtol": 2 * u + s * u * math.sqrt(2 / d),
        }
        row["ok"] = row["loss_diff"] <= row["loss_tol"] and max(rel) <= row["grad_rtol"]
        out["agreement"].append(row)
        print(row, flush=True)
    dim, batch, rate = 512, 512, 0.1
    sizes = [1_000_000] if quick else [1_000_000, 10_000_000]
    for num_classes in sizes:
        for dtype in ("float32", "bfloat16", "float16"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            pfc = PartialFC(num_classes, dim, ArcFaceMargin(), sample_rate=rate,
                            compute_dtype=dtype, device="cuda")  # fmt: skip
            opt = RowSparseSGD(pfc, lr=0.1, momentum=0.9, weight_decay=5e-4)
            x = torch.randn(batch, dim, device="cuda")
            y = torch.randint(0, num_classes, (batch,), device="cuda")
            times = []
            for i in range(8):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                xe = x.clone().requires_grad_(True)
                pfc(xe, y).backward()
                opt.step()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(time.perf_counter() - t0)
            step_s = sorted(times)[len(times) // 2]
            active = pfc.budget
            low = getattr(torch, dtype)
            w = torch.randn(active, dim, device="cuda", dtype=low)
            g = torch.randn(batch, active, device="cuda", dtype=low)
            xl = x.to(low)
            kw = {} if low == torch.float32 else {"out_dtype": torch.float32}
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                torch.mm(xl, w.t(), **kw)
                torch.mm(g, w, **kw)
                torch.mm(g.t(), xl, **kw)
            torch.cuda.synchronize()
            gemm_s = (time.perf_counter() - t0) / 10
            flops = 3 * 2 * batch * active * dim
            row = {
                "num_classes": num_classes,
                "compute_dtype": dtype,
                "path": pfc.precision.describe(),
                "batch": batch,
                "rate": rate,
                "active_rows": active,
                "step_ms": round(step_s * 1e3, 3),
                "gemm_limit_ms": round(gemm_s * 1e3, 3),
                "gemm_tflops": round(flops / gemm_s / 1e12, 1),
                "ratio_to_gemm": round(step_s / gemm_s, 2),
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            }
            out["speed"].append(row)
            print(row, flush=True)
            del pfc, opt, x, y, w, g, xl
    assert all(r["ok"] for r in out["agreement"]), out["agreement"]
    return out


@section("vs_arcface_torch")
def check_vs_arcface_torch(insightface: str, out_path: str, quick: bool):
    script = Path(__file__).with_name("bench_vs_arcface_torch.py")
    target = Path(out_path).with_name(Path(out_path).stem + "_vs_arcface_torch.json")
    classes = ["1000000"] if quick else ["1000000", "10000000"]
    cmd = [sys.executable, str(script), "--insightface", insightface, "--device", "cuda",
           "--batch", "512", "--steps", "5", "--threads", "4", "--classes", *classes,
           "--out", str(target)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    report = json.loads(target.read_text())
    print(report["ratios"], flush=True)
    return {"json": str(target), "ratios": report["ratios"], "results": report["results"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="device_check.json")
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--only", nargs="*", default=None, help="section names to run")
    parser.add_argument(
        "--insightface", default=None, help="local deepinsight/insightface copy (section 7)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    RESULTS["device"] = {
        "name": torch.cuda.get_device_name(0),
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    wanted = set(args.only) if args.only else None
    plan = [
        ("pfc_cuda_vs_cpu", check_pfc_cuda_vs_cpu, ()),
        ("nccl", check_nccl, ()),
        ("gloo_cuda_2ranks", check_gloo_cuda, ()),
        ("amp_training", check_amp_training, (args.quick,)),
        ("pfc_speed", check_pfc_speed, (args.quick,)),
        ("pfc_compute_dtype", check_pfc_compute_dtype, (args.quick,)),
    ]
    if args.insightface:
        plan.append(("vs_arcface_torch", check_vs_arcface_torch,
                     (args.insightface, args.out, args.quick)))  # fmt: skip
    for name, fn, fn_args in plan:
        if wanted is None or name in wanted:
            fn(*fn_args)
    atomic_write_bytes(args.out, json.dumps(RESULTS, indent=1, default=str).encode())
    failed = [k for k, v in RESULTS.items() if isinstance(v, dict) and v.get("ok") is False]
    print("FAILED: " + ", ".join(failed) if failed else "all device checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
