"""One GPU run that explains the Partial FC step: partialfc and arcface_torch's PartialFC_V2 side
by side, every part time-boxed, the JSON rewritten (atomically) after every part.

    python benchmarks/device_check.py --insightface /path/to/insightface \\
        --out benchmarks/results/device_check_h100.json          # about 8 minutes, one GPU
    python benchmarks/device_check.py --dry-run --out /tmp/dry.json   # the same code, CPU, seconds

Parts, in order (each has a time budget; one that runs past it is recorded as ``timeout`` with
what it had measured, one that fails as ``error``; a part that no longer fits in ``--budget-s``
is ``skipped``):

1. ``environment``: device, torch, CUDA, the peak GEMM rates (vendor figures for known GPUs;
   measured with one large product in each dtype).
2. ``agreement``: the same Partial FC steps on the GPU and on the CPU (loss, embedding gradient,
   centers; float32, TF32 off); ``compute_dtype_agreement``: float16 / bfloat16 compute against
   float32 within the derived tolerances (docs/mixed_precision.md).
3. ``build/...`` and ``step/...``: for C = 10^6 and 10^7 classes on this GPU, d = 512,
   r = 0.1, ArcFace, SGD (momentum 0.9, weight decay 5e-4) behind a linear "backbone" d -> d,
   precision fp32 / bf16 / fp16 (fp16 with a ``GradScaler``, as the trainer runs it), and
   B = 512 and 128: for each layer the step time (median of timed steps), the peak device
   memory, the GEMM limit (the three GEMMs over the active rows, ``3 * 2 * B * n * d`` FLOPs at
   the peak rate of the dtype), the host syncs of one step
   (``torch.cuda.set_sync_debug_mode("warn")``, warnings counted) and a ``torch.profiler``
   table: the top kernels by device time, kernels per step, device-busy time and the idle time
   between kernels (the host's share of the step).
4. ``summary``: per configuration, ours against V2 and against the GEMM limit.
5. ``nccl``, ``gloo_cuda_2ranks``, ``amp_training``: the distributed and trainer checks, when
   time is left.

``--dry-run`` runs parts 1, 3 and 4 on the CPU at C = 10^4, B = 32 and 16, d = 64
(a few steps): the profiler records CPU activities (top-level ATen ops stand in for kernels),
host syncs are counted by the dispatch-mode counter of ``benchmarks/step_op_budget.py`` (no
device to wait for), fp16 runs as bfloat16 (no float16 GEMM on CPUs) with a CPU GradScaler,
and the peak device memory is not measured. CI runs it (tests/benchmarks/test_device_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from partialfc.atomic import atomic_write_bytes
from partialfc.autograd import scale_gradient
from partialfc.classifier import PartialFC, RowSparseSGD
from partialfc.losses.margins import ArcFaceMargin, CombinedMargin, CosFaceMargin

RATE = 0.1
MODES = ("fp32", "bf16", "fp16")
#: dense GEMM peak, TFLOP/s, from the vendors' data sheets (SXM parts; float32 without TF32)
PEAK_TFLOPS = {
    "H200": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "H100": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------- the run
class PartTimeout(Exception):
    """A part ran past its time budget."""


@contextlib.contextmanager
def time_box(seconds: float):
    """Raise :class:`PartTimeout` in the main thread after ``seconds`` (SIGALRM)."""

    def expire(signum, frame):
        raise PartTimeout(f"past its budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Run:
    """Parts with time budgets inside one overall budget; the JSON is rewritten after each."""

    def __init__(self, out: Path, budget_s: float, meta: dict) -> None:
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.report = {"benchmark": "device_check", **meta, "parts": {}}

    def part(self, name: str, budget_s: float, fn, *args) -> dict:
        """Run ``fn(record, *args)``; ``record`` (a dict it fills as it goes) is kept whatever
        happens, with ``status``: ok, timeout, error or skipped."""
        record: dict = {}
        left = self.deadline - time.monotonic()
        if left < min(budget_s, 5.0):
            record.update(status="skipped", reason=f"{left:.0f} s of the run's budget left")
        else:
            budget = min(budget_s, left)
            t0 = time.perf_counter()
            try:
                with time_box(budget):
                    fn(record, *args)
                record["status"] = "ok"
            except PartTimeout as exc:
                record.update(status="timeout", reason=str(exc))
            except Exception:  # noqa: BLE001 - recorded; the other parts still run
                record.update(status="error", error=traceback.format_exc()[-3000:])
            record.update(seconds=round(time.perf_counter() - t0, 2), budget_s=round(budget, 1))
        self.report["parts"][name] = record
        self.write()
        print(json.dumps({name: _short(record)}, default=str), flush=True)
        return record

    def write(self) -> None:
        text = json.dumps(self.report, indent=1, default=str) + "\n"
        atomic_write_bytes(self.out, text.encode())


def _short(record: dict) -> dict:
    keys = ("status", "seconds", "step_ms", "gemm_limit_ms", "peak_memory_gib", "host_syncs")
    return {k: record[k] for k in keys if k in record}


# ---------------------------------------------------------------------------- sizes and limits
def gemm_flops(batch: int, active_rows: int, dim: int) -> int:
    """The three GEMMs over the active rows (scores, embedding and center gradients)."""
    return 3 * 2 * batch * active_rows * dim


def spec_peak_flops(device_name: str, mode: str) -> float | None:
    for key, table in PEAK_TFLOPS.items():
        if key in device_name:
            return table[mode] * 1e12
    return None


def measured_peak_flops(device: torch.device, mode: str, size: int) -> float:
    """FLOP/s of one ``size``-square product in the dtype (the best of three)."""
    dtype = _DTYPES[mode] if device.type == "cuda" or mode != "fp16" else torch.bfloat16
    a = torch.randn(size, size, device=device).to(dtype)
    best = math.inf
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Sizes:
    """What the run measures: on a GPU the issue's sizes, in a dry run small ones."""

    classes: tuple[int, ...]
    batches: tuple[int, ...]
    dim: int
    warmup: int
    timed: int
    profiled: int
    build_budget_s: dict
    step_budget_s: dict
    peak_size: int


