"""Augmentations on uint8 tensors, in DataLoader workers, and batch normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from partialfc.backbone.pixels import normalize_batch
from partialfc.data import ArrayDataset, load_omniglot
from partialfc.data.transforms import (
    ColorJitter,
    Compose,
    RandomAffine,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
)


def image(c=3, h=9, w=7):
    return torch.randint(
        0, 256, (c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )


def test_flip_and_crop():
    x = image()
    assert torch.equal(RandomHorizontalFlip(1.0)(x), x.flip(-1))
    assert torch.equal(RandomHorizontalFlip(0.0)(x), x)
    assert torch.equal(RandomCrop(7)(image(3, 7, 7)), image(3, 7, 7))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    torch.manual_seed(5)
    crop = RandomCrop(6, padding=2)(x)
    windows = [padded[:, i : i + 6, j : j + 6] for i in range(8) for j in range(6)]
    assert crop.shape == (3, 6, 6) and any(torch.equal(crop, w) for w in windows)


def test_random_erasing_replaces_one_rectangle_of_the_stated_size():
    x = torch.full((2, 40, 30), 7, dtype=torch.uint8)  # no random pixel can keep all 7s
    assert torch.equal(RandomErasing(p=0.0)(x), x)
    fractions, aspects = [], []
    for seed in range(300):
        torch.manual_seed(seed)
        out = RandomErasing(p=1.0)(x)
        changed = (out != x).any(0)
        rows, cols = changed.any(1).nonzero().squeeze(1), changed.any(0).nonzero().squeeze(1)
        eh, ew = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
        # one axis-aligned rectangle: every pixel inside its bounding box changed
        assert int(changed.sum()) >= eh * ew - 2 and x.dtype == out.dtype
        assert torch.equal(out[:, ~changed], x[:, ~changed])
        fractions.append(eh * ew / (40 * 30))
        aspects.append(eh / ew)
    # area fraction in [0.02, 0.4] and aspect in [0.3, 1/0.3], up to the rounding to pixels
    assert 0.015 < min(fractions) < 0.06 and 0.3 < max(fractions) < 0.43
    assert 0.25 < min(aspects) < 0.4 and 2.5 < max(aspects) < 3.9
    hits = 0
    for seed in range(400):
        torch.manual_seed(seed)
        hits += not torch.equal(RandomErasing(p=0.25)(x), x)
    assert 70 < hits < 130  # binomial(400, 0.25): mean 100, sd 8.7


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"p": 1.5}, "p must be in"),
        ({"min_area": 0.5, "max_area": 0.4}, "min_area <= max_area"),
        ({"max_area": 1.0}, "max_area < 1"),
        ({"min_aspect": 2.0}, "min_aspect must be in"),
    ],
)
def test_random_erasing_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomErasing(**kwargs)


def test_erase_prob_puts_random_erasing_last_in_the_training_transform():
    from partialfc.train.config import AugmentConfig
    from partialfc.train.data import build_augmentation

    transform = build_augmentation(AugmentConfig(hflip=True, erase_prob=0.3), input_size=8)
    assert isinstance(transform.transforms[-1], RandomErasing)
    assert transform.transforms[-1].p == 0.3
    assert build_augmentation(AugmentConfig(hflip=False), input_size=8) is None


def test_color_jitter_matches_an_independent_computation():
    x = image()
    assert torch.equal(ColorJitter(0.0)(x), x)
    torch.manual_seed(11)
    out = ColorJitter(brightness=0.3, contrast=0.0, saturation=0.0)(x)
    torch.manual_seed(11)
    factor = 0.7 + 0.6 * float(torch.rand(()))
    expected = np.clip(np.round(x.numpy().astype(np.float64) * factor), 0, 255)
    assert np.abs(out.numpy().astype(np.float64) - expected).max() <= 1
    torch.manual_seed(12)
    saturated = ColorJitter(brightness=0.0, contrast=0.0, saturation=0.5)(x)
    grey = image(3, 5, 5).float().mean(0, keepdim=True).expand(3, 5, 5).round().to(torch.uint8)
    assert torch.equal(ColorJitter(0.0, 0.0, 0.9)(grey), grey)  # grey stays grey
    assert saturated.dtype == torch.uint8


def test_affine_without_motion_is_identity():
    x = image(1, 12, 12)
    assert torch.equal(RandomAffine(0.0, 0.0, 0.0)(x), x)
    out = RandomAffine(15.0, 0.1, 0.1)(x)
    assert out.shape == x.shape and out.dtype == torch.uint8


def test_augmentation_in_dataloader_workers(bundled_omniglot):
    torch.set_num_threads(1)
    data = load_omniglot("background", 28)
    ds = ArrayDataset(
        data.images[:64],
        data.labels[:64],
        transform=Compose([RandomCrop(28, padding=2), RandomHorizontalFlip()]),
    )
    loader = DataLoader(ds, batch_size=32, num_workers=2)
    batches = list(loader)
    assert len(batches) == 2 and batches[0][0].dtype == torch.uint8
    assert batches[0][0].shape == (32, 1, 28, 28)
    x = normalize_batch(batches[0][0])  # what the trainer does on the device
    assert x.min() >= -1 and x.max() <= 1
    assert batches[1][1].tolist() == data.labels[32:64].tolist()


def test_affine_moves_a_dot_where_the_similarity_says():
    """Recompute the drawn angle/scale/shift from the same seed and predict where a dot lands:
    out = scale · R(-angle) · in + shift, in coordinates normalised to [-1, 1]."""
    size = 41
    x = torch.zeros(1, size, size, dtype=torch.uint8)
    x[0, 9:12, 27:30] = 255  # dot centred at (x=28, y=10)
    transform = RandomAffine(max_rotation_deg=30.0, max_shift_frac=0.1, max_scale_delta=0.2)
    for seed in range(5):
        torch.manual_seed(seed)
        out = transform(x)[0].float()
        torch.manual_seed(seed)
        u = [float(torch.rand(())) for _ in range(4)]
        angle = np.radians(-30 + 60 * u[0])
        scale = 0.8 + 0.4 * u[1]
        shift = np.array([-0.2 + 0.4 * u[2], -0.2 + 0.4 * u[3]])
        dot = (2 * np.array([28.0, 10.0]) + 1) / size - 1
        rot = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
        expected = ((scale * rot @ dot + shift) + 1) * size / 2 - 0.5
        ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        mass = out.sum()
        centre = np.array([(out * xs).sum() / mass, (out * ys).sum() / mass])
        np.testing.assert_allclose(centre, expected, atol=0.35)
