"""Memory and communication plan of one rank of a Partial FC run, predicted before it starts.

:func:`plan_run` walks what the layer allocates (:mod:`partialfc.classifier.partial_fc`, its
row tables, buffers and row-sparse optimizers) for a :class:`RunSpec` and returns a
:class:`RunPlan`: every allocation of the largest rank (rank 0 owns ``ceil(C / N)`` classes),
where it lives (``device`` or ``host``), in which phase it is alive, the peak of each memory,
and the bytes each collective moves per step. Nothing is allocated; all numbers are bytes.

Phases: ``init`` (the table is filled in 65536-class chunks of float32 rows), then the step's
``forward``, ``backward`` and ``optimizer``. Reusable buffers keep their memory from the first
step on, so they count in every phase of the step; temporaries that follow one another within a
phase count as the largest of them; the peak of a memory is the largest phase.

Methods:

* ``partialfc``: this layer, row-sparse update (``update="sparse"``; ``RowSparseSGD`` or
  ``RowSparseAdamW``), any storage / compute dtype, device or host storage.
* ``dense``: this layer with ``update="dense"`` and ``torch.optim.SGD`` (comparison only):
  a dense ``C_local x d`` gradient, momentum, and the optimizer's ``grad + wd * w`` copy.
* ``model-parallel``: the full-softmax model parallelism of the Partial FC paper's memory
  analysis (An et al., arXiv 2010.05222, §3.2.2: per rank the float32 weight, its gradient and
  its momentum, ``4 d C / k`` bytes each, plus the logits of the global batch and their
  gradient, ``4 B C / k`` bytes each), for reproducing the paper's figures.

Communication is counted per rank and step as the bytes of each message and the bytes a ring
algorithm puts on each rank's link: ``(N - 1) / N`` of the gathered tensor for an all-gather
or a reduce-scatter, twice that for an all-reduce (NCCL's ring; Patarasuk & Yuan, 2009).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from partialfc.classifier.partial_fc import _INIT_CHUNK_CLASSES
from partialfc.classifier.sampling import sampling_budget
from partialfc.classifier.sharding import class_block
from partialfc.classifier.storage import CHUNK_ROWS, chunk_rows

__all__ = ["RunSpec", "MemoryItem", "Message", "RunPlan", "plan_run", "METHODS", "PHASES"]

METHODS = ("partialfc", "dense", "model-parallel")
PHASES = ("init", "forward", "backward", "optimizer")
STEP = ("forward", "backward", "optimizer")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STORAGE_DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("sgd", "adamw")
GIB = 1 << 30


@dataclass(frozen=True)
class RunSpec:
    """One run, as the plan sees it (names follow :class:`PartialFC`'s arguments).

    Attributes:
        num_classes: C over all ranks. ranks: N. batch_per_rank: b (global batch ``N b``).
        embedding_dim: d. sample_rate: r. num_subcenters: K.
        storage_dtype: of the centers (float32 | bfloat16); state_dtype: of the optimizer
            state (None: the storage dtype, as the row-sparse optimizers default).
        compute_dtype: GEMM operands (float32 | bfloat16 | float16).
        optimizer: sgd | adamw; momentum: SGD momentum (0 keeps no state).
        device: cuda | cpu (chunk size, and which GEMM path low precision takes).
        storage: device | host (``storage_device="cpu"`` next to a GPU).
        method: partialfc | dense | model-parallel (module docstring).
        gemm_path: native | emulated | auto (auto: native on CUDA, emulated on a CPU).
        chunk_rows: the layer's ``chunk_rows`` (None: its default on ``device``).
    """

    num_classes: int
    ranks: int = 1
    batch_per_rank: int = 128
    embedding_dim: int = 512
    sample_rate: float = 0.1
    num_subcenters: int = 1
    storage_dtype: str = "float32"
    state_dtype: str | None = None
    compute_dtype: str = "float32"
    optimizer: str = "sgd"
    momentum: float = 0.9
    device: str = "cuda"
    storage: str = "device"
    method: str = "partialfc"
    gemm_path: str = "auto"
    chunk_rows: int | None = None

    def error(self) -> str | None:
        """What is wrong with the spec (the argument named), or None."""
        positive = ("num_classes", "ranks", "batch_per_rank", "embedding_dim", "num_subcenters")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{name} must be a positive integer, got {value!r}"
        chunk = self.chunk_rows
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            return f"chunk_rows must be a positive integer or None, got {chunk!r}"
        if self.num_classes < self.ranks:
            return f"num_classes={self.num_classes} < ranks={self.ranks}: each rank needs a class"
        if not 0.0 < self.sample_rate <= 1.0:
            return f"sample_rate must be in (0, 1], got {self.sample_rate!r}"
        if not 0.0 <= self.momentum < 1.0:
            return f"momentum must be in [0, 1), got {self.momentum!r}"
        choices = {
            "storage_dtype": STORAGE_DTYPES,
            "compute_dtype": tuple(DTYPE_BYTES),
            "optimizer": OPTIMIZERS,
            "device": ("cuda", "cpu"),
            "storage": ("device", "host"),
            "method": METHODS,
            "gemm_path": ("auto", "native", "emulated"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                return f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
        if self.state_dtype is not None and self.state_dtype not in STORAGE_DTYPES:
            return (
                f"state_dtype must be one of {', '.join(STORAGE_DTYPES)}, got {self.state_dtype!r}"
            )
        if self.compute_dtype == "float16" and self.device == "cpu":
            return "compute_dtype float16 needs device cuda (the layer refuses it on CPUs)"
        if self.method == "dense" and (
            self.storage_dtype != "float32" or self.storage != "device" or self.optimizer != "sgd"
        ):
            return "method dense keeps a float32 table on the device and uses SGD"
        return None

    @property
    def global_batch(self) -> int:
        return self.batch_per_rank * self.ranks

    @property
    def staged(self) -> bool:
        """The table lives in host memory next to a GPU (only active rows cross the bus)."""
        return self.storage == "host" and self.device == "cuda"

    @property
    def chunk(self) -> int:
        """Rows per chunk of the layer: :attr:`chunk_rows`, or the layer's default."""
        return self.chunk_rows if self.chunk_rows is not None else chunk_rows(self.device)

    @property
    def path(self) -> str:
        """GEMM path: ``float32``, ``native`` or ``emulated`` (as the layer chooses it)."""
        if self.compute_dtype == "float32":
            return "float32"
        if self.gemm_path != "auto":
            return self.gemm_path
        return "native" if self.device == "cuda" else "emulated"


@dataclass(frozen=True)
class MemoryItem:
    """One allocation of rank 0: ``bytes`` in ``where`` (device | host), alive in ``phases``;
    ``category`` is one of centers, optimizer_state, active_rows, logits, gradients, gather,
    sampling, init, other. ``persistent``: part of the run's state (centers, optimizer
    state), as opposed to the step's working memory."""

    name: str
    category: str
    bytes: int
    where: str
    phases: tuple[str, ...]
    persistent: bool = False


@dataclass(frozen=True)
class Message:
    """One collective per step: the tensor it moves (``bytes``: the gathered / reduced size)
    and the bytes a ring algorithm sends over each rank's link (``wire_bytes``)."""

    name: str
    op: str
    phase: str
    bytes: int
    wire_bytes: int


@dataclass
class RunPlan:
    """The plan of rank 0 (the largest block): allocations, peaks, messages, fit."""

    spec: RunSpec
    classes_per_rank: int
    active_classes: int
    active_rows: int
    items: list[MemoryItem]
    messages: list[Message]
    bus_bytes_per_step: int  # host <-> device traffic of a staged table, both directions
    gemm_flops_per_step: int
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)  # where -> phase -> bytes

    def peak(self, where: str = "device") -> int:
        """The largest phase of one memory (bytes)."""
        return max(self.peaks.get(where, {}).values(), default=0)

    def by_category(self, where: str = "device", phase: str | None = None) -> dict[str, int]:
        """Bytes per category alive in ``phase`` (default: the peak phase of ``where``)."""
        if phase is None:
            phases = self.peaks.get(where, {})
            phase = max(phases, key=phases.get) if phases else "forward"
        out: dict[str, int] = {}
        for item in self.items:
            if item.where == where and phase in item.phases:
                out[item.category] = out.get(item.category, 0) + item.bytes
        return out

    def state_bytes(self) -> int:
        """Centers and optimizer state of rank 0, wherever they live."""
        return sum(i.bytes for i in self.items if i.persistent)

    def fits(self, device_memory_bytes: int, reserve_bytes: int = 0) -> bool:
        return self.peak("device") + reserve_bytes <= device_memory_bytes

    def to_dict(self) -> dict:
        out = asdict(self)
        out["spec"]["global_batch"] = self.spec.global_batch
        out["peak_bytes"] = {where: self.peak(where) for where in self.peaks}
        out["state_bytes"] = self.state_bytes()
        out["wire_bytes_per_step"] = sum(m.wire_bytes for m in self.messages)
        return out


