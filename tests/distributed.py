"""Run a test function on N gloo ranks in fresh processes and collect what each rank returns.

Usage inside a test::

    def _body(rank, world_size, x):          # module-level, picklable
        ...                                  # torch.distributed is initialised here
        return some_tensor_or_number

    results = run_ranks(_body, world_size=3, args=(x,))   # list indexed by rank

An exception on any rank is re-raised in the test process with that rank's traceback.
A rank that hangs (e.g. in a collective) fails the test after ``timeout_s`` instead of
blocking the suite.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, world_size, init_file, fn, args, queue, timeout_s):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - forwarded to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world_size: int, args: tuple = (), timeout_s: float = 120.0):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, init_file, fn, args, queue, timeout_s))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        try:
            for _ in range(world_size):
                rank, status, payload = queue.get(timeout=timeout_s + 60)
                if status == "ok":
                    results[rank] = payload
                else:
                    errors.append(f"rank {rank} failed:\n{payload}")
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        if errors:
            raise AssertionError("\n".join(errors))
        return [results[r] for r in range(world_size)]
