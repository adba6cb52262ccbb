"""Collectives for the class-sharded classifier, with a single-process fallback.

Every function works without an initialised process group (world size 1), so the same code runs
on one process, on gloo (CPU) and on NCCL (GPU).

Autograd conventions (Partial FC, An et al., arXiv 2010.05222, §3.2.1):

* :func:`all_gather_rows` concatenates every rank's rows (sizes may differ, an empty block is
  fine). Its backward all-reduces (sums) the incoming gradient and returns this rank's slice:
  each rank receives the gradient of its own rows summed over all ranks.
* The softmax's all-reduced sums (of ``exp`` and of the target logit) need no communication
  in backward: every rank computes the *same* loss from the reduced values, so rank k
  back-propagates ``d loss / d local_term_k`` through its own terms only (identity backward;
  see ``partial_fc._ShardedMarginSoftmax``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "world_info",
    "all_gather_sizes",
    "all_gather_rows",
    "all_gather_rows_no_grad",
    "all_reduce_max",
    "all_reduce_flag_all",
    "barrier",
]


def world_info(process_group=None) -> tuple[int, int]:
    """``(rank, world_size)`` of ``process_group``; ``(0, 1)`` when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def _distributed(process_group) -> bool:
    return world_info(process_group)[1] > 1


def all_gather_sizes(values: list[int], device, process_group=None) -> Tensor:
    """Gather a few integers from every rank: returns a ``(world_size, len(values))`` long tensor.

    Used first in every step (batch sizes and validity flags), so that no rank enters a
    collective with a shape the others do not expect.
    """
    local = torch.tensor(values, dtype=torch.long, device=device)
    if not _distributed(process_group):
        return local.unsqueeze(0)
    _, world = world_info(process_group)
    out = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(out, local, group=process_group)
    return torch.stack(out)


def _gather_padded(local: Tensor, sizes: list[int], process_group) -> Tensor:
    """All-gather blocks of ``sizes[r]`` rows (padded to the largest) and concatenate them."""
    max_rows = max(sizes)
    padded = local.new_zeros((max_rows, *local.shape[1:]))
    padded[: local.shape[0]] = local
    blocks = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(blocks, padded.contiguous(), group=process_group)
    return torch.cat([b[:n] for b, n in zip(blocks, sizes, strict=True)])


class _AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: Tensor, sizes: list[int], process_group) -> Tensor:
        rank, _ = world_info(process_group)
        ctx.sizes = sizes
        ctx.rank = rank
        ctx.process_group = process_group
        return _gather_padded(local, sizes, process_group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.process_group)
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None, None


def all_gather_rows(local: Tensor, sizes: list[int], process_group=None) -> Tensor:
    """Concatenate every rank's ``(sizes[r], ...)`` block in rank order (autograd-aware)."""
    if not _distributed(process_group):
        return local
    return _AllGatherRows.apply(local, list(sizes), process_group)


def all_gather_rows_no_grad(local: Tensor, sizes: list[int], process_group=None) -> Tensor:
    """Like :func:`all_gather_rows` for tensors without gradient (labels, integer data)."""
    if not _distributed(process_group):
        return local
    return _gather_padded(local, list(sizes), process_group)


def all_reduce_max(tensor: Tensor, process_group=None) -> Tensor:
    """Element-wise max over ranks (no gradient; used for the log-sum-exp shift); a new
    tensor when reduced over several ranks, ``tensor`` itself (detached) on one."""
    if not _distributed(process_group):
        return tensor.detach()
    tensor = tensor.detach().clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=process_group)
    return tensor


def all_reduce_flag_all(ok: bool, process_group=None, device="cpu") -> bool:
    """True on every rank iff ``ok`` is true on every rank (one tiny collective)."""
    if not _distributed(process_group):
        return bool(ok)
    flag = torch.tensor([1 if ok else 0], dtype=torch.long, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=process_group)
    return bool(flag.item())


def barrier(process_group=None) -> None:
    if _distributed(process_group):
        dist.barrier(group=process_group)