def plan_run(spec: RunSpec) -> RunPlan:
    """The plan of ``spec`` (``ValueError`` naming the argument when the spec is invalid)."""
    problem = spec.error()
    if problem:
        raise ValueError(problem)
    block = class_block(spec.num_classes, 0, spec.ranks)
    local = block.size
    if spec.method == "model-parallel":
        active = local
    else:
        # positives first: more than the budget when the batch holds more local classes
        active = max(sampling_budget(local, spec.sample_rate), min(spec.global_batch, local))
    n = active * spec.num_subcenters
    build = {"partialfc": _sparse_items, "dense": _dense_items, "model-parallel": _paper_items}
    items, bus = build[spec.method](spec, local, active, n)
    items = [i for i in items if i.bytes > 0]
    plan = RunPlan(
        spec=spec,
        classes_per_rank=local,
        active_classes=active,
        active_rows=n,
        items=items,
        messages=_messages(spec),
        bus_bytes_per_step=bus,
        gemm_flops_per_step=3 * 2 * n * spec.global_batch * spec.embedding_dim,
    )
    for item in items:
        per_phase = plan.peaks.setdefault(item.where, {p: 0 for p in PHASES})
        for phase in item.phases:
            per_phase[phase] += item.bytes
    return plan


# ---------------------------------------------------------------------------- allocations
def _init_chunk_bytes(spec: RunSpec, local: int) -> int:
    """Largest float32 temporary of filling rank 0's table chunk by chunk: the chunk's rows
    (``out``), the whole 65536-class chunk they are cut from (``block``), and the previous
    chunk's rows, still referenced while the next chunk is drawn."""
    k, d, worst, previous = spec.num_subcenters, spec.embedding_dim, 0, 0
    lo = 0
    while lo < local:
        chunk = lo // _INIT_CHUNK_CLASSES
        c1 = min((chunk + 1) * _INIT_CHUNK_CLASSES, spec.num_classes)
        hi = min(c1, local)
        rows = (hi - lo) * k * d * 4
        worst = max(worst, previous + rows + (c1 - chunk * _INIT_CHUNK_CLASSES) * k * d * 4)
        previous, lo = rows, hi
    return worst


