"""P x K sampler: batch structure, small identities, balance, reproducibility, bad input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from partialfc.data.pk_sampler import PKSampler


def _labels():
    # 12 identities: sizes 1..12 (identity c has c + 1 samples), shuffled positions
    labels = np.repeat(np.arange(12), np.arange(1, 13))
    return np.random.default_rng(0).permutation(labels)


def test_every_batch_is_p_distinct_identities_times_k():
    labels = _labels()
    sampler = PKSampler(labels, identities_per_batch=4, samples_per_identity=5, num_batches=30)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 30
    for batch in batches:
        assert len(batch) == 20
        counts = Counter(labels[batch].tolist())
        assert len(counts) == 4 and set(counts.values()) == {5}
        for identity in counts:
            chosen = [i for i in batch if labels[i] == identity]
            members = set(np.flatnonzero(labels == identity).tolist())
            assert set(chosen) <= members
            if len(members) >= 5:
                assert len(set(chosen)) == 5  # no repeats for identities with enough samples
            else:
                assert set(chosen) == members  # small identity: all of it, topped up


def test_identity_counts_are_balanced_within_an_epoch():
    labels = _labels()
    sampler = PKSampler(labels, identities_per_batch=5, samples_per_identity=2, num_batches=24)
    seen = Counter()
    for batch in sampler:
        seen.update(set(labels[batch].tolist()))
    assert sum(seen.values()) == 24 * 5
    assert max(seen.values()) - min(seen.values()) <= 1


def test_reproducible_per_seed_and_epoch():
    labels = torch.tensor(_labels())
    a = PKSampler(labels, 3, 4, seed=7)
    b = PKSampler(labels, 3, 4, seed=7)
    assert list(a) == list(b) == list(a)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(PKSampler(labels, 3, 4, seed=8)) != list(PKSampler(labels, 3, 4, seed=7))


def test_default_length_is_samples_over_batch_size():
    labels = _labels()  # 78 samples
    assert len(PKSampler(labels, 3, 4)) == 78 // 12


def test_works_as_a_dataloader_batch_sampler_on_omniglot(bundled_omniglot):
    with np.load(bundled_omniglot / "omniglot_28.npz") as archive:
        num_classes, per_class = archive["images"].shape[:2]
    labels = np.repeat(np.arange(num_classes), per_class)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(labels))
    sampler = PKSampler(labels, identities_per_batch=32, samples_per_identity=4, num_batches=3)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    for (batch_labels,) in loader:
        counts = torch.bincount(batch_labels)
        assert (counts[counts > 0] == 4).all() and int((counts > 0).sum()) == 32


def test_bad_input():
    labels = _labels()
    with pytest.raises(ValueError, match="identities_per_batch"):
        PKSampler(labels, 13, 2)
    with pytest.raises(ValueError, match="samples_per_identity"):
        PKSampler(labels, 2, 0)
    with pytest.raises(ValueError, match="labels"):
        PKSampler(labels.astype(float), 2, 2)
    with pytest.raises(ValueError, match="labels"):
        PKSampler(labels.reshape(6, 13), 2, 2)
    with pytest.raises(ValueError, match="num_batches"):
        PKSampler(labels, 2, 2, num_batches=0)
