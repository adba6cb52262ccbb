"""Rotated copies as new classes (Omniglot's class augmentation) and Omniglot at any size."""

import numpy as np
import pytest
import torch

from partialfc.data.datasets import ArrayDataset, QuarterTurnClasses
from partialfc.data.loaders import load_omniglot
from partialfc.train.config import ConfigError, load_config
from partialfc.train.data import build_train_set


def _toy():
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)  # 3 images, 4x5, not square
    return ArrayDataset(images, np.array([0, 1, 1]))


def test_quarter_turns_rotate_counter_clockwise_and_shift_labels():
    base = _toy()
    rotated = QuarterTurnClasses(base, turns=4)
    assert len(rotated) == 12 and rotated.num_classes == 8
    np.testing.assert_array_equal(rotated.labels, [0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7])
    for index in range(12):
        k, i = divmod(index, 3)
        image, label = rotated[index]
        expected = np.rot90(base.images[i], k)  # numpy: counter-clockwise, first two axes
        np.testing.assert_array_equal(image[0].numpy(), expected)
        assert label == base.labels[i] + 2 * k
    # a quarter turn of the 4x5 image is 5x4; the top row becomes the left column, reversed
    first_turn = rotated[3][0][0].numpy()
    assert first_turn.shape == (5, 4)
    np.testing.assert_array_equal(first_turn[:, 0], base.images[0][0, ::-1])


def test_half_turns_and_identity():
    base = _toy()
    half = QuarterTurnClasses(base, turns=2)
    assert len(half) == 6 and half.num_classes == 4
    np.testing.assert_array_equal(half[4][0][0].numpy(), base.images[1][::-1, ::-1])
    assert half[4][1] == 3
    same = QuarterTurnClasses(base, turns=1)
    assert len(same) == 3 and same[2][1] == 1
    with pytest.raises(ValueError, match="turns must be 1, 2 or 4"):
        QuarterTurnClasses(base, turns=3)


def test_keeps_extra_items_such_as_the_index():
    images = np.zeros((2, 3, 3), dtype=np.uint8)
    base = ArrayDataset(images, np.array([0, 1]), return_index=True)
    assert QuarterTurnClasses(base, 4)[5][1:] == (5, 1)  # k = 2: label 1 + 2·2, base index 1


def test_config_builds_the_rotated_omniglot_training_set():
    cfg = load_config("configs/omniglot_cpu.yaml", overrides=["data.rotation_classes=4"])
    train = build_train_set(cfg.data)
    assert train.num_classes == 4 * 964 and len(train) == 4 * 19_280
    image, label = train[19_280 + 21]  # drawing 1 of class 1, turned once
    plain, plain_label = build_train_set(load_config("configs/omniglot_cpu.yaml").data)[21]
    assert label == plain_label + 964
    assert torch.equal(image, torch.rot90(plain, 1, dims=(-2, -1)))
    with pytest.raises(ConfigError, match="data.rotation_classes=3"):
        load_config("configs/omniglot_cpu.yaml", overrides=["data.rotation_classes=3"])


def test_omniglot_other_sizes_resize_the_originals_like_the_28_copy(shared_data):
    small = load_omniglot("evaluation", 28)
    assert small.images.shape == (13180, 28, 28)
    mid = load_omniglot("evaluation", 40)
    assert mid.images.shape == (13180, 40, 40) and mid.images.dtype == np.uint8
    np.testing.assert_array_equal(mid.labels, small.labels)
    # ink = 255 after loading; the mean ink fraction is a property of the drawing, not the size
    assert abs(mid.images.mean() / 255 - small.images.mean() / 255) < 0.02
    with pytest.raises(ValueError, match="size must be an integer in"):
        load_omniglot("evaluation", 200)
