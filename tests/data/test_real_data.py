"""Loaders of the real sets: the bundled Omniglot and ../shared/data (skipped when absent)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from partialfc.data import (
    ArrayDataset,
    LfwImageArchive,
    load_lfw_gray,
    load_omniglot,
    load_omniglot_one_shot_runs,
    load_orl,
    read_lfw_pairs,
)


def test_bundled_omniglot_splits(bundled_omniglot):
    background = load_omniglot("background")
    evaluation = load_omniglot("evaluation")
    assert background.images.shape == (19280, 28, 28) and background.num_classes == 964
    assert evaluation.images.shape == (13180, 28, 28) and evaluation.num_classes == 659
    np.testing.assert_array_equal(np.bincount(background.labels), np.full(964, 20))
    assert background.class_names[0] == "Arcadian/character01"
    assert evaluation.class_names[0] == "Angelic/character01"
    # ink = 255: strokes cover a minority of the pixels
    assert (background.images > 127).mean() < 0.2
    ds = ArrayDataset(background.images, background.labels)
    image, label = ds[21]
    assert image.shape == (1, 28, 28) and label == 1


def test_one_shot_runs_answer_key_matches_the_evaluation_classes(bundled_omniglot):
    """Independent check of the parser and of the resize/invert: every run image is found,
    pixel for pixel, in the packed evaluation set, and each test image's answer is a drawing
    of the same character."""
    runs = load_omniglot_one_shot_runs(28)
    assert len(runs) == 20
    evaluation = load_omniglot("evaluation")
    lookup: dict[bytes, int] = {}
    for img, label in zip(evaluation.images, evaluation.labels, strict=True):
        lookup.setdefault(img.tobytes(), int(label))
    matched = 0
    for run in runs:
        assert run.training_images.shape == (20, 28, 28) and sorted(run.answers) == list(range(20))
        for test_image, answer in zip(run.test_images, run.answers, strict=True):
            a = lookup.get(test_image.tobytes())
            b = lookup.get(run.training_images[answer].tobytes())
            if a is not None and b is not None:
                assert a == b
                matched += 1
    assert matched >= 380  # (nearly) all 400 test images found in the packed arrays


def test_omniglot_105_downscales_to_the_bundled_28(shared_data):
    big = load_omniglot("evaluation", 105)
    small = load_omniglot("evaluation", 28)
    assert big.images.shape == (13180, 105, 105)
    for i in (0, 777, 13179):
        paper = Image.fromarray(255 - big.images[i])  # back to the file convention
        resized = 255 - np.asarray(paper.resize((28, 28), Image.LANCZOS))
        np.testing.assert_array_equal(resized, small.images[i])


def test_orl(shared_data):
    orl = load_orl(shared_data / "orl_faces")
    assert orl.images.shape == (400, 112, 92) and orl.num_classes == 40
    np.testing.assert_array_equal(orl.labels, np.repeat(np.arange(40), 10))
    assert orl.image_names[11] == "s2/2"


def test_lfw_gray_and_pairs(shared_data):
    dev = load_lfw_gray(shared_data / "lfw_dev", "dev")
    assert dev.images.shape == (5183, 96, 96) and dev.num_classes == 2041
    assert set(np.unique(dev.identity_fold)) <= {1, 2, 3, 4, 5}
    extra = load_lfw_gray(shared_data / "lfw_dev", "extra")
    assert extra.images.shape[0] == 1505 and set(np.unique(extra.identity_fold)) == {0}
    pairs = read_lfw_pairs(shared_data / "lfw_dev" / "pairs_dev.txt")
    assert len(pairs) == 3000 and pairs.issame.sum() == 1500
    np.testing.assert_array_equal(np.bincount(pairs.fold)[1:], [600] * 5)
    assert pairs.issame[:300].all() and not pairs.issame[300:600].any()
    assert all(pairs.name1[i] == pairs.name2[i] for i in np.flatnonzero(pairs.issame))
    assert len(pairs.image_names()) == 3811
    archive = LfwImageArchive(shared_data / "lfw_dev" / "lfw_color150_dev.zip")
    first = archive.read(pairs.name1[0], pairs.number1[0])
    assert first.shape == (150, 150, 3) and first.dtype == np.uint8
    # colour order: RGB from the decoder equals Pillow's RGB decode
    raw = archive.read_bytes(pairs.name1[0], pairs.number1[0])
    pil = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")).astype(int)
    assert np.abs(first.astype(int) - pil).mean() < 2.0
    with pytest.raises(FileNotFoundError, match="no member"):
        archive.read("Nobody_Here", 1)
    # the archive holds exactly the images of the dev pairs
    assert archive.image_ids() == sorted(pairs.image_names())
