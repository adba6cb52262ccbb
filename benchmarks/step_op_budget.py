"""What one Partial FC training step launches, counted on the CPU through the accelerator code
path: ATen ops, host-synchronising ops and bytes allocated, per phase (forward, backward,
optimizer), for partialfc's ``PartialFC`` and InsightFace ``arcface_torch``'s ``PartialFC_V2``.

Counting: a ``TorchDispatchMode`` sees every ATen op that reaches the dispatcher below autograd
(``torch.utils._python_dispatch``), the ops a GPU would launch as kernels (give or take fusion).
An op *synchronises the host* when the host must wait for the device's result: reading a
value (``aten::_local_scalar_dense``: ``.item()``, ``int()``, ``bool()``), or an output whose
shape depends on data (``nonzero``, ``unique``, ``masked_select``, indexing with a boolean
mask, ``repeat_interleave`` without ``output_size``, ...). On a CPU nothing waits, so these are
recognised by name (:data:`SYNC_OPS`); ``Tensor.tolist`` and ``Tensor.numpy`` do not dispatch
and are counted by wrapping them. Device-to-host copies cannot be told apart on the CPU (every
tensor is on the host) and are not counted. A fresh allocation is an output that the op's
schema does not alias to an input (in-place, ``out=`` and view outputs are not allocations).

The accelerator code path: the layer is built with ``chunk_rows=DEVICE_CHUNK_ROWS`` (its
default on a GPU; ``--chunk-rows`` counts another chunk), which its optimizer and conversions
follow; the rest of the code does not depend on the device type. ``d`` is small (op and sync
counts do not depend on it).

    python benchmarks/step_op_budget.py --insightface /work/insightface \\
        --classes 100000 1000000 10000000 --out benchmarks/results/step_op_budget.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: ops whose result the host must wait for (a value read, or an output shaped by data)
SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::masked_select",
        "aten::equal",
        "aten::bincount",
    }
)
_MASK_INDEXED = frozenset(
    {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
)


_MASKS = (torch.bool, torch.uint8)


def _is_sync(name: str, args, kwargs) -> bool:
    if name in SYNC_OPS:
        return True
    if name in _MASK_INDEXED:  # a boolean mask becomes indices (nonzero) first ...
        indices = [i for i in (args[1] if len(args) > 1 else kwargs.get("indices", ())) or ()]
        masks = [i for i in indices if isinstance(i, torch.Tensor) and i.dtype in _MASKS]
        if not masks:
            return False
        # ... except one mask and one value to write: ATen fills it (masked_fill_, no sync)
        value = args[2] if len(args) > 2 else kwargs.get("values")
        return not (name != "aten::index" and len(indices) == 1 and value.numel() == 1)
    if name == "aten::repeat_interleave":
        return kwargs.get("output_size") is None and isinstance(args[0], torch.Tensor)
    return False


#: ops that only create tensor metadata or allocate (no kernel runs on a device)
_NO_KERNEL = frozenset(
    {"aten::empty", "aten::new_empty", "aten::empty_like", "aten::empty_strided",
     "aten::lift_fresh", "aten::promote_types", "aten::scalar_tensor", "aten::detach"}
)  # fmt: skip


def _launches_kernel(func, name: str) -> bool:
    """False for views (outputs alias an input without writing) and metadata-only ops."""
    if name in _NO_KERNEL or not name.startswith("aten::"):
        return False
    returns = func._schema.returns
    is_view = bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )
    return not is_view


@dataclass
class Tally:
    """What one phase launched."""

    ops: int = 0
    kernels: int = 0
    syncs: int = 0
    allocated_bytes: int = 0
    largest_allocation_bytes: int = 0
    sync_ops: Counter = field(default_factory=Counter)
    op_names: Counter = field(default_factory=Counter)

    def summary(self, top: int = 0) -> dict:
        out = {
            "ops": self.ops,
            "kernels": self.kernels,
            "syncs": self.syncs,
            "allocated_bytes": self.allocated_bytes,
            "largest_allocation_bytes": self.largest_allocation_bytes,
            "sync_ops": dict(self.sync_ops),
        }
        if top:
            out["top_ops"] = dict(self.op_names.most_common(top))
        return out


class OpCounter(TorchDispatchMode):
    """Counts ops, host syncs and freshly allocated bytes into ``self.tally`` (switchable)."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = Tally()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if name.startswith("profiler::"):  # record_function markers (torch.optim), no work
            return out
        t = self.tally
        t.ops += 1
        t.op_names[name] += 1
        if _launches_kernel(func, name):
            t.kernels += 1
        if _is_sync(name, args, kwargs):
            t.syncs += 1
            t.sync_ops[name] += 1
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for ret, value in zip(func._schema.returns, outs, strict=False):
            if ret.alias_info is None and isinstance(value, torch.Tensor):
                size = value.numel() * value.element_size()
                t.allocated_bytes += size
                t.largest_allocation_bytes = max(t.largest_allocation_bytes, size)
        return out

    def host_read(self, what: str) -> None:
        self.tally.syncs += 1
        self.tally.sync_ops[what] += 1