GPU_SIZES = Sizes(
    (1_000_000, 10_000_000),
    (512, 128),
    512,
    2,
    5,
    2,
    {1_000_000: 40, 10_000_000: 90},
    {1_000_000: 25, 10_000_000: 45},
    8192,
)
DRY_SIZES = Sizes((10_000,), (32, 16), 64, 1, 2, 1, {10_000: 20}, {10_000: 20}, 256)


# ---------------------------------------------------------------------------- the layers
def _load_script(name: str):
    """``benchmarks/<name>.py`` as a module (scripts are not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _autocast(device: torch.device, mode: str):
    """The backbone's autocast region of a mode (fp16 is bfloat16 on CPUs)."""
    if mode == "fp32":
        return contextlib.nullcontext()
    dtype = _DTYPES[mode] if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


class Stepper:
    """One training step of a layer behind a linear backbone, as the trainer runs it."""

    def __init__(self, layer, layer_opt, dim: int, device: torch.device, mode: str, v2: bool):
        self.layer, self.layer_opt, self.device, self.mode, self.v2 = (
            layer,
            layer_opt,
            device,
            mode,
            v2,
        )
        self.backbone = nn.Linear(dim, dim).to(device)
        params = list(self.backbone.parameters()) + (list(layer.parameters()) if v2 else [])
        self.opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None

    def __call__(self, features, labels):
        with _autocast(self.device, self.mode):
            embeddings = self.backbone(features)
        embeddings = embeddings.float()  # arcface_torch's backbones return float32
        if self.v2:  # arcface_torch: the scaler scales the loss, V2's weight shares the step
            with self._v2_context():
                loss = self.layer(embeddings, labels.clone())
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return loss
        if self.scaler is not None:  # partialfc's trainer: the scale enters below the head
            embeddings = scale_gradient(
                embeddings, self.scaler.scale(torch.ones((), device=self.device))
            )
        loss = self.layer(embeddings, labels)
        loss.backward()
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.layer_opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    @contextlib.contextmanager
    def _v2_context(self):
        """V2's own mixed precision (``fp16=True``: its logits GEMM under
        ``torch.cuda.amp.autocast``), as bfloat16 for bf16 and on CPUs; ``.cuda()`` is the
        identity on a CPU."""
        self.layer.fp16 = self.mode != "fp32"
        with contextlib.ExitStack() as stack:
            if self.mode == "bf16" or self.device.type == "cpu":
                region = lambda enabled=True, **_: torch.autocast(  # noqa: E731
                    self.device.type, dtype=torch.bfloat16, enabled=enabled
                )
                stack.enter_context(mock.patch.object(torch.cuda.amp, "autocast", region))
            if self.device.type == "cpu":
                stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda t, *a, **k: t))
            yield


