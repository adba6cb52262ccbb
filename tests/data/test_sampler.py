"""ResumableDistributedSampler: shares, determinism and mid-epoch resume."""

from __future__ import annotations

import numpy as np

from partialfc.data.sampler import ResumableDistributedSampler


def shares(n, world, epoch=0, **kwargs):
    out = []
    for rank in range(world):
        sampler = ResumableDistributedSampler(n, world, rank, seed=7, **kwargs)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_every_rank_gets_an_equal_share_covering_the_epoch():
    parts = shares(103, 4)
    assert {len(p) for p in parts} == {26}
    assert set(np.concatenate(parts)) == set(range(103))  # 104 slots: one index repeated
    assert len(ResumableDistributedSampler(103, 4, 1)) == 26
    dropped = shares(103, 4, drop_last=True)
    flat = np.concatenate(dropped)
    assert len(flat) == 100 and len(set(flat)) == 100


def test_epochs_differ_and_are_reproducible():
    assert shares(50, 2, epoch=1) == shares(50, 2, epoch=1)
    assert shares(50, 2, epoch=1) != shares(50, 2, epoch=2)
    assert shares(10, 1, shuffle=False)[0] == list(range(10))


def test_mid_epoch_resume_continues_the_same_sequence():
    world, global_batch = 3, 12
    full = shares(100, world, epoch=4)
    for rank in range(world):
        sampler = ResumableDistributedSampler(100, world, rank, seed=7)
        sampler.set_epoch(4)
        for _ in range(5):  # five steps done before the interruption
            sampler.advance(global_batch)
        state = sampler.state_dict()
        resumed = ResumableDistributedSampler(100, world, rank, seed=0)
        resumed.load_state_dict(state)
        resumed.set_epoch(4)  # the engine re-announces the epoch: position kept
        assert list(resumed) == full[rank][5 * global_batch // world :]
        assert len(resumed) == len(full[rank]) - 5 * global_batch // world
        resumed.set_epoch(5)
        assert resumed.consumed_samples == 0 and len(list(resumed)) == len(full[rank])


def test_resume_with_a_different_world_size_sees_each_remaining_sample_once():
    before = ResumableDistributedSampler(96, 4, 0, seed=3)
    before.set_epoch(2)
    before.advance(40)
    remaining = before.epoch_order()[40:].tolist()
    after = []
    for rank in range(2):
        sampler = ResumableDistributedSampler(96, 2, rank, seed=3)
        sampler.load_state_dict(before.state_dict())
        after += list(sampler)
    assert sorted(after) == sorted(remaining)