@contextlib.contextmanager
def counting():
    """``OpCounter`` active, with ``Tensor.tolist`` / ``Tensor.numpy`` counted as host reads."""
    counter = OpCounter()
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def wrap(name):
        def read(self, *a, **k):
            counter.host_read(f"Tensor.{name}")
            return originals[name](self, *a, **k)

        return read

    with contextlib.ExitStack() as stack:
        for name in originals:
            stack.enter_context(mock.patch.object(torch.Tensor, name, wrap(name)))
        stack.enter_context(counter)
        yield counter


# ---------------------------------------------------------------------------- the layers
@dataclass
class StepSetup:
    num_classes: int
    batch: int = 512
    dim: int = 16
    rate: float = 0.1
    seed: int = 0
    chunk_rows: int | None = None  # None: the accelerator's default, DEVICE_CHUNK_ROWS


def build_partialfc(setup: StepSetup):
    """(layer, optimizer) as arcface_torch trains: ArcFace, SGD momentum 0.9, wd 5e-4."""
    from partialfc.classifier import PartialFC, RowSparseSGD
    from partialfc.classifier.storage import DEVICE_CHUNK_ROWS
    from partialfc.losses.margins import ArcFaceMargin

    chunk = setup.chunk_rows if setup.chunk_rows is not None else DEVICE_CHUNK_ROWS
    layer = PartialFC(setup.num_classes, setup.dim, ArcFaceMargin(0.5, 64.0),
                      sample_rate=setup.rate, seed=setup.seed, chunk_rows=chunk)  # fmt: skip
    return layer, RowSparseSGD(layer, lr=0.1, momentum=0.9, weight_decay=5e-4)


def find_reference_files(root: Path) -> Path:
    """The directory holding ``partial_fc_v2.py`` and ``losses.py`` under ``root``."""
    for candidate in (root, root / "recognition" / "arcface_torch"):
        if (candidate / "partial_fc_v2.py").is_file() and (candidate / "losses.py").is_file():
            return candidate
    raise SystemExit(f"--insightface {root}: no partial_fc_v2.py and losses.py there")


def _load(directory: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"arcface_torch_{Path(name).stem}",
                                                  directory / name)  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def single_process_group():
    """A gloo group of one process (V2 asserts one exists), torn down on exit."""
    import tempfile

    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def build_v2(setup: StepSetup, reference_dir: Path, fp16: bool = False):
    """(PartialFC_V2, torch SGD), built as ``arcface_torch`` does (needs a process group)."""
    losses = _load(reference_dir, "losses.py")
    v2 = _load(reference_dir, "partial_fc_v2.py")
    torch.manual_seed(setup.seed)
    margin = losses.CombinedMarginLoss(64.0, 1.0, 0.5, 0.0)
    layer = v2.PartialFC_V2(margin, setup.dim, setup.num_classes, setup.rate, fp16=fp16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    return layer, opt


@contextlib.contextmanager
def v2_on_cpu():
    """V2 moves its sampling tensors with ``.cuda()``: the identity on a CPU-only machine."""
    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self):
        yield


def _batch(setup: StepSetup, step: int):
    gen = torch.Generator().manual_seed(1000 * step + setup.seed)
    x = torch.randn(setup.batch, setup.dim, generator=gen)
    y = torch.randint(0, setup.num_classes, (setup.batch,), generator=gen)
    return x, y


