"""Controlled corruption: exact counts, ground truth kept, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from partialfc.data import ArrayDataset
from partialfc.data.corruption import CorruptedDataset, flip_labels, long_tail, split_identities

LABELS = np.repeat(np.arange(30), 12)  # 30 identities x 12 images


def test_flip_rate_is_exact_and_flipped_labels_are_wrong():
    c = flip_labels(LABELS, 0.2, seed=1)
    assert c.counts["flipped_samples"] == 72 == c.noisy_mask.sum()
    np.testing.assert_array_equal(c.clean_labels, LABELS)
    assert (c.labels[c.noisy_mask] != LABELS[c.noisy_mask]).all()
    np.testing.assert_array_equal(c.labels[~c.noisy_mask], LABELS[~c.noisy_mask])
    assert c.labels.min() >= 0 and c.labels.max() < 30
    same = flip_labels(LABELS, 0.2, seed=1)
    np.testing.assert_array_equal(same.labels, c.labels)
    assert not np.array_equal(flip_labels(LABELS, 0.2, seed=2).labels, c.labels)
    assert flip_labels(LABELS, 0.0).noisy_mask.sum() == 0


def test_flipped_labels_are_uniform_over_the_other_classes():
    labels = np.zeros(40000, dtype=np.int64)
    labels[:4] = [1, 2, 3, 4]  # 5 classes
    c = flip_labels(labels, 1.0, seed=0)
    counts = np.bincount(c.labels[4:], minlength=5)
    assert counts[0] == 0
    expected = (40000 - 4) / 4
    assert np.abs(counts[1:] - expected).max() < 4 * np.sqrt(expected)  # ~4 sigma


def test_split_identities_reproduces_the_webface_conflict_recipe():
    # Partial FC (An et al., CVPR 2022) table 3: a third of the identities, each split into 3
    # pseudo classes
    c = split_identities(LABELS, fraction=1 / 3, parts=3, seed=0)
    assert c.counts["identities_split"] == 10 and c.num_classes == 30 + 20
    assert c.counts["samples_in_split_identities"] == 120 == c.noisy_mask.sum()
    np.testing.assert_array_equal(c.clean_labels, LABELS)
    sizes = np.bincount(c.labels, minlength=c.num_classes)
    assert (sizes > 0).all()
    split = np.unique(c.clean_labels[c.noisy_mask])
    for identity in split:
        parts = np.unique(c.labels[c.clean_labels == identity])
        assert len(parts) == 3 and identity in parts
        assert sorted(sizes[parts]) == [4, 4, 4]
    for pseudo in range(30, 50):  # each new class belongs to exactly one identity
        assert len(np.unique(c.clean_labels[c.labels == pseudo])) == 1
    np.testing.assert_array_equal(c.labels[~c.noisy_mask], LABELS[~c.noisy_mask])


def test_split_needs_enough_images():
    with pytest.raises(ValueError, match="only 0 of 30 have >= 13 images"):
        split_identities(LABELS, 0.1, parts=13)


def test_long_tail_reaches_the_target_fraction():
    c = long_tail(LABELS, tail_fraction=0.4457, k=10, seed=0)
    sizes = np.bincount(c.labels, minlength=30)
    assert (sizes < 10).sum() == round(0.4457 * 30) == c.counts["tail_classes_after"]
    assert (sizes >= 1).all() and c.num_classes == 30
    assert c.counts["samples_after"] == len(c.indices) == sizes.sum()
    np.testing.assert_array_equal(c.labels, LABELS[c.indices])
    assert not c.noisy_mask.any()
    np.testing.assert_array_equal(long_tail(LABELS, 0.4457, 10, seed=0).indices, c.indices)


def test_corrupted_dataset_serves_noisy_labels_over_real_images():
    images = np.arange(360 * 4, dtype=np.uint8).reshape(360, 2, 2) % 251
    base = ArrayDataset(images.astype(np.uint8), LABELS)
    c = long_tail(flip_labels(LABELS, 0.1, seed=3).labels, 0.5, k=10, seed=4)
    ds = CorruptedDataset(base, c, return_index=True)
    image, label, index = ds[5]
    assert label == c.labels[5] and index == 5
    np.testing.assert_array_equal(image[0].numpy(), images[c.indices[5]])
    assert ds.num_classes == 30 and len(ds) == len(c.indices)