def build_partialfc(num_classes: int, dim: int, mode: str, device: torch.device) -> Stepper:
    compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[mode]
    if device.type == "cpu" and mode == "fp16":
        compute = "bfloat16"  # no float16 GEMM on CPUs
    layer = PartialFC(
        num_classes,
        dim,
        ArcFaceMargin(0.5, 64.0),
        sample_rate=RATE,
        compute_dtype=compute,
        device=device,
    )
    opt = RowSparseSGD(layer, lr=0.1, momentum=0.9, weight_decay=5e-4)
    return Stepper(layer, opt, dim, device, mode, v2=False)


def build_v2(num_classes: int, dim: int, device: torch.device, reference_dir: Path):
    """PartialFC_V2 (needs a process group), on ``device``; modes share it."""
    budget = _load_script("step_op_budget")
    losses = budget._load(reference_dir, "losses.py")
    v2 = budget._load(reference_dir, "partial_fc_v2.py")
    margin = losses.CombinedMarginLoss(64.0, 1.0, 0.5, 0.0)
    return v2.PartialFC_V2(margin, dim, num_classes, RATE, fp16=False).to(device)


def active_rows(stepper: Stepper) -> int:
    layer = stepper.layer
    return layer.num_sample if stepper.v2 else layer.budget


# ---------------------------------------------------------------------------- one configuration
def _batches(n: int, batch: int, dim: int, num_classes: int, device):
    gen = torch.Generator().manual_seed(batch)
    return [
        (
            torch.randn(batch, dim, generator=gen).to(device),
            torch.randint(0, num_classes, (batch,), generator=gen).to(device),
        )
        for _ in range(n)
    ]


def count_host_syncs(stepper: Stepper, batch) -> dict:
    """Host syncs of one step: CUDA's sync debug mode (warnings counted) on a GPU, the
    dispatch-mode counter of ``step_op_budget`` on a CPU (nothing waits there)."""
    if stepper.device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                stepper(*batch)
                torch.cuda.synchronize()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        messages = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
        return {
            "host_syncs": len(messages),
            "host_sync_method": "cuda sync debug mode",
            "host_sync_examples": sorted(set(m[:160] for m in messages))[:8],
        }
    budget = _load_script("step_op_budget")
    with budget.counting() as counter:
        stepper(*batch)
    return {
        "host_syncs": counter.tally.syncs,
        "host_sync_method": "emulated on the CPU: ops that would make the host wait",
        "host_sync_examples": sorted(counter.tally.sync_ops),
    }