def count_steps(layer, opt, setup: StepSetup, steps: int = 3, warmup: int = 1) -> list[dict]:
    """Per-phase tallies of ``steps`` training steps after ``warmup`` uncounted ones."""
    records = []
    for step in range(warmup + steps):
        x, y = _batch(setup, step)
        x.requires_grad_(True)
        if step < warmup:
            layer(x, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            continue
        phases = {}
        with counting() as counter:
            loss = layer(x, y)
            phases["forward"], counter.tally = counter.tally, Tally()
            loss.backward()
            phases["backward"], counter.tally = counter.tally, Tally()
            opt.step()
            opt.zero_grad(set_to_none=True)
            phases["optimizer"] = counter.tally
        total = Tally()
        for t in phases.values():
            total.ops += t.ops
            total.kernels += t.kernels
            total.syncs += t.syncs
            total.allocated_bytes += t.allocated_bytes
            total.largest_allocation_bytes = max(
                total.largest_allocation_bytes, t.largest_allocation_bytes
            )
            total.sync_ops.update(t.sync_ops)
            total.op_names.update(t.op_names)
        records.append(
            {
                "loss": float(loss.detach()),
                "step": total,
                **{k: v for k, v in phases.items()},
            }  # fmt: skip
        )
    return records


def summarise(records: list[dict], top: int = 0) -> dict:
    """The worst step (most ops) and every step's totals."""
    worst = max(records, key=lambda r: (r["step"].ops, r["step"].syncs))
    return {
        "ops": worst["step"].ops,
        "kernels": worst["step"].kernels,
        "syncs": worst["step"].syncs,
        "allocated_bytes": worst["step"].allocated_bytes,
        "largest_allocation_bytes": worst["step"].largest_allocation_bytes,
        "phases": {p: worst[p].summary() for p in ("forward", "backward", "optimizer")},
        "sync_ops": dict(worst["step"].sync_ops),
        "top_ops": dict(worst["step"].op_names.most_common(top)) if top else {},
        "per_step": [
            {
                "ops": r["step"].ops,
                "kernels": r["step"].kernels,
                "syncs": r["step"].syncs,
                "allocated_bytes": r["step"].allocated_bytes,
            }
            for r in records
        ],  # fmt: skip
    }


def measure(layer_name: str, setup: StepSetup, reference_dir: Path | None = None,
            steps: int = 3, top: int = 0) -> dict:  # fmt: skip
    """Counts of one layer at one size (V2 in a gloo group of one process)."""
    if layer_name == "partialfc":
        layer, opt = build_partialfc(setup)
        return summarise(count_steps(layer, opt, setup, steps), top)
    with single_process_group(), v2_on_cpu():
        layer, opt = build_v2(setup, reference_dir)
        return summarise(count_steps(layer, opt, setup, steps), top)


def targets(runs: list[dict]) -> dict:
    """partialfc against V2 per C: host syncs no more than V2's, ops at most 1.5x V2's, and
    the same op count at every C."""
    ours = {r["num_classes"]: r for r in runs if r["layer"] == "partialfc"}
    v2 = {r["num_classes"]: r for r in runs if r["layer"] == "arcface_torch_v2"}
    rows = []
    for c in sorted(set(ours) & set(v2)):
        a, b = ours[c], v2[c]
        rows.append({"num_classes": c, "syncs": a["syncs"], "v2_syncs": b["syncs"],
                     "ops_over_v2": round(a["ops"] / b["ops"], 3),
                     "kernels_over_v2": round(a["kernels"] / b["kernels"], 3),
                     "met": a["syncs"] <= b["syncs"] and a["ops"] <= 1.5 * b["ops"]})  # fmt: skip
    return {"rows": rows, "ops_independent_of_C": len({r["ops"] for r in ours.values()}) == 1}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--insightface", type=Path, default=None,
                        help="local deepinsight/insightface copy (adds PartialFC_V2)")  # fmt: skip
    parser.add_argument("--classes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=512, help="global batch B")
    parser.add_argument("--dim", type=int, default=16, help="d (the counts do not depend on it)")
    parser.add_argument("--rate", type=float, default=0.1, help="sample rate r")
    parser.add_argument("--steps", type=int, default=3, help="counted steps after one warm-up")
    parser.add_argument("--label", default="after", help="key of this run in --out (before/after)")
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="the layer's chunk_rows (default: DEVICE_CHUNK_ROWS, a GPU's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON to update (atomic write)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    layers = ["partialfc"] + (["arcface_torch_v2"] if args.insightface else [])
    reference_dir = find_reference_files(args.insightface.resolve()) if args.insightface else None
    from partialfc.classifier.storage import DEVICE_CHUNK_ROWS

    runs = []
    for num_classes in args.classes:
        setup = StepSetup(num_classes, args.batch, args.dim, args.rate, chunk_rows=args.chunk_rows)
        for layer_name in layers:
            res = measure(layer_name, setup, reference_dir, args.steps, top=12)
            row = {"layer": layer_name, **asdict(setup), **res}
            runs.append(row)
            print(json.dumps({k: row[k] for k in ("layer", "num_classes", "ops", "kernels", "syncs",
                                                  "allocated_bytes", "sync_ops")}),
                  file=sys.stderr, flush=True)  # fmt: skip
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        report = json.loads(args.out.read_text()) if args.out.exists() else {}
        report["benchmark"] = "step_op_budget"
        report["notes"] = (
            "one training step (forward, backward, optimizer step) counted on the CPU with the "
            "accelerator chunk size; ops = ATen ops through the dispatcher (kernels: those that "
            "are neither views nor metadata); syncs = ops that "
            "make the host wait for the device (value reads, data-shaped outputs); allocated = "
            "bytes of fresh op outputs; the worst of the counted steps after one warm-up"
        )
        chunk = args.chunk_rows or DEVICE_CHUNK_ROWS
        report[args.label] = {"device_chunk_rows": chunk, "torch": torch.__version__,
                              "runs": runs, "targets": targets(runs)}  # fmt: skip
        atomic_write_bytes(args.out, (json.dumps(report, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
