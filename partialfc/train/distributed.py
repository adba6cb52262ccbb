"""Process-group set-up for training: one process, or one process per rank under ``torchrun``.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
without them training runs as a single process with no process group. gloo on CPU, NCCL on GPU.
A process group that already exists (e.g. in tests) is used as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from partialfc.classifier import collectives


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available")
    return torch.device(spec)


def setup_distributed(device_spec: str = "auto", timeout_s: float = 1800.0) -> DistContext:
    """Join the process group described by the environment (or by an existing group)."""
    device = resolve_device(device_spec)
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    else:
        rank, world, local_rank = 0, 1, 0
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, device=device)


def barrier(ctx: DistContext) -> None:
    """All ranks of the world meet (:func:`partialfc.classifier.collectives.barrier`)."""
    collectives.barrier()


def all_true(flag: bool, ctx: DistContext) -> bool:
    """True when ``flag`` holds on every rank (one all-reduce,
    :func:`partialfc.classifier.collectives.all_reduce_flag_all`)."""
    device = _comm_device(ctx) if ctx.distributed else "cpu"
    return collectives.all_reduce_flag_all(flag, device=device)


def all_gather_objects(obj, ctx: DistContext) -> list:
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")