def _has_aten_ancestor(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def kernel_events(prof, device: torch.device) -> list:
    """The device's kernels (CUDA), or the top-level ATen ops standing in for them (CPU)."""
    from torch.autograd import DeviceType

    events = prof.events()
    if device.type == "cuda":
        return [e for e in events if e.device_type == DeviceType.CUDA]
    return [
        e
        for e in events
        if e.device_type == DeviceType.CPU
        and e.name.startswith("aten::")
        and not _has_aten_ancestor(e)
    ]


def kernel_table(events: list, steps: int, top: int = 15) -> dict:
    """Where the device time goes: the top kernels, kernels per step, busy and idle time."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events)
    busy, gaps, reach = 0.0, [], None
    for start, end, name in spans:
        if reach is None or start >= reach[0]:
            if reach is not None:
                gaps.append((start - reach[0], reach[1], name))
            busy += end - start
            reach = (end, name)
        elif end > reach[0]:
            busy += end - reach[0]
            reach = (end, name)
    span = (spans[-1][1] - spans[0][0]) if spans else 0.0
    by_name: dict = {}
    for start, end, name in spans:
        count, total = by_name.get(name, (0, 0.0))
        by_name[name] = (count + 1, total + end - start)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "kernels_per_step": len(spans) / steps,
        "busy_us_per_step": round(busy / steps, 1),
        "span_us_per_step": round(span / steps, 1),
        "idle_between_kernels_us_per_step": round((span - busy) / steps, 1),
        "largest_gaps_us": [
            {"gap_us": round(g, 1), "after": a[:80], "before": b[:80]}
            for g, a, b in sorted(gaps, reverse=True)[:5]
        ],
        "top_kernels": [
            {
                "name": name[:120],
                "count_per_step": c / steps,
                "us_per_step": round(t / steps, 1),
                "share_of_busy": round(t / busy, 4) if busy else 0.0,
            }
            for name, (c, t) in ranked
        ],
    }


def profile_step(
    record: dict, stepper: Stepper, sizes: Sizes, num_classes: int, batch: int, peak: dict
) -> None:
    """Times, memory, GEMM limit, host syncs and a profiler table of one configuration."""
    device, dim = stepper.device, sizes.dim
    if stepper.v2:
        stepper.layer.last_batch_size = 0  # V2 insists on one batch size; a new one starts here
    n = active_rows(stepper)
    data = _batches(
        sizes.warmup + sizes.timed + sizes.profiled + 1, batch, dim, num_classes, device
    )
    flops = gemm_flops(batch, n, dim)
    record.update(
        num_classes=num_classes,
        batch=batch,
        dim=dim,
        mode=stepper.mode,
        active_rows=n,
        gemm_flops=flops,
    )
    spec, measured = peak["spec"].get(stepper.mode), peak["measured"].get(stepper.mode)
    if spec:
        record["gemm_limit_ms"] = flops / spec * 1e3
    if measured:
        record["gemm_limit_measured_peak_ms"] = flops / measured * 1e3
    for i in range(sizes.warmup):
        stepper(*data[i])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(sizes.warmup, sizes.warmup + sizes.timed):
        _sync(device)
        t0 = time.perf_counter()
        loss = stepper(*data[i])
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        record.update(
            step_ms=round(statistics.median(times) * 1e3, 3),
            step_min_ms=round(min(times) * 1e3, 3),
            timed_steps=len(times),
        )
    record["losses"] = [round(v, 4) for v in losses]
    limit = record.get("gemm_limit_ms") or record.get("gemm_limit_measured_peak_ms")
    if limit:
        record["ratio_to_gemm_limit"] = round(record["step_ms"] / limit, 2)
    if device.type == "cuda":
        record["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    else:
        record["peak_memory_gib"] = None  # the caching allocator's peak is a GPU figure
    record.update(count_host_syncs(stepper, data[-1]))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    first = sizes.warmup + sizes.timed
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(first, first + sizes.profiled):
            stepper(*data[i])
        _sync(device)
    record["profile"] = kernel_table(kernel_events(prof, device), sizes.profiled)
    record["profile"]["activities"] = [a.name for a in activities]


# ---------------------------------------------------------------------------- the parts
def environment(record: dict, device: torch.device, sizes: Sizes, peak: dict) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    record.update(
        device=str(device),
        name=name or platform.machine(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        platform=platform.platform(),
    )
    if device.type == "cuda":
        record["count"] = torch.cuda.device_count()
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    for mode in MODES:
        spec = spec_peak_flops(record["name"], mode) if device.type == "cuda" else None
        if spec:
            peak["spec"][mode] = spec
        peak["measured"][mode] = measured_peak_flops(device, mode, sizes.peak_size)
    record["peak_flops_spec"] = dict(peak["spec"])
    record["peak_flops_measured"] = dict(peak["measured"])


def build_part(record: dict, holder: dict, build, *args) -> None:
    holder.clear()
    _release()
    t0 = time.perf_counter()
    holder["layer"] = build(*args)
    record["build_s"] = round(time.perf_counter() - t0, 2)


def _release() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def step_part(
    record: dict, holder: dict, sizes: Sizes, num_classes: int, batch: int, peak: dict
) -> None:
    if "stepper" not in holder:
        raise RuntimeError("its layer was not built (see the build part)")
    profile_step(record, holder["stepper"], sizes, num_classes, batch, peak)


def summary(record: dict, parts: dict) -> None:
    """Ours against V2 and against the GEMM limit, per configuration that ran."""
    rows = []
    for name, ours in parts.items():
        if not name.startswith("step/partialfc/") or ours.get("status") != "ok":
            continue
        v2 = parts.get(name.replace("step/partialfc/", "step/arcface_torch_v2/"), {})
        row = {k: ours[k] for k in ("num_classes", "batch", "mode", "step_ms", "host_syncs")}
        row["ours_over_gemm_limit"] = ours.get("ratio_to_gemm_limit")
        row["ours_kernels_per_step"] = ours["profile"]["kernels_per_step"]
        row["ours_idle_us_per_step"] = ours["profile"]["idle_between_kernels_us_per_step"]
        if v2.get("status") == "ok":
            row.update(
                v2_step_ms=v2["step_ms"],
                v2_host_syncs=v2["host_syncs"],
                speedup_vs_v2=round(v2["step_ms"] / ours["step_ms"], 2),
                v2_kernels_per_step=v2["profile"]["kernels_per_step"],
            )
            if ours.get("peak_memory_gib") and v2.get("peak_memory_gib"):
                row["memory_vs_v2"] = round(ours["peak_memory_gib"] / v2["peak_memory_gib"], 3)
        rows.append(row)
    record["rows"] = rows


def run_matrix(run: Run, device: torch.device, sizes: Sizes, peak: dict, reference_dir) -> None:
    """Build each layer once per (C, mode) (V2 once per C: its modes share a layer), then step
    it at every batch size; one layer is alive at a time (10^7 classes fill a GPU)."""
    layers = ["partialfc"] + (["arcface_torch_v2"] if reference_dir else [])
    holder: dict = {}
    for num_classes in sizes.classes:
        for layer_name in layers:
            for mode in MODES:
                key = f"{layer_name}/C={num_classes:.0e}/{mode}"
                if layer_name == "partialfc":
                    build, args = build_partialfc, (num_classes, sizes.dim, mode, device)
                    holder.clear()
                    run.part(
                        f"build/{key}",
                        sizes.build_budget_s[num_classes],
                        build_part,
                        holder,
                        build,
                        *args,
                    )
                    if "layer" in holder:
                        holder["stepper"] = holder.pop("layer")
                else:
                    if mode == MODES[0]:
                        holder.clear()
                        run.part(
                            f"build/{layer_name}/C={num_classes:.0e}",
                            sizes.build_budget_s[num_classes],
                            build_part,
                            holder,
                            build_v2,
                            num_classes,
                            sizes.dim,
                            device,
                            reference_dir,
                        )
                        holder["v2"] = holder.pop("layer", None)
                    holder.pop("stepper", None)
                    if holder.get("v2") is not None:
                        holder["stepper"] = Stepper(
                            holder["v2"], None, sizes.dim, device, mode, v2=True
                        )
                for batch in sizes.batches:
                    run.part(
                        f"step/{key}/B={batch}",
                        sizes.step_budget_s[num_classes],
                        step_part,
                        holder,
                        sizes,
                        num_classes,
                        batch,
                        peak,
                    )
        holder.clear()
        _release()


@contextlib.contextmanager
def process_group(device: torch.device):
    """A group of one process (V2 asserts one exists): NCCL on a GPU, gloo on a CPU."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"file://{tmp}/rdv",
            rank=0,
            world_size=1,
            device_id=torch.device("cuda", torch.cuda.current_device())
            if device.type == "cuda"
            else None,
        )
        try:
            yield
        finally:
            dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("device_check.json"),
        help="the JSON, rewritten after every part",
    )
    parser.add_argument(
        "--insightface",
        type=Path,
        default=None,
        help="local deepinsight/insightface copy: adds PartialFC_V2",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="the whole run's time budget; parts that no longer fit are skipped",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="the same code on the CPU at small sizes (seconds)"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: use --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    reference_dir = None
    if args.insightface:
        reference_dir = _load_script("step_op_budget").find_reference_files(
            args.insightface.resolve()
        )
    meta = {
        "dry_run": args.dry_run,
        "budget_s": args.budget_s,
        "sample_rate": RATE,
        "embedding_dim": sizes.dim,
        "classes": list(sizes.classes),
        "batches": list(sizes.batches),
        "modes": list(MODES),
        "v2": str(reference_dir) if reference_dir else None,
        "notes": (
            "step = backbone (linear d -> d) + layer forward, backward, both optimizers; "
            "gemm_limit_ms = 3 * 2 * B * active_rows * d FLOPs at the vendor's dense peak "
            "of the mode's dtype (gemm_limit_measured_peak_ms: at the rate measured here)"
        ),
    }
    run = Run(args.out, args.budget_s, meta)
    peak: dict = {"spec": {}, "measured": {}}
    run.part("environment", 60, environment, device, sizes, peak)
    if device.type == "cuda":
        run.part("agreement", 60, lambda record: record.update(check_pfc_cuda_vs_cpu()))
        run.part(
            "compute_dtype_agreement",
            30,
            lambda record: record.update(check_compute_dtype_agreement()),
        )
    with process_group(device) if reference_dir else contextlib.nullcontext():
        run_matrix(run, device, sizes, peak, reference_dir)
    run.part("summary", 10, summary, run.report["parts"])
    if device.type == "cuda":
        run.part("nccl", 60, lambda record: record.update(check_nccl()))
        run.part("gloo_cuda_2ranks", 60, lambda record: record.update(check_gloo_cuda()))
        run.part("amp_training", 120, lambda record: record.update(check_amp_training(True)))
    failed = [k for k, v in run.report["parts"].items() if v.get("status") != "ok"]
    print(("not ok: " + ", ".join(failed)) if failed else "every part ran", flush=True)
    return 0


# ---------------------------------------------------------------------------- GPU-only checks
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
        pfc._draw_active_classes = lambda positives: next(forced).to(positives.device)
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
            ref = _pfc_step(
                "cpu", c, d, x, y, make(), rate, k, storage_dtype, active_classes=got[3]
            )
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


def check_nccl():
    # NCCL refuses two ranks on one device: one rank per GPU
    return _compare_ranks_with_one_process("nccl", torch.cuda.device_count(), seed=1)


def check_gloo_cuda():
    return _compare_ranks_with_one_process("gloo", 2, seed=2)


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


def check_compute_dtype_agreement():
    """float16 / bfloat16 compute on the GPU (the native path, float32 output) against float32
    compute: loss and gradients within the derived tolerances."""
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"agreement": []}
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
    assert all(r["ok"] for r in out["agreement"]), out["agreement"]
    return out


if __name__ == "__main__":
    sys.exit(main())
