"""Contiguous, balanced class blocks: rank r owns classes ``[start_r, stop_r)``.

The first ``C mod N`` ranks own ``ceil(C / N)`` classes, the others ``floor(C / N)``, so block
sizes differ by at most one and uneven ``C / N`` needs no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClassBlock", "class_block", "class_blocks"]


@dataclass(frozen=True)
class ClassBlock:
    """Classes ``[start, stop)`` owned by one rank."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def class_block(num_classes: int, rank: int, world_size: int) -> ClassBlock:
    """The block of ``rank`` among ``world_size`` ranks over ``num_classes`` classes."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world={world_size}")
    if num_classes < world_size:
        raise ValueError(
            f"num_classes={num_classes} is smaller than world_size={world_size}: every rank "
            "must own at least one class"
        )
    base, extra = divmod(num_classes, world_size)
    start = rank * base + min(rank, extra)
    return ClassBlock(start, start + base + (1 if rank < extra else 0))


def class_blocks(num_classes: int, world_size: int) -> list[ClassBlock]:
    """All blocks, in rank order."""
    return [class_block(num_classes, r, world_size) for r in range(world_size)]