def _noise_pool_sizes(spec: RunSpec, n: int, chunk: int) -> set[int]:
    """int32 values of each stochastic-rounding noise pool of bfloat16 writes: one pool per
    distinct write size (a chunk, and the last chunk when it is shorter),
    ``max(2^20, 2^ceil(log2 numel))`` values, kept twice for the process."""
    d, sizes = spec.embedding_dim, set()
    for rows in {min(chunk, n), n % chunk if n > chunk else 0} - {0}:
        numel = rows * d
        sizes.add(max(CHUNK_ROWS * 512, 1 << (numel - 1).bit_length()))
    return sizes


def _gemm_temporaries(spec: RunSpec, n: int, c: int) -> dict[str, int]:
    """Largest operand and product temporaries of the three GEMMs of a low-precision step,
    per phase (float32: none); ``c`` rows a chunk, ``n`` rows in all.

    native: operands converted to the compute dtype; the product comes in float32 (CUDA's
    ``out_dtype``) or in the compute dtype (a CPU's rounded product) and is copied into its
    buffer. emulated: operands rounded through the compute dtype into new float32 tensors (the
    rounded copy is alive while the float32 one is made); no product temporary. The row
    operand of a chunk is made before the previous chunk's is released.
    """
    if spec.path == "float32":
        return {}
    d, big_b = spec.embedding_dim, spec.global_batch
    cb, sb = DTYPE_BYTES[spec.compute_dtype], DTYPE_BYTES[spec.storage_dtype]
    native = spec.path == "native"
    out_bytes = 4 if spec.device == "cuda" else cb  # bytes of a native product

    def operand(numel: int, representable: bool = False) -> tuple[int, int]:
        """(kept, made): bytes of the operand, and the most alive while it is made."""
        if native:
            return numel * cb, numel * cb
        if representable:
            return 0, 0
        return numel * 4, numel * (4 + cb)

    cached = native and sb == 4  # rows converted once into the operand cache (forward)
    rows_exact = spec.compute_dtype == spec.storage_dtype  # a bfloat16 table, bfloat16 GEMMs
    x_kept, x_made = operand(big_b * d)
    w_kept, w_made = (0, 0) if cached else operand(c * d, rows_exact)
    if n > c:  # the next chunk's operand is made while the previous one is still referenced
        w_prev, w_made = w_kept, operand(min(c, n - c) * d, rows_exact)[1] if w_made else 0
    else:
        w_prev = 0
    q_kept, q_made = operand(c * big_b)

    def product(numel: int) -> int:
        return numel * out_bytes if native else 0

    forward = x_kept + max(w_prev + w_made, w_kept + product(c * big_b), x_made - x_kept)
    backward = max(w_prev + w_made, w_kept + max(q_made, q_kept + product(big_b * d)))
    optimizer = max(q_made, q_kept + x_made, q_kept + x_kept + product(c * d))
    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def _common_step_items(
    spec: RunSpec, active: int, n: int, forward_gemm: int = 0
) -> list[MemoryItem]:
    """The gathered batch and the per-step index tensors, alive through the step, and the
    forward's temporaries: the negative draw's index vectors, freed before the score loop
    makes its ``forward_gemm`` bytes of GEMM operands and products (the larger counts)."""
    b, big_b, d = spec.batch_per_rank, spec.global_batch, spec.embedding_dim
    sampling = 6 * active * 8  # int64 draws, unique, sort (about; the draw is random)
    if sampling >= forward_gemm:
        first = ("negative sampling (int64 draws, unique, sort)", "sampling", sampling)
    else:
        first = ("GEMM operands and products (forward)", "active_rows", forward_gemm)
    gather = [
        MemoryItem("normalised local embeddings", "gather", b * d * 4, "device", STEP),
        MemoryItem("gathered labels (int64)", "gather", big_b * 8, "device", STEP),
        MemoryItem("target columns, local rows (int64)", "other", 2 * big_b * 8, "device", STEP),
        MemoryItem(
            "active rows and classes (int64)",
            "other",
            (n + active if spec.num_subcenters > 1 else n) * 8,  # K = 1: the rows are the classes
            "device",
            STEP,
        ),
        MemoryItem("1 / |w| and s / |w| of the active rows", "other", 2 * n * 4, "device", STEP),
        MemoryItem("embedding gradient", "gradients", b * d * 4, "device", ("backward",)),
        MemoryItem(*first, "device", ("forward",)),
    ]
    if spec.ranks > 1:
        padded = spec.ranks * b * d * 4  # blocks of the padded all-gather, then their concat
        gather += [
            MemoryItem("gathered embeddings", "gather", big_b * d * 4, "device", STEP),
            MemoryItem("all-gather blocks", "gather", padded, "device", ("forward",)),
            MemoryItem(
                "embedding gradient of the global batch (all-reduce)",
                "gradients",
                big_b * d * 4,
                "device",
                ("backward",),
            ),
        ]
    return gather


