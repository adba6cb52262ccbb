"""Partial FC: a class-sharded, negative-sampled margin-softmax classifier (Partial FC, An et
al., arXiv 2010.05222 and CVPR 2022).

Per step, on every rank (``N`` ranks, global batch ``B = sum_r b_r``):

1. check the local input's shapes and dtypes, then (several ranks) all-gather ``[b_r, ok_r]``:
   every rank knows every batch size and whether any rank's input is malformed (then *all*
   ranks raise) before moving data;
2. all-gather the L2-normalised embeddings (autograd-aware) and the labels; the host reads
   three counts of the global labels at once (labels outside ``[0, C)``: all ranks raise;
   local positives; local rows), the step's one read besides the negative draw's;
3. active classes of this rank's block ``[start, stop)``: every local class that is a label in
   the global batch, plus uniformly sampled local negatives up to ``ceil(r * C_local)``;
   with sub-centers all ``K`` rows of an active class are active;
4. ``cos = x_hat @ w_hat^T`` on the active rows only, max over sub-centers, the margin from
   :mod:`partialfc.losses.margins` on the target column (the same code as the dense head);
5. PFC* (optional): negatives with ``cos > negative_cos_threshold`` are dropped from the
   softmax (no gradient, not in the denominator);
6. exact softmax over the union of all ranks' active sets without gathering logits:
   ``m_i = max_r max_j z_ij`` (all-reduce MAX), ``S_i = sum_r sum_j exp(z_ij - m_i)``
   (all-reduce SUM) and the target logit ``t_i`` (all-reduce SUM, one rank contributes);
   ``loss = (1/B) sum_i [log S_i + m_i - t_i]``, identical on every rank.

Compute precision (``compute_dtype``): the three GEMMs of the active rows (scores, embedding
gradient, center gradient) take float32, bfloat16 or float16 operands with float32
accumulation (:mod:`partialfc.losses.gemm_precision`); norms, margin, max, ``exp``, sums,
``log``, the loss and the optimizer are float32 in every precision, and the storage dtype is an
independent choice.

Gradients. Centers: ``d loss / d w`` of the global-mean loss, exact, rank-local (no
communication). Embeddings: the all-gather's backward sums the per-rank partials, so rank k
receives ``d loss / d x_i`` for its own rows. The backbone is data-parallel and its gradient
must be combined across ranks; with ``backbone_grad_reduction="mean"`` (default, matching
DistributedDataParallel, which *averages* gradients) the embedding gradient is multiplied by
``N``, so the averaged backbone gradient equals the gradient of a single process running the
concatenated global batch. Use ``"sum"`` if backbone gradients are summed across ranks.

Centers are updated only where they were active (the paper's semantics): forward records the
active rows (:class:`ActiveRows`), backward fills their gradient, and a row-sparse optimizer
(:mod:`partialfc.classifier.optim`) consumes the record in ``step()``. ``update="dense"``
instead exposes the whole block as an ``nn.Parameter`` with a dense gradient for a standard
torch optimizer (every row then moves under momentum and weight decay; for comparison only).

Gradient accumulation (:meth:`PartialFC.prepare_step`): an optimizer step may consume several
micro-batches. The negative sample is then drawn once per optimizer step, from the union of the
positives of all its micro-batches, and every micro-batch's forward uses that same active set;
the center gradients of the micro-batches add up in the record. A step of k micro-batches of b
is therefore exactly one step of one batch of k·b (the per-sample losses, the softmax over the
same active rows, the summed gradients), once the caller weights each micro-batch's loss by its
share of the samples.

Batches: per-rank batch sizes may differ and a rank may have an empty batch (e.g. the end of
an epoch); a globally empty batch is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from partialfc.autograd import scale_gradient
from partialfc.classifier.checkpoint import (
    gather_full_centers,
    load_partial_fc_checkpoint,
    save_partial_fc_checkpoint,
)
from partialfc.classifier.collectives import (
    all_gather_rows,
    all_gather_rows_no_grad,
    all_gather_sizes,
    all_reduce_max,
    world_info,
)
from partialfc.classifier.diagnostics import partial_fc_diagnostics
from partialfc.classifier.optim import RowSparseAdamW, RowSparseSGD
from partialfc.classifier.sampling import (
    sample_active_classes,
    sampling_budget,
    sampling_generator,
)
from partialfc.classifier.sharding import class_block
from partialfc.classifier.storage import (
    SUPPORTED_DTYPES,
    ReusableBuffer,
    RowTable,
    resolve_chunk_rows,
)
from partialfc.losses.contract import Head, OptimizerSettings
from partialfc.losses.gemm_precision import GemmPrecision, gemm_precision
from partialfc.losses.margins import CombinedMargin
from partialfc.losses.subcenter import max_over_subcenters
from partialfc.losses.validation import embeddings_and_labels_error

__all__ = ["PartialFC", "ActiveRows", "init_center_rows"]

_INIT_CHUNK_CLASSES = 1 << 16


def init_center_rows(
    num_classes: int,
    embedding_dim: int,
    num_subcenters: int,
    seed: int,
    class_start: int,
    class_stop: int,
    std: float = 0.01,
) -> Tensor:
    """Initial centers ``N(0, std^2)`` of classes ``[class_start, class_stop)``, float32.

    Rows are drawn in fixed chunks of 65536 classes, each from its own generator, so the table
    is the same for any number of ranks (and any block can be built without the others).
    """
    k, d = num_subcenters, embedding_dim
    out = torch.empty((class_stop - class_start) * k, d)
    first_chunk = class_start // _INIT_CHUNK_CLASSES
    last_chunk = max(class_stop - 1, class_start) // _INIT_CHUNK_CLASSES
    for chunk in range(first_chunk, last_chunk + 1):
        c0 = chunk * _INIT_CHUNK_CLASSES
        c1 = min(c0 + _INIT_CHUNK_CLASSES, num_classes)
        lo, hi = max(c0, class_start), min(c1, class_stop)
        if lo >= hi:
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + chunk)
        block = torch.randn((c1 - c0) * k, d, generator=gen).mul_(std)
        out[(lo - class_start) * k : (hi - class_start) * k] = block[(lo - c0) * k : (hi - c0) * k]
    return out


@dataclass
class ActiveRows:
    """The rows one forward used, handed from :class:`PartialFC` to a row-sparse optimizer.

    The center gradient is not stored as an ``(n, d)`` tensor: backward keeps the ``(n, B)``
    coefficients ``q_ji = d loss / d (w_j . x_i)`` (the softmax buffer, reused in place), and
    :meth:`center_grad` rebuilds ``d loss / d w_j`` for any chunk of rows with one GEMM. With
    ``B <= d`` that is less memory than a gradient, and no float32 copy of the active rows
    exists at any time (the optimizer reads, updates and writes them a chunk at a time).

    Attributes:
        step: sampling step that produced them.
        rows: ``(n,)`` sorted row indices into the local center table (class-major sub-centers).
        table: the center table the rows were read from (unchanged until the optimizer step).
        embeddings: ``(B, d)`` the normalised global batch as used in forward.
        coefficients: ``(n, B)`` ``d loss / d (w_j . x_i)``; valid once ``grad_ready`` is True.
        inv_norm: ``(n,)`` ``1 / |w_j|`` as used in forward.
        weight_cache: ``(n, d)`` float32 rows on the compute device when the table lives
            elsewhere (host storage next to a GPU): they cross the bus once per step, and the
            device, not the host, holds the working copy. None otherwise.
        precision: operand precision of the center-gradient GEMM (the layer's).
        grad_sum: ``(n, d)`` ``sum q x`` of the earlier micro-batches of an accumulated step
            (their coefficients folded before the next forward reuses the buffer); None for a
            step of one batch.
    """

    step: int
    rows: Tensor
    table: RowTable
    weight_cache: Tensor | None = None
    precision: GemmPrecision | None = None
    embeddings: Tensor | None = None
    coefficients: Tensor | None = None
    inv_norm: Tensor | None = None
    grad_ready: bool = False
    grad_sum: Tensor | None = None

    def fold(self) -> ActiveRows:
        """A record of the same rows for the next micro-batch of this step, carrying
        ``grad_sum + q x`` of this one (computed now, before the score buffer is reused)."""
        if not self.grad_ready:
            raise RuntimeError("PartialFC: backward the micro-batch before the next forward")
        if self.precision is not None and not self.precision.is_float32:
            partial = self.precision.mm(self.coefficients, self.embeddings)
        else:
            partial = torch.mm(self.coefficients, self.embeddings)
        if self.grad_sum is not None:
            partial.add_(self.grad_sum)
        return ActiveRows(
            self.step,
            self.rows,
            self.table,
            self.weight_cache,
            precision=self.precision,
            grad_sum=partial,
        )

    def read_weight(self, start: int = 0, stop: int | None = None, out=None) -> Tensor:
        """Float32 values of ``rows[start:stop]`` (exactly those used in forward)."""
        if self.weight_cache is not None:
            return self.weight_cache[start:stop]
        return self.table.read(self.rows[start:stop], out)

    def center_grad(
        self,
        start: int = 0,
        stop: int | None = None,
        weight: Tensor | None = None,
        out=None,
        weight_decay: float = 0.0,
        scratch: ReusableBuffer | None = None,
    ) -> Tensor:
        """``d loss / d w + weight_decay * w`` of ``rows[start:stop]`` (float32 ``(m, d)``).

        ``weight`` (from :meth:`read_weight`) saves a second read when the caller has it;
        ``out`` is a tensor or :class:`ReusableBuffer`; ``weight_decay`` folds a coupled L2
        term into the same pass (0 by default: the plain gradient); ``scratch`` holds the
        temporaries (else they are allocated).
        """
        if not self.grad_ready:
            raise RuntimeError("PartialFC: center gradients need loss.backward() first")
        if weight is None:
            weight = self.read_weight(start, stop)
        stop = self.rows.numel() if stop is None else min(stop, self.rows.numel())
        q, inv = self.coefficients[start:stop], self.inv_norm[start:stop]
        earlier = self.grad_sum[start:stop] if self.grad_sum is not None else None
        return _center_grad_rows(
            q, self.embeddings, weight, inv, out, weight_decay, self.precision, earlier, scratch
        )


def _center_grad_rows(
    q: Tensor,
    x: Tensor,
    w: Tensor,
    inv_norm: Tensor,
    out=None,
    weight_decay: float = 0.0,
    precision: GemmPrecision | None = None,
    earlier: Tensor | None = None,
    scratch: ReusableBuffer | None = None,
) -> Tensor:
    """``d loss / d w_j = inv_j (G_j - (G_j . u_j) u_j)``, plus ``weight_decay * w_j``.

    ``q`` (m, B) holds ``d loss / d (w_j . x_i)`` (``inv_j`` already applied), so
    ``g_j = sum_i q_ji x_i`` (one GEMM, with ``precision``'s operands) is ``inv_j G_j``, and
    one more float32 pass removes the radial part and adds the L2 term:
    ``g_j += w_j (weight_decay - (g_j . w_j) inv_j^2)``. ``earlier`` (m, d) is ``sum q x`` of
    the earlier micro-batches of an accumulated step (the radial part is linear in ``g``, so it
    is removed once from the sum). ``scratch`` holds the ``(m, d)`` product and two ``(m,)``
    vectors of the radial pass (the same operations as ``vecdot``, into reused memory).
    """
    g = out.get(*w.shape) if isinstance(out, ReusableBuffer) else out
    if precision is not None and not precision.is_float32:
        g = precision.mm(q, x, out=g)
    else:
        g = torch.mm(q, x, out=g) if g is not None else torch.mm(q, x)
    if earlier is not None:
        g.add_(earlier)
    if scratch is None:
        along = torch.linalg.vecdot(g, w).mul_(inv_norm * inv_norm)
    else:
        m, d = w.shape
        space = scratch.get(1, m * (d + 2))[0]
        product, along, inv_sq = space[: m * d].view(m, d), space[m * d : -m], space[-m:]
        torch.sum(torch.mul(g, w, out=product), dim=1, out=along)
        along.mul_(torch.mul(inv_norm, inv_norm, out=inv_sq))
    return g.addcmul_(w, along.neg_().add_(weight_decay).unsqueeze(1))


class _ShardedMarginSoftmax(torch.autograd.Function):
    """Per-row loss ``log S_i + m_i - t_i`` of the exact softmax over all ranks' active rows.

    The scores are kept transposed, ``(n, B)``, in one reused buffer, so that every chunk of
    ``plan.chunk_rows`` active rows (the layer's ``chunk_rows``) is read (from the table,
    converted to float32) into a small buffer and meets the batch in one GEMM writing a
    contiguous block: ``z = s * (w x^T) / |w|``.
    Then the margin on the B target entries (the margin module itself on a ``(B, 1)`` slice: its
    non-target output is ``s * cos`` by contract), PFC* masking, all-reduced max over classes,
    ``exp`` in place, all-reduced sum. Backward rebuilds ``d loss / d cos`` in the same buffer
    (``s p_ji g_i``; ``(p_ti - 1) g_i f'(cos_ti)`` at the target), scales row ``j`` by
    ``inv_j`` and, chunk by chunk, re-reads the rows for ``dL/dx += q_chunk^T w_chunk``. The
    center gradient is left to :meth:`ActiveRows.center_grad` (sparse mode) or computed here
    (dense mode, where ``w`` is an autograd input). In sparse mode ``w`` is None and
    ``center_anchor`` (a zero-size leaf requiring grad) keeps the graph alive.
    """

    @staticmethod
    def forward(ctx, x, w, center_anchor, plan):
        k, n, batch = plan.num_subcenters, plan.rows.numel(), x.shape[0]
        scale = float(plan.margin.scale)
        inv_norm, scaled_inv = plan.inv_norm_buffer.get(2, n)  # 1 / |w_j| and s / |w_j|
        scores = plan.scores_buffer.get(n, batch)
        step = plan.chunk_rows
        prec = plan.precision
        x_t = prec.operand(x).t()  # (d, B) GEMM operand, rounded once per step
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            wc = plan.read_rows(lo, hi) if w is None else w[lo:hi]
            inv = torch.linalg.vector_norm(wc, dim=1, out=inv_norm[lo:hi])
            inv.clamp_min_(1e-12).reciprocal_()
            if plan.operand_rows is not None:  # converted once, read again by backward
                w_op = plan.operand_rows[lo:hi].copy_(wc)
            else:
                w_op = prec.operand(wc, representable=w is None and plan.rows_representable)
            prec.mm(w_op, x_t, out=scores[lo:hi], rounded=True)
            scores[lo:hi].mul_(torch.mul(inv, scale, out=scaled_inv[lo:hi]).unsqueeze(1))
        z, argmax = scores, None
        if k > 1:
            z, argmax = max_over_subcenters(scores, k, class_dim=0)  # (n/K, B), fresh tensor
        rows, col = plan.local_rows, plan.target_col
        with torch.enable_grad():
            target_cos = (z[col, rows] / scale).detach().requires_grad_(True)
            target_logit = plan.margin.scaled_target_logit(target_cos)
        if plan.negative_cos_threshold is not None:
            limit = plan.negative_cos_threshold * scale
            for lo in range(0, z.shape[0], step):  # bounded mask temporary
                block = z[lo : lo + step]
                block.masked_fill_(block > limit, -math.inf)
        target_value = target_logit.detach()
        z[col, rows] = target_value
        col_max = all_reduce_max(z.amax(dim=0), plan.process_group)  # amax: no indices
        exp = z.sub_(col_max.unsqueeze(0)).exp_()  # in place: the buffer now holds exp
        sum_exp = exp.sum(dim=0)
        target = torch.zeros_like(sum_exp)
        target[rows] = target_value
        if plan.world_size > 1:
            stacked = torch.stack([sum_exp, target])
            dist.all_reduce(stacked, group=plan.process_group)
            sum_exp, target = stacked[0], stacked[1]
        ctx.save_for_backward(x, w, inv_norm, sum_exp)
        ctx.exp, ctx.argmax, ctx.plan = exp, argmax, plan
        ctx.target_cos, ctx.target_logit, ctx.generation = target_cos, target_logit, plan.generation
        return torch.log(sum_exp) + col_max - target

    @staticmethod
    def backward(ctx, grad_rows):
        plan = ctx.plan
        if plan.owner.generation != ctx.generation:
            raise RuntimeError(
                "PartialFC: backward through a stale forward (another forward reused the "
                "score buffer); call backward before the next forward"
            )
        x, w, inv_norm, sum_exp = ctx.saved_tensors
        scale = float(plan.margin.scale)
        rows, col = plan.local_rows, plan.target_col
        q = ctx.exp  # (n/K, B) exp(z - m), becomes dL/dcos in place
        coef = grad_rows / sum_exp
        p_target = q[col, rows] * coef[rows]  # g_i * p_it
        q.mul_((coef * scale).unsqueeze(0))  # s * g_i * p_ji
        (d_target_cos,) = torch.autograd.grad(
            ctx.target_logit, ctx.target_cos, p_target - grad_rows[rows]
        )
        q[col, rows] = d_target_cos
        n = plan.rows.numel()
        if ctx.argmax is not None:  # route each class's gradient to its winning sub-center
            k = plan.num_subcenters
            full = plan.scores_buffer.get(n, q.shape[1]).zero_()
            full.view(n // k, k, -1).scatter_(1, ctx.argmax.unsqueeze(1), q.unsqueeze(1))
            q = full
        grad_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(w) if w is not None else None
        step = plan.chunk_rows
        prec = plan.precision
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            qc = q[lo:hi].mul_(inv_norm[lo:hi].unsqueeze(1))  # dL/d(w_j . x_i)
            if grad_x is None and grad_w is None:
                continue
            if grad_w is None and plan.operand_rows is not None:  # the rows forward used
                prec.addmm_(grad_x, prec.operand(qc).t(), plan.operand_rows[lo:hi], rounded=True)
                continue
            wc = plan.read_rows(lo, hi) if w is None else w[lo:hi]
            if grad_x is not None:
                w_op = prec.operand(wc, representable=w is None and plan.rows_representable)
                prec.addmm_(grad_x, prec.operand(qc).t(), w_op, rounded=True)
            if grad_w is not None:
                _center_grad_rows(qc, x, wc, inv_norm[lo:hi], grad_w[lo:hi], precision=prec)
        ctx.exp = ctx.argmax = None
        record = plan.record
        if record is not None:
            record.embeddings, record.coefficients, record.inv_norm = x.detach(), q, inv_norm
            record.grad_ready = True
        return grad_x, grad_w, None, None


@dataclass
class _StepPlan:
    """Everything one forward decided, passed into the fused softmax."""

    owner: PartialFC
    generation: int
    margin: CombinedMargin
    num_subcenters: int
    negative_cos_threshold: float | None
    local_rows: Tensor  # ascending global-batch rows whose class is in this rank's block
    target_col: Tensor  # column of each local row's class among the active classes
    rows: Tensor  # (n,) active rows of the local table
    read_rows: object  # (lo, hi) -> float32 rows[lo:hi] (sparse mode)
    scores_buffer: ReusableBuffer
    inv_norm_buffer: ReusableBuffer  # (2, n): 1 / |w_j| (kept for backward and the step), s / |w_j|
    chunk_rows: int
    precision: GemmPrecision
    rows_representable: bool  # stored rows are exact in the compute dtype (no rounding pass)
    operand_rows: Tensor | None  # (n, d) compute-dtype operands kept for backward, or None
    record: ActiveRows | None
    process_group: object
    world_size: int


class PartialFC(Head):
    """Class-sharded, sampled margin-softmax over ``num_classes`` centers (see module docstring).

    Args:
        num_classes: C, total number of classes over all ranks (>= world size).
        embedding_dim: d.
        margin: a :class:`~partialfc.losses.margins.CombinedMargin` (ArcFace, CosFace, ...).
        sample_rate: r in (0, 1]; each rank keeps ``ceil(r * C_local)`` active classes per step
            (more if the batch holds more local positives). Default 1.0 (exact softmax).
        num_subcenters: K sub-centers per class (class-major rows). Default 1.
        negative_cos_threshold: PFC*; drop negatives with cosine above it. Default None (off);
            the paper uses 0.4.
        update: ``"sparse"`` (default; use :class:`RowSparseSGD` / :class:`RowSparseAdamW`)
            or ``"dense"`` (``self.weight`` is an ``nn.Parameter``; any torch optimizer).
        storage_dtype: float32 (default) or bfloat16 centers (sparse mode); math is float32.
        compute_dtype: operand precision of the three GEMMs of the active rows: ``"float32"``
            (default), ``"bfloat16"`` or ``"float16"`` (GPU only), float32 accumulation; a
            torch dtype is accepted too. Everything else stays float32.
        gemm_path: ``"auto"`` (default: the native low-precision GEMM on CUDA and on CPUs with
            bfloat16 units, else float32 GEMMs of rounded operands), ``"native"`` or
            ``"emulated"``; the choice is :attr:`precision` (see
            :mod:`partialfc.losses.gemm_precision`).
        device: compute device (default CPU).
        storage_device: where the table lives (default ``device``); e.g. ``"cpu"`` with a CUDA
            ``device`` keeps the table in (pinned) host memory and moves only active rows.
        backbone_grad_reduction: ``"mean"`` (default, DDP) or ``"sum"``; see module docstring.
        seed: seeds the initial centers and the sampling (with step and rank).
        init_std: standard deviation of the initial centers. Default 0.01.
        process_group: torch.distributed group (default: the world, or none).
        chunk_rows: active rows the step walks at a time (forward, backward, the row-sparse
            optimizers, compact-dtype conversions, diagnostics). None (default): 2048 on CPUs
            (a chunk stays in the last-level cache), 2^20 on accelerators (one chunk holds every
            active row of a rank up to 2^20, so a step launches the same ops at any class
            count). The trade-off: a step launches ops per chunk, ``ceil(n / chunk_rows)``
            chunks of ``n`` active rows, and keeps about ``5 * min(chunk_rows, n) * d * 4`` bytes
            of float32 chunk scratch (rows, gradient, optimizer rows and state). Results do not
            depend on it beyond float summation order.

    ``forward(local_embeddings (b, d), local_labels (b,)) -> loss`` (scalar, global-batch mean).
    Note: ``.to()`` does not move the table; choose ``device`` / ``storage_device`` up front.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: CombinedMargin,
        sample_rate: float = 1.0,
        num_subcenters: int = 1,
        negative_cos_threshold: float | None = None,
        update: str = "sparse",
        storage_dtype: torch.dtype = torch.float32,
        compute_dtype="float32",
        gemm_path: str = "auto",
        device=None,
        storage_device=None,
        backbone_grad_reduction: str = "mean",
        seed: int = 0,
        init_std: float = 0.01,
        process_group=None,
        chunk_rows: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(margin, CombinedMargin):
            raise ValueError(f"margin must be a CombinedMargin, got {type(margin).__name__}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        if not isinstance(embedding_dim, int) or embedding_dim < 1:
            raise ValueError(f"embedding_dim must be a positive int, got {embedding_dim!r}")
        if not isinstance(num_subcenters, int) or num_subcenters < 1:
            raise ValueError(f"num_subcenters must be an int >= 1, got {num_subcenters!r}")
        if not (isinstance(sample_rate, (int, float)) and 0.0 < sample_rate <= 1.0):
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if negative_cos_threshold is not None and not -1.0 <= negative_cos_threshold <= 1.0:
            raise ValueError(
                f"negative_cos_threshold must be in [-1, 1] or None, got {negative_cos_threshold}"
            )
        if update not in ("sparse", "dense"):
            raise ValueError(f'update must be "sparse" or "dense", got {update!r}')
        if backbone_grad_reduction not in ("mean", "sum"):
            raise ValueError(
                f'backbone_grad_reduction must be "mean" or "sum", got {backbone_grad_reduction!r}'
            )
        if storage_dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"storage_dtype must be one of {SUPPORTED_DTYPES}, got {storage_dtype}"
            )
        device = torch.device(device if device is not None else "cpu")
        chunk_rows = resolve_chunk_rows(chunk_rows, device)
        precision = gemm_precision(compute_dtype, device, gemm_path)
        if update == "dense" and (storage_dtype != torch.float32 or storage_device is not None):
            raise ValueError('update="dense" keeps a float32 table on the compute device')

        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.margin = margin
        self.sample_rate = float(sample_rate)
        self.num_subcenters = num_subcenters
        self.negative_cos_threshold = negative_cos_threshold
        self.update = update
        self.storage_dtype = storage_dtype
        self.precision = precision  # the GEMM operand precision and the path that runs it
        self.backbone_grad_reduction = backbone_grad_reduction
        self.seed = int(seed)
        self.process_group = process_group
        self.device = device
        self.storage_device = torch.device(storage_device) if storage_device else self.device
        self.chunk_rows = chunk_rows  # rows per chunk of every walk over the active rows

        self.rank, self.world_size = world_info(process_group)
        self.block = class_block(num_classes, self.rank, self.world_size)
        self.budget = sampling_budget(self.block.size, self.sample_rate)
        self.sampling_step = 0

        rows, k = self.block.size * num_subcenters, num_subcenters
        if update == "dense":
            self.weight = nn.Parameter(torch.empty(rows, embedding_dim, device=self.device))
            self.centers = None
            table = self.weight.data
        else:
            self.centers = RowTable(
                rows,
                embedding_dim,
                storage_dtype,
                self.storage_device,
                self.device,
                chunk_rows=chunk_rows,
            )
            table = self.centers.data
        # fill in init chunks so that no full-size float32 copy of a compact table exists
        lo = self.block.start
        while lo < self.block.stop:
            hi = min((lo // _INIT_CHUNK_CLASSES + 1) * _INIT_CHUNK_CLASSES, self.block.stop)
            part = init_center_rows(num_classes, embedding_dim, k, seed, lo, hi, std=init_std)
            table[(lo - self.block.start) * k : (hi - self.block.start) * k].copy_(part)
            lo = hi
        self._chunk_buffer = ReusableBuffer(self.device)  # one chunk of float32 rows
        self._scores_buffer = ReusableBuffer(self.device)  # (n, B) scores / coefficients
        self._inv_norm_buffer = ReusableBuffer(self.device)  # (2, n) inverse norms
        self._device_rows_buffer = ReusableBuffer(self.device)  # (n, d), staged tables only
        # (n, d) GEMM operands of the active rows in the compute dtype, kept from forward for
        # backward on the native low-precision path when the table stores float32 (half the
        # bytes of a float32 copy; a table in the compute dtype is read again instead, so that
        # the cache never rivals the table in size)
        self._operand_buffer = ReusableBuffer(self.device, dtype=self.precision.dtype)
        self.generation = 0  # bumped by every forward; a stale graph refuses to backward
        self._active: ActiveRows | None = None
        self._planned: Tensor | None = None  # active classes of an accumulated step
        self._planned_step = 0

    # ------------------------------------------------------------------ the handshake
    @property
    def active_rows(self) -> ActiveRows | None:
        """The record of the last training forward, until an optimizer consumes it."""
        return self._active

    def consume_active_rows(self) -> ActiveRows | None:
        """Hand the last forward's active rows (with gradient) to the optimizer, once; this
        ends the step (and an accumulation planned by :meth:`prepare_step`)."""
        record, self._active = self._active, None
        self._planned = None
        if record is not None and not record.grad_ready:
            raise RuntimeError(
                "PartialFC: optimizer.step() called before loss.backward() for the last forward"
            )
        return record

    def prepare_step(self, local_labels: Tensor) -> None:
        """Plan an optimizer step of several micro-batches (gradient accumulation).

        ``local_labels``: this rank's labels of *all* the step's micro-batches. All ranks take
        part: the labels are gathered and the active classes are drawn once, from their union
        (the draw of one batch holding all micro-batches, same ``(seed, step, rank)``). Every
        training forward until the optimizer step (or :meth:`discard_step`) uses this active
        set, and the center gradients of the micro-batches add up.
        """
        labels = local_labels.to(self.device, torch.long).reshape(-1)
        sizes = [
            int(s)
            for s in all_gather_sizes([labels.numel()], self.device, self.process_group)[:, 0]
        ]
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(f"PartialFC.prepare_step: labels outside [0, {self.num_classes})")
        labels_all = all_gather_rows_no_grad(labels, sizes, self.process_group)
        positives, _, _ = self._global_labels(labels_all, sizes, labels)
        self._active = None
        self._planned = self._draw_active_classes(positives)
        self._planned_step = self.sampling_step
        self.sampling_step += 1

    # ------------------------------------------------------------------ the head contract
    def angular_margin(self) -> CombinedMargin:
        return self.margin

    def make_optimizer(self, settings: OptimizerSettings) -> torch.optim.Optimizer:
        """:class:`RowSparseSGD` or :class:`RowSparseAdamW` over the centers (only the active
        rows and their state move); ``update="dense"``: a torch optimizer (:class:`Head`)."""
        if self.update == "dense":
            return super().make_optimizer(settings)
        if settings.name == "sgd":
            return RowSparseSGD(
                self,
                lr=settings.lr,
                momentum=settings.momentum,
                weight_decay=settings.weight_decay,
            )
        if settings.name == "adamw":
            return RowSparseAdamW(
                self,
                lr=settings.lr,
                betas=tuple(settings.betas),
                eps=settings.eps,
                weight_decay=settings.weight_decay,
            )
        raise ValueError(f"optimizer name={settings.name!r}: choose sgd or adamw")

    def discard_step(self) -> None:
        """Drop the recorded active rows (and a planned accumulation): the optimizer step does
        not happen for them."""
        self._active = None
        self._planned = None

    def save_state(self, directory, optimizer=None) -> None:
        """This rank's shard [+ optimizer state] (:func:`save_partial_fc_checkpoint`)."""
        save_partial_fc_checkpoint(directory, self, optimizer)

    def load_state(self, directory, optimizer=None) -> None:
        """This rank's rows of a checkpoint written on any number of ranks."""
        load_partial_fc_checkpoint(directory, self, optimizer)

    def diagnostics(self, embeddings: Tensor, labels: Tensor, seed: int = 0) -> dict[str, float]:
        """APCS / AMNCS / MICS of the last forward (all ranks take part; before the optimizer
        step), see :mod:`partialfc.classifier.diagnostics`."""
        return partial_fc_diagnostics(embeddings, labels, self, seed=seed)

    def class_centers(self) -> Tensor:
        """The whole table gathered on every rank (all ranks take part)."""
        return gather_full_centers(self)

    # ------------------------------------------------------------------ helpers
    @property
    def local_num_rows(self) -> int:
        return self.block.size * self.num_subcenters

    def local_centers_float32(self) -> Tensor:
        """This rank's centers ``(C_local * K, d)`` as float32 (a copy)."""
        if self.update == "dense":
            return self.weight.detach().float().clone()
        return self.centers.rows_float32(0, self.local_num_rows)

    def _select_active_classes(self, labels_all: Tensor) -> Tensor:
        """The step's active local classes for the global batch's labels."""
        positives, _, _ = self._global_labels(labels_all, [labels_all.numel()], labels_all)
        return self._draw_active_classes(positives)

    def _draw_active_classes(self, positives: Tensor) -> Tensor:
        """The step's active local classes: the sorted unique local ``positives`` and negatives."""
        if self.budget >= self.block.size:
            return torch.arange(self.block.size, device=positives.device)
        # drawn where the labels are (the compute device): no host round trip on GPUs
        gen = sampling_generator(self.seed, self.sampling_step, self.rank, self.device)
        return sample_active_classes(
            positives, self.block.size, self.budget, gen, positives_sorted=True
        )

    def _global_labels(self, labels_all: Tensor, sizes: list[int], local_labels: Tensor):
        """This rank's view of the global labels, with one read of three counts by the host.

        Returns ``(positives, local_rows, local_classes)``: the sorted unique labels of this
        rank's block (as local classes), the ascending positions of the global batch whose label
        is in the block, and their local classes. Sorting stands in for ``unique`` and
        ``nonzero`` (each of which makes the host wait for the device); the host reads the
        number of out-of-range labels, positives and local rows at once, and raises on every
        rank (naming the rank) when a label is outside ``[0, num_classes)``.
        """
        start, size = self.block.start, self.block.size
        local = labels_all - start
        is_local = local.clamp(0, size - 1) == local
        keys = torch.sort(torch.where(is_local, local, size)).values  # size: not in the block
        first = keys != F.pad(keys[:-1], (1, 0), value=-1)  # first of a run of equal keys
        first &= keys < size
        outside = labels_all.clamp(0, self.num_classes - 1) != labels_all
        bad, num_positives, num_local = torch.stack([outside, first, is_local]).sum(1).tolist()
        if bad:
            self._raise_label_error(labels_all, sizes, local_labels)
        positives = keys[torch.argsort(~first, stable=True)[:num_positives]]
        local_rows = torch.argsort(~is_local, stable=True)[:num_local]
        return positives, local_rows, local[local_rows]

    def _raise_label_error(self, labels_all: Tensor, sizes: list[int], local_labels: Tensor):
        outside = (labels_all < 0) | (labels_all >= self.num_classes)
        ends = torch.tensor(sizes).cumsum(0)
        bad_rows = torch.nonzero(outside.cpu()).squeeze(1)
        bad_ranks = sorted({int(r) for r in torch.searchsorted(ends, bad_rows, right=True)})
        if self.rank in bad_ranks:
            error = embeddings_and_labels_error(
                torch.empty(local_labels.shape[0], self.embedding_dim),
                local_labels.cpu(),
                self.embedding_dim,
                self.num_classes,
                names=("local_embeddings", "local_labels"),
                check_finite=False,
            )
            raise ValueError(f"PartialFC (rank {self.rank}): {error}")
        raise ValueError(f"PartialFC: invalid input on rank(s) {bad_ranks} (see their error)")

    def _gather_batch_sizes(self, local_embeddings: Tensor, local_labels: Tensor) -> list[int]:
        """Every rank's batch size; raises on every rank when one rank's input is malformed.

        Only shapes and dtypes are checked here (the host knows them); one rank: no
        communication, several: one all-gather and one read by the host.
        """
        error = embeddings_and_labels_error(
            local_embeddings,
            local_labels,
            self.embedding_dim,
            self.num_classes,
            names=("local_embeddings", "local_labels"),
            check_finite=False,
            check_label_range=False,
        )
        if self.world_size == 1:
            if error is not None:
                raise ValueError(f"PartialFC (rank {self.rank}): {error}")
            return [local_embeddings.shape[0]]
        b = local_embeddings.shape[0] if error is None else 0
        info = all_gather_sizes([b, 0 if error is None else 1], self.device, self.process_group)
        info = info.tolist()
        bad_ranks = [r for r, (_, bad) in enumerate(info) if bad]
        if bad_ranks:
            if error is not None:
                raise ValueError(f"PartialFC (rank {self.rank}): {error}")
            raise ValueError(f"PartialFC: invalid input on rank(s) {bad_ranks} (see their error)")
        return [size for size, _ in info]

    # ------------------------------------------------------------------ forward
    def forward(self, local_embeddings: Tensor, local_labels: Tensor) -> Tensor:
        """Global-batch mean margin-softmax loss over the sampled union of active centers."""
        # NaN/inf embeddings are let through: the loss is then non-finite, and the trainer
        # skips such steps (train.max_nonfinite_steps)
        sizes = self._gather_batch_sizes(local_embeddings, local_labels)
        if sum(sizes) == 0:
            raise ValueError("PartialFC: the global batch is empty on every rank")

        x_hat = F.normalize(local_embeddings.to(self.device, torch.float32), dim=1)
        if self.backbone_grad_reduction == "mean" and self.world_size > 1:
            x_hat = scale_gradient(x_hat, float(self.world_size))
        x_all = all_gather_rows(x_hat, sizes, self.process_group)
        labels_all = all_gather_rows_no_grad(
            local_labels.to(self.device, torch.long), sizes, self.process_group
        )
        positives, local_rows, local_classes = self._global_labels(labels_all, sizes, local_labels)

        training = torch.is_grad_enabled()
        accumulating = training and self._planned is not None
        if accumulating:
            active = self._planned
            self._check_planned(active, local_classes)
        else:
            active = self._draw_active_classes(positives)
        k = self.num_subcenters
        rows = active  # class-major sub-centers: rows c K ... c K + K - 1 of class c
        if k > 1:
            rows = (active.unsqueeze(1) * k + torch.arange(k, device=active.device)).reshape(-1)
        target_col = torch.searchsorted(active, local_classes)  # column of each local row

        record, w = None, None
        if self.update == "dense":
            w = self.weight.index_select(0, rows)
        elif accumulating and self._active is not None:  # a later micro-batch of the step
            record = self._active.fold()
            self._active = None
        else:
            cache = None
            if self.centers.staged:  # host table: one transfer of the active rows per step
                cache = self.centers.read(rows, self._device_rows_buffer)
            step = self._planned_step if accumulating else self.sampling_step
            record = ActiveRows(
                step, rows, self.centers, weight_cache=cache, precision=self.precision
            )
        self.generation += 1
        plan = _StepPlan(
            owner=self,
            generation=self.generation,
            margin=self.margin,
            num_subcenters=k,
            negative_cos_threshold=self.negative_cos_threshold,
            local_rows=local_rows,
            target_col=target_col,
            rows=rows,
            read_rows=lambda lo, hi: record.read_weight(lo, hi, self._chunk_buffer),
            scores_buffer=self._scores_buffer,
            inv_norm_buffer=self._inv_norm_buffer,
            chunk_rows=self.chunk_rows,
            precision=self.precision,
            rows_representable=self.update == "sparse"
            and self.storage_dtype == self.precision.dtype,
            operand_rows=(
                self._operand_buffer.get(rows.numel(), self.embedding_dim)
                if w is None
                and self.precision.path == "native"
                and self.storage_dtype == torch.float32
                else None
            ),
            record=record,
            process_group=self.process_group,
            world_size=self.world_size,
        )
        # sparse mode: a zero-size leaf that requires grad stands for the centers, so backward
        # (which fills the record) runs even when the embeddings need no gradient
        anchor = torch.empty(0, device=self.device, requires_grad=record is not None)
        loss = _ShardedMarginSoftmax.apply(x_all, w, anchor, plan).mean()

        if record is not None and training:
            if self._active is not None and self._active.grad_ready:
                raise RuntimeError(
                    "PartialFC: the previous step's center gradients were never applied; call "
                    "optimizer.step() between steps, or prepare_step() to accumulate gradients "
                    "over several micro-batches"
                )
            self._active = record
        if training and not accumulating:
            self.sampling_step += 1
        return loss

    def _check_planned(self, active: Tensor, local: Tensor) -> None:
        """Every local label (``local``: local classes) of a micro-batch must be planned."""
        if local.numel() and not bool(torch.isin(local, active).all()):
            raise ValueError(
                "PartialFC: a micro-batch holds labels that prepare_step() was not given; pass "
                "the labels of all micro-batches of the step"
            )

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_dim={self.embedding_dim}, "
            f"sample_rate={self.sample_rate}, num_subcenters={self.num_subcenters}, "
            f"negative_cos_threshold={self.negative_cos_threshold}, update={self.update!r}, "
            f"storage_dtype={self.storage_dtype}, compute={self.precision.describe()}, "
            f"rank={self.rank}/{self.world_size}, "
            f"classes=[{self.block.start}, {self.block.stop})"
        )
