"""Partial FC on a process group that is not the world: 3 gloo ranks, rank 0 alone in one group
and ranks 1-2 sharing another. Each group trains the same model on the same global batch, so
every collective that used the world instead of the head's group would mix the two (or hang);
the two-rank group must reproduce the one-rank group: loss, embedding gradients, center
gradients, an SGD step, an accumulated step of two micro-batches, and the gathered table."""

from __future__ import annotations

import functools

import torch

from partialfc.classifier import PartialFC, RowSparseSGD, gather_full_centers
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import assert_close_at_scale
from tests.distributed import run_ranks

C, D, B = 10, 8, 12


def _batch(step: int):
    gen = torch.Generator().manual_seed(50 + step)
    return torch.randn(B, D, generator=gen), torch.randint(0, C, (B,), generator=gen)


def _body(rank: int, world: int) -> dict:
    import torch.distributed as dist

    groups = [dist.new_group([0]), dist.new_group([1, 2])]  # every rank creates both
    group = groups[0] if rank == 0 else groups[1]
    part = slice(0, B) if rank == 0 else (slice(0, 7) if rank == 1 else slice(7, B))
    # the accumulated step: micro-batch j of the global batch is rows[j] on every group
    rows = [torch.tensor([0, 1, 2, 6, 7, 8]), torch.tensor([3, 4, 5, 9, 10, 11])]
    if rank:
        rows = [r[(r >= 6) == (rank == 2)] for r in rows]
    pfc = PartialFC(C, D, ArcFaceMargin(0.5, 16.0), init_std=0.3, seed=2, process_group=group,
                    backbone_grad_reduction="sum")  # fmt: skip
    opt = RowSparseSGD(pfc, lr=0.5, momentum=0.9)
    out = {"rank": pfc.rank, "world": pfc.world_size, "block": (pfc.block.start, pfc.block.stop)}
    x, y = _batch(0)
    xl = x[part].clone().requires_grad_(True)
    loss = pfc(xl, y[part])
    loss.backward()
    out["loss"], out["grad_x"] = loss.item(), xl.grad.numpy().copy()
    out["grad_w"] = pfc.active_rows.center_grad().numpy().copy()
    opt.step()
    x, y = _batch(1)
    pfc.prepare_step(y[torch.cat(rows)])
    for micro in rows:
        pfc(x[micro], y[micro]).backward()
    opt.step()
    out["centers"] = gather_full_centers(pfc).numpy().copy()
    return out


@functools.cache
def _run() -> list[dict]:
    return run_ranks(_body, world_size=3)


def test_a_two_rank_group_beside_a_one_rank_group_trains_the_same_model():
    alone, first, second = _run()
    assert (alone["rank"], alone["world"], alone["block"]) == (0, 1, (0, C))
    assert (first["rank"], first["world"], first["block"]) == (0, 2, (0, C // 2))
    assert (second["rank"], second["world"], second["block"]) == (1, 2, (C // 2, C))
    assert first["loss"] == second["loss"]
    assert abs(first["loss"] - alone["loss"]) <= 1e-6 * abs(alone["loss"])

    def close(actual, expected):
        assert_close_at_scale(actual, expected, atol_of_max=1e-6)

    close(torch.cat([torch.as_tensor(first["grad_x"]), torch.as_tensor(second["grad_x"])]),
          alone["grad_x"])  # fmt: skip
    close(torch.cat([torch.as_tensor(first["grad_w"]), torch.as_tensor(second["grad_w"])]),
          alone["grad_w"])  # fmt: skip
    close(first["centers"], alone["centers"])
    close(second["centers"], alone["centers"])