def _sparse_items(spec: RunSpec, local: int, active: int, n: int):
    d, big_b, k = spec.embedding_dim, spec.global_batch, spec.num_subcenters
    rows = local * k
    sb = DTYPE_BYTES[spec.storage_dtype]
    state_dtype = spec.state_dtype or spec.storage_dtype
    stb = DTYPE_BYTES[state_dtype]
    cb = DTYPE_BYTES[spec.compute_dtype]
    chunk = spec.chunk
    c = min(chunk, n)
    store = "host" if spec.staged else "device"
    tables = (
        0
        if spec.optimizer == "sgd" and spec.momentum == 0
        else (1 if spec.optimizer == "sgd" else 2)
    )
    init_where = "host" if spec.device == "cuda" else "device"
    items = [
        MemoryItem("centers", "centers", rows * d * sb, store, PHASES, True),
        MemoryItem(
            "table fill: float32 init chunk",
            "init",
            _init_chunk_bytes(spec, local),
            init_where,
            ("init",),
        ),
        MemoryItem(
            f"optimizer state ({tables} tables, {state_dtype})",
            "optimizer_state",
            tables * rows * d * stb,
            store,
            STEP,
            True,
        ),
    ]
    if spec.optimizer == "adamw":
        items.append(
            MemoryItem(
                "AdamW per-row step counts (int32)", "optimizer_state", rows * 4, store, STEP, True
            )
        )
    items.append(
        MemoryItem(
            "scores / softmax gradient (n x B, float32, in place)",
            "logits",
            n * big_b * 4,
            "device",
            STEP,
        )
    )
    if k > 1:  # max over sub-centers: a fresh (n/K, B) score block and its int64 argmax
        items.append(
            MemoryItem(
                "max over sub-centers (values + argmax)",
                "logits",
                active * big_b * 12,
                "device",
                ("forward", "backward"),
            )
        )
    if spec.staged:
        items.append(
            MemoryItem(
                "device copy of the active rows (float32)", "active_rows", n * d * 4, "device", STEP
            )
        )
    else:
        items += [
            MemoryItem("row chunk (float32)", "active_rows", c * d * 4, "device", STEP),
            MemoryItem("optimizer row chunk (float32)", "active_rows", c * d * 4, "device", STEP),
        ]
    if spec.staged or sb != 4:
        items.append(
            MemoryItem("staging chunk of the centers", "active_rows", c * d * sb, store, STEP)
        )
    native_cache = spec.path == "native" and sb == 4
    if native_cache:
        items.append(
            MemoryItem(
                f"active rows as GEMM operands ({spec.compute_dtype})",
                "active_rows",
                n * d * cb,
                "device",
                STEP,
            )
        )
    items.append(MemoryItem("center gradient chunk", "gradients", c * d * 4, "device", STEP))
    items.append(
        MemoryItem(
            "optimizer state chunks (float32)",
            "optimizer_state",
            tables * c * d * 4,
            "device",
            STEP,
        )
    )
    if spec.staged or stb != 4:
        items.append(
            MemoryItem(
                "optimizer state staging chunks",
                "optimizer_state",
                tables * c * d * stb,
                store,
                STEP,
            )
        )
    items.append(
        MemoryItem(
            "radial pass of the center gradient (m x (d + 2), float32)",
            "gradients",
            c * (d + 2) * 4,
            "device",
            STEP,
        )
    )
    # the optimizer phase's temporaries come one after the other (the center gradient's GEMM,
    # AdamW's update, the bfloat16 writes), so the largest of them counts
    optimizer_temporaries = {"GEMM operands of the center gradient": 0, "AdamW": 0, "bf16": 0}
    rounded_writes = sb == 2 or (tables and stb == 2)
    pools = _noise_pool_sizes(spec, n, chunk) if rounded_writes else set()
    if pools:
        items.append(
            MemoryItem(
                "stochastic-rounding noise pools",
                "other",
                sum(2 * size * 4 for size in pools),
                "device",
                STEP,
            )
        )
        # a write rounds its chunk into a new bfloat16 tensor; a pool is drawn (int32) and
        # doubled on the host the first time its size is written, then moved to the device
        draw = max(pools) * 4
        rounding = c * d * 2
        if spec.device == "cuda":
            items.append(
                MemoryItem(
                    "noise pool draw (first write of a size)",
                    "other",
                    3 * draw,
                    "host",
                    ("optimizer",),
                )
            )
        else:
            rounding = max(rounding, draw)
        optimizer_temporaries["bf16"] = rounding
    gemm = _gemm_temporaries(spec, n, c)
    items += _common_step_items(spec, active, n, gemm.get("forward", 0))
    if gemm:
        items.append(
            MemoryItem(
                "GEMM operands and products (backward)",
                "active_rows",
                gemm["backward"],
                "device",
                ("backward",),
            )
        )
    optimizer_temporaries["GEMM operands of the center gradient"] = gemm.get("optimizer", 0)
    if spec.optimizer == "adamw":  # sqrt(v), its quotient, then the quotient and m / (1 - b1^t)
        optimizer_temporaries["AdamW"] = 2 * c * d * 4
    largest = max(optimizer_temporaries, key=optimizer_temporaries.get)
    names = {"bf16": "bfloat16 rounding of a written chunk", "AdamW": "AdamW chunk temporaries"}
    items.append(
        MemoryItem(
            names.get(largest, largest),
            {"AdamW": "optimizer_state", "bf16": "other"}.get(largest, "gradients"),
            optimizer_temporaries[largest],
            "device",
            ("optimizer",),
        )
    )
    bus = 0
    if spec.staged:  # the rows and their state cross the bus both ways, in their own dtypes
        bus = 2 * n * d * (sb + tables * stb) + 2 * n * 8
    return items, bus


