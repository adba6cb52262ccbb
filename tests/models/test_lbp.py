"""Uniform LBP codes and histograms recomputed by hand, and the fitted PCA + WCCN embedder."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from partialfc.models.lbp import (
    NUM_LBP_BINS,
    UNIFORM_BIN,
    LbpGrid,
    LbpWccnEmbedder,
    fuse_embeddings,
    lbp_codes,
    lbp_histograms,
    ltp_codes,
)
from partialfc.models.whitening import WithinClassWhitening

SMALL = LbpGrid(scales_px=(20, 14), radii_px=(1, 2), cell_px=6, stride_px=4)


def _transitions(code: int) -> int:
    bits = [(code >> i) & 1 for i in range(8)]
    return sum(bits[i] != bits[(i + 1) % 8] for i in range(8))


def test_uniform_codes_get_their_own_bins_in_code_order():
    uniform = [c for c in range(256) if _transitions(c) <= 2]
    assert len(uniform) == 58 and NUM_LBP_BINS == 59
    np.testing.assert_array_equal(UNIFORM_BIN[uniform], np.arange(58))
    others = [c for c in range(256) if _transitions(c) > 2]
    assert (UNIFORM_BIN[others] == 58).all()
    # hand-checked: 0b00000101 has four transitions, 0b00001111 two, 0 and 255 none
    assert UNIFORM_BIN[0b00000101] == 58 and UNIFORM_BIN[0] == 0 and UNIFORM_BIN[255] == 57


def test_code_of_a_hand_worked_patch():
    # centre 5; neighbours from the right, clockwise in image rows (down first):
    # right 6, down-right 9, down 8, down-left 7 are >= 5 (bits 0-3); left 4, up-left 1,
    # up 2, up-right 3 are not: 0b00001111 = 15
    patch = np.array([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], dtype=np.uint8)
    assert lbp_codes(patch, 1).tolist() == [[[15]]]
    # equal neighbours count as set bits: a flat patch is 255
    assert lbp_codes(np.full((1, 3, 3), 7), 1).tolist() == [[[255]]]


def test_codes_match_a_pixel_by_pixel_loop():
    images = np.random.default_rng(0).integers(0, 256, (2, 11, 13)).astype(np.uint8)
    for radius in (1, 2):
        got = lbp_codes(images, radius)
        assert got.shape == (2, 11 - 2 * radius, 13 - 2 * radius)
        offsets = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)]
        for n, y, x in np.ndindex(*got.shape):
            cy, cx = y + radius, x + radius
            expected = sum(
                (int(images[n, cy + dy * radius, cx + dx * radius]) >= int(images[n, cy, cx])) << b
                for b, (dy, dx) in enumerate(offsets)
            )
            assert got[n, y, x] == expected


def test_ternary_codes_of_a_hand_worked_patch():
    # centre 50, t = 5; neighbours right 60, down-right 52, down 40, down-left 50, left 56,
    # up-left 44, up 45, up-right 70. Upper (>= 55): right, left, up-right = bits 0, 4, 7 = 145;
    # lower (<= 45): down, up-left, up = bits 2, 5, 6 = 100; 52 and 50 are neither
    patch = np.array([[[44, 45, 70], [56, 50, 60], [50, 40, 52]]], dtype=np.uint8)
    upper, lower = ltp_codes(patch, 1, 5.0)
    assert (upper.tolist(), lower.tolist()) == ([[[145]]], [[[100]]])
    # a flat patch: no neighbour is t above or below the centre
    assert [c.tolist() for c in ltp_codes(np.full((1, 3, 3), 7), 1, 1.0)] == [[[[0]]], [[[0]]]]


def test_ternary_codes_match_a_pixel_by_pixel_loop():
    # small grey range so that many differences fall exactly on the threshold
    images = np.random.default_rng(4).integers(100, 110, (2, 9, 10)).astype(np.uint8)
    offsets = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)]
    for radius, t in ((1, 3.0), (2, 2.5)):
        upper, lower = ltp_codes(images, radius, t)
        assert upper.shape == lower.shape == (2, 9 - 2 * radius, 10 - 2 * radius)
        for n, y, x in np.ndindex(*upper.shape):
            c = int(images[n, y + radius, x + radius])
            g = [
                int(images[n, y + radius + dy * radius, x + radius + dx * radius])
                for dy, dx in offsets
            ]
            assert upper[n, y, x] == sum((g[b] >= c + t) << b for b in range(8))
            assert lower[n, y, x] == sum((g[b] <= c - t) << b for b in range(8))


def test_ternary_histograms_are_the_upper_then_lower_code_histograms():
    images = np.random.default_rng(5).integers(0, 256, (3, 20, 20)).astype(np.uint8)
    grid = LbpGrid(scales_px=(20,), radii_px=(1, 2), cell_px=6, stride_px=4, ternary_threshold=4.0)
    got = lbp_histograms(images, grid)
    cells = {1: 4, 2: 3}  # cells a side at radius 1 (18 interior px) and 2 (16)
    assert got.shape == (3, 2 * (16 + 9) * 59)
    offset = 0
    for radius in (1, 2):
        for code in ltp_codes(images, radius, 4.0):
            bins = UNIFORM_BIN[code]
            for cy in range(cells[radius]):
                for cx in range(cells[radius]):
                    block = bins[:, 4 * cy : 4 * cy + 6, 4 * cx : 4 * cx + 6]
                    counts = np.stack([np.bincount(b.ravel(), minlength=59) for b in block])
                    np.testing.assert_allclose(
                        got[:, offset : offset + 59], np.sqrt(counts / 36), atol=1e-6
                    )
                    offset += 59
    assert offset == got.shape[1]


def test_histograms_count_the_codes_of_every_cell():
    import cv2

    images = np.random.default_rng(1).integers(0, 256, (3, 20, 20)).astype(np.uint8)
    got = lbp_histograms(images, SMALL)
    expected = []
    for side in SMALL.scales_px:
        scaled = [
            cv2.resize(im.astype(np.float32), (side, side), interpolation=cv2.INTER_AREA)
            if side != 20
            else im.astype(np.float32)
            for im in images
        ]
        for radius in SMALL.radii_px:
            codes = UNIFORM_BIN[lbp_codes(np.stack(scaled), radius)]
            inner = codes.shape[1]
            starts = range(0, inner - SMALL.cell_px + 1, SMALL.stride_px)
            cells = []
            for y in starts:
                for x in starts:
                    block = codes[:, y : y + SMALL.cell_px, x : x + SMALL.cell_px]
                    counts = [np.bincount(b.ravel(), minlength=59) for b in block]
                    cells.append(np.sqrt(np.array(counts) / SMALL.cell_px**2))
            expected.append(np.concatenate(cells, axis=1))
    expected = np.concatenate(expected, axis=1)
    # side 20: 18 and 16 interior px -> 4 and 3 cells a side; side 14: 12 and 10 -> 2 and 2
    assert got.shape == (3, (16 + 9 + 4 + 4) * 59) == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6)
    blocks = got.reshape(3, -1, 59)
    np.testing.assert_allclose((blocks**2).sum(axis=2), 1.0, atol=1e-5)  # Hellinger: unit cells


def test_default_grid_dimension_and_batching():
    # 96: 14×14 cells at both radii, 64: 9×9, 48: 6×6 -> 626 cells of 59 bins
    images = np.random.default_rng(2).integers(0, 256, (5, 96, 96)).astype(np.uint8)
    whole = lbp_histograms(images)
    assert whole.shape == (5, 626 * 59) == (5, 36934)
    np.testing.assert_array_equal(lbp_histograms(images, batch_size=2), whole)


def _people(num_people=8, per_person=6, size=20, noise_seed=0):
    """Each person: a fixed random texture; each image: it plus pixel noise, shifted by 0-1 px."""
    faces = np.random.default_rng(100).integers(40, 216, (num_people, size + 2, size + 2))
    rng = np.random.default_rng(noise_seed)
    images, labels = [], []
    for person, face in enumerate(faces.astype(np.float64)):
        for _ in range(per_person):
            dy, dx = rng.integers(0, 2, 2)
            noisy = face[dy : dy + size, dx : dx + size] + rng.normal(0, 12, (size, size))
            images.append(np.clip(noisy, 0, 255).astype(np.uint8))
            labels.append(person)
    return np.stack(images), np.asarray(labels)


def test_fit_is_pca_then_within_class_whitening():
    images, labels = _people()
    embedder = LbpWccnEmbedder(SMALL, num_components=12, regularization=0.5).fit(images, labels)
    # independently: descriptor of the image plus its mirror, centred, SVD, WCCN
    h = lbp_histograms(images, SMALL) + lbp_histograms(images[:, :, ::-1].copy(), SMALL)
    centred = (h - h.mean(0)).astype(np.float64)
    axes = np.linalg.svd(centred, full_matrices=False)[2][:12].T
    reduced = centred @ axes
    w = WithinClassWhitening(0.5).fit(reduced, labels).projection
    expected = reduced @ w
    got = embedder(images)
    assert got.shape == (48, 12)
    # the axes' signs are arbitrary: compare every inner product (invariant to them)
    np.testing.assert_allclose(got @ got.T, expected @ expected.T, rtol=1e-3, atol=1e-3)
    # and the embedding separates the people on new images of them
    test_images, test_labels = _people(noise_seed=1)
    e = embedder(test_images)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    cos = e @ e.T
    same = test_labels[:, None] == test_labels[None, :]
    off_diagonal = ~np.eye(len(e), dtype=bool)
    assert cos[same & off_diagonal].mean() > cos[~same].mean() + 0.3


def test_mirror_averaging_makes_the_embedding_mirror_invariant():
    images, labels = _people()
    embedder = LbpWccnEmbedder(SMALL, num_components=10).fit(images, labels)
    np.testing.assert_allclose(
        embedder(images[:, :, ::-1].copy()), embedder(images), rtol=1e-4, atol=1e-4
    )
    plain = LbpWccnEmbedder(SMALL, num_components=10, flip=False).fit(images, labels)
    assert not np.allclose(plain(images[:, :, ::-1].copy()), plain(images), atol=1e-2)


def test_save_and_load_give_the_same_embedding(tmp_path):
    images, labels = _people()
    embedder = LbpWccnEmbedder(SMALL, num_components=10, regularization=0.7).fit(images, labels)
    path = embedder.save(tmp_path / "lbp.npz")
    loaded = LbpWccnEmbedder.load(path)
    assert (loaded.grid, loaded.num_components, loaded.regularization) == (SMALL, 10, 0.7)
    np.testing.assert_array_equal(loaded(images), embedder(images))
    assert [p.name for p in tmp_path.iterdir()] == ["lbp.npz"]  # no temp file left
    ternary = replace(SMALL, ternary_threshold=3.0)
    embedder = LbpWccnEmbedder(ternary, num_components=10).fit(images, labels)
    loaded = LbpWccnEmbedder.load(embedder.save(tmp_path / "ltp.npz"))
    assert loaded.grid == ternary
    np.testing.assert_array_equal(loaded(images), embedder(images))


def test_files_written_before_ternary_codes_load_as_lbp(tmp_path):
    images, labels = _people()
    embedder = LbpWccnEmbedder(SMALL, num_components=10).fit(images, labels)
    with np.load(embedder.save(tmp_path / "lbp.npz")) as data:
        arrays = {k: data[k] for k in data.files if k != "ternary_threshold"}
    np.savez(tmp_path / "older.npz", **arrays)
    loaded = LbpWccnEmbedder.load(tmp_path / "older.npz")
    assert loaded.grid.ternary_threshold == 0.0
    np.testing.assert_array_equal(loaded(images), embedder(images))


def test_a_failed_save_leaves_neither_file_nor_temp_file(tmp_path, monkeypatch):
    images, labels = _people()
    embedder = LbpWccnEmbedder(SMALL, num_components=10).fit(images, labels)

    def half_written(path, **arrays):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 truncated")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", half_written)
    with pytest.raises(OSError, match="disk full"):
        embedder.save(tmp_path / "lbp.npz")
    assert list(tmp_path.iterdir()) == []


def test_fitting_precomputed_descriptors_leaves_them_unchanged():
    images, labels = _people()
    h = lbp_histograms(images, SMALL).astype(np.float64)
    before = h.copy()
    LbpWccnEmbedder(SMALL, num_components=10).fit_descriptors(h, labels)
    np.testing.assert_array_equal(h, before)


def test_load_refuses_files_that_are_not_an_embedder(tmp_path):
    np.savez(tmp_path / "other.npz", mean=np.zeros(3))
    with pytest.raises(ValueError, match=r"other\.npz.*missing arrays"):
        LbpWccnEmbedder.load(tmp_path / "other.npz")
    pickled = tmp_path / "pickled.npz"  # an object array would need unpickling
    np.savez(
        pickled,
        mean=np.zeros(3),
        projection=np.array([{"a": 1}], dtype=object),
        scales_px=np.array([20]),
        radii_px=np.array([1]),
        cell_stride_px=np.array([6, 4]),
        regularization=np.float64(1),
        flip=np.bool_(True),
    )
    with pytest.raises(ValueError, match=r"pickled\.npz"):
        LbpWccnEmbedder.load(pickled)
    embedder = LbpWccnEmbedder(SMALL, num_components=4).fit(*_people())
    embedder.save(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as data:
        arrays = dict(data)
    arrays["radii_px"] = np.array([1])  # radius 1 only: 4×4 + 2×2 cells of 59 bins, not 33 cells
    np.savez(tmp_path / "regridded.npz", **arrays)
    with pytest.raises(ValueError, match=r"regridded\.npz.*gives 1180-dimensional .*not 1947"):
        LbpWccnEmbedder.load(tmp_path / "regridded.npz")
    arrays["radii_px"] = np.array([1, 2])  # the good file's grid again
    for name, bad in (("negative", np.float64(-1.0)), ("two_thresholds", np.array([3.0, 4.0]))):
        np.savez(tmp_path / f"{name}.npz", **{**arrays, "ternary_threshold": bad})
        with pytest.raises(ValueError, match=rf"{name}\.npz"):
            LbpWccnEmbedder.load(tmp_path / f"{name}.npz")
    with pytest.raises(ValueError, match=r"missing\.npz"):
        LbpWccnEmbedder.load(tmp_path / "missing.npz")


def test_fused_cosine_is_the_weighted_mean_of_the_two_cosines():
    rng = np.random.default_rng(3)
    model, lbp = rng.normal(size=(5, 4)) * 7, rng.normal(size=(5, 9)) * 0.1
    fused = fuse_embeddings(model, lbp, 3.0)
    assert fused.shape == (5, 13)

    def cosines(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return x @ x.T

    expected = (cosines(model) + 3.0 * cosines(lbp)) / 4.0
    np.testing.assert_allclose(cosines(fused), expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(fused, axis=1), 2.0, atol=1e-6)  # √(1 + w)
    np.testing.assert_allclose(cosines(fuse_embeddings(model, lbp, 0.0)), cosines(model), atol=1e-6)
    with pytest.raises(ValueError, match="lbp_weight"):
        fuse_embeddings(model, lbp, -1.0)
    with pytest.raises(ValueError, match="5 model embeddings but 4"):
        fuse_embeddings(model, lbp[:4], 1.0)


def test_bad_use_is_refused_by_name():
    images, labels = _people(num_people=2, per_person=3)
    with pytest.raises(ValueError, match="below the number of training images"):
        LbpWccnEmbedder(SMALL, num_components=6).fit(images, labels)
    with pytest.raises(ValueError, match="labels must be"):
        LbpWccnEmbedder(SMALL, num_components=2).fit(images, labels[:-1])
    with pytest.raises(RuntimeError, match="not fitted"):
        LbpWccnEmbedder(SMALL)(images)
    fitted = LbpWccnEmbedder(SMALL, num_components=2).fit(images, labels)
    assert fitted(np.zeros((1, 30, 30), np.uint8)).shape == (1, 2)  # resized to every side
    with pytest.raises(ValueError, match="num_components"):
        LbpWccnEmbedder(num_components=0)
    with pytest.raises(ValueError, match="regularization"):
        LbpWccnEmbedder(regularization=-1.0)
    with pytest.raises(ValueError, match="does not fit"):
        LbpGrid(scales_px=(10,), radii_px=(2,), cell_px=8)
    with pytest.raises(ValueError, match="positive"):
        LbpGrid(stride_px=0)
    with pytest.raises(ValueError, match="radius_px"):
        lbp_codes(np.zeros((1, 4, 4)), 2)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ternary_threshold"):
            LbpGrid(ternary_threshold=bad)
        with pytest.raises(ValueError, match="threshold"):
            ltp_codes(np.zeros((1, 4, 4)), 1, bad)
    with pytest.raises(ValueError, match="threshold"):
        ltp_codes(np.zeros((1, 4, 4)), 1, 0.0)
    with pytest.raises(ValueError, match=r"\(N, H, W\)"):
        lbp_histograms(np.zeros((4, 4)))