def _dense_items(spec: RunSpec, local: int, active: int, n: int):
    d, big_b, rows = spec.embedding_dim, spec.global_batch, local * spec.num_subcenters
    table = rows * d * 4
    init_where = "host" if spec.device == "cuda" else "device"
    items = [
        MemoryItem("centers (nn.Parameter)", "centers", table, "device", PHASES, True),
        MemoryItem(
            "table fill: float32 init chunk",
            "init",
            _init_chunk_bytes(spec, local),
            init_where,
            ("init",),
        ),
        MemoryItem(
            "SGD momentum", "optimizer_state", table if spec.momentum else 0, "device", STEP, True
        ),
        MemoryItem("scores / softmax gradient (n x B)", "logits", n * big_b * 4, "device", STEP),
        MemoryItem(
            "active rows (index_select)",
            "active_rows",
            n * d * 4,
            "device",
            ("forward", "backward"),
        ),
        MemoryItem("active-row gradient", "gradients", n * d * 4, "device", ("backward",)),
        MemoryItem(
            "radial pass of a gradient chunk (vecdot's product)",
            "gradients",
            min(spec.chunk, n) * d * 4,
            "device",
            ("backward",),
        ),
        # index_select's backward scatters into a dense gradient once the softmax's saved
        # rows are freed, so it peaks with the optimizer's copy, not with the active rows
        MemoryItem("dense center gradient", "gradients", table, "device", ("optimizer",)),
        MemoryItem("SGD grad + weight_decay * w", "gradients", table, "device", ("optimizer",)),
    ]
    return items + _common_step_items(spec, active, n), 0


def _paper_items(spec: RunSpec, local: int, active: int, n: int):
    """The paper's accounting: float32 weight, gradient, momentum; logits and their gradient."""
    d, big_b, rows = spec.embedding_dim, spec.global_batch, local * spec.num_subcenters
    tables = (
        0
        if spec.optimizer == "sgd" and spec.momentum == 0
        else (1 if spec.optimizer == "sgd" else 2)
    )
    both = ("forward", "backward", "optimizer")
    items = [
        MemoryItem("weight (float32)", "centers", rows * d * 4, "device", PHASES, True),
        MemoryItem("weight gradient", "gradients", rows * d * 4, "device", both),
        MemoryItem(
            "optimizer state", "optimizer_state", tables * rows * d * 4, "device", both, True
        ),
        MemoryItem("logits (B x C_local, float32)", "logits", big_b * rows * 4, "device", both),
        MemoryItem("logit gradient", "logits", big_b * rows * 4, "device", both),
        MemoryItem("gathered embeddings", "gather", big_b * d * 4, "device", both),
    ]
    return items, 0


# ---------------------------------------------------------------------------- communication
def _messages(spec: RunSpec) -> list[Message]:
    world, big_b, d = spec.ranks, spec.global_batch, spec.embedding_dim
    if world == 1:
        return []
    share = (world - 1) / world

    def gather(name, phase, size):
        return Message(name, "all_gather", phase, size, math.ceil(share * size))

    def reduce(name, phase, size):
        return Message(name, "all_reduce", phase, size, math.ceil(2 * share * size))

    if spec.method == "model-parallel":
        return [
            gather("embeddings", "forward", big_b * d * 4),
            gather("labels", "forward", big_b * 8),
            reduce("row max of the logits", "forward", big_b * 4),
            reduce("sum of exp", "forward", big_b * 4),
            Message(
                "embedding gradient",
                "reduce_scatter",
                "backward",
                big_b * d * 4,
                math.ceil(share * big_b * d * 4),
            ),
        ]
    return [
        gather("batch sizes and validity flags (int64)", "forward", world * 2 * 8),
        gather("embeddings (padded to the largest batch)", "forward", big_b * d * 4),
        gather("labels (int64)", "forward", big_b * 8),
        reduce("row max of the logits", "forward", big_b * 4),
        reduce("sum of exp and target logit", "forward", 2 * big_b * 4),
        reduce("embedding gradient of the global batch", "backward", big_b * d * 4),
    ]


def gib(value: int) -> float:
    """Bytes as GiB (2^30 bytes)."""
    return value / GIB
