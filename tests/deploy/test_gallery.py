"""Gallery: templates, search equal to brute force, persistence, corrupted files refused."""

from __future__ import annotations

import numpy as np
import pytest

from partialfc.deploy import Gallery, GalleryFileError


def normalize(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture
def enrolled():
    """60 identities with 1-4 raw embeddings each (norms vary, as quality does)."""
    rng = np.random.default_rng(0)
    gallery = Gallery(dim=32, model="test-model")
    raw = {}
    for i in range(60):
        n = int(rng.integers(1, 5))
        e = rng.normal(size=(n, 32)) * rng.uniform(0.5, 3.0, size=(n, 1))
        raw[f"id{i:02d}"] = e
        gallery.enroll(f"id{i:02d}", e)
    return gallery, raw, rng


def brute_force(raw: dict, queries: np.ndarray, k: int):
    names = sorted(raw)
    templates = normalize(np.stack([np.mean(raw[n], axis=0) for n in names]))
    scores = normalize(queries) @ templates.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[names[j] for j in row] for row in order], np.take_along_axis(scores, order, 1)


def test_template_is_the_normalised_mean_of_raw_embeddings(enrolled):
    gallery, raw, _ = enrolled
    for name in ("id00", "id07"):
        np.testing.assert_allclose(gallery.template(name), normalize(raw[name].mean(0)), atol=1e-6)
        assert gallery.count(name) == len(raw[name])


def test_search_equals_brute_force_after_updates(enrolled):
    gallery, raw, rng = enrolled
    for name in ("id03", "id40", "id59"):
        gallery.remove(name)
        del raw[name]
    extra = rng.normal(size=(3, 32))
    gallery.enroll("id10", extra)  # more images for an existing identity
    raw["id10"] = np.concatenate([raw["id10"], extra])
    queries = rng.normal(size=(25, 32)) * 4.0
    result = gallery.search(queries, k=5)
    names, scores = brute_force(raw, queries, 5)
    assert result.identities == names
    np.testing.assert_allclose(result.scores, scores, atol=1e-5)
    assert len(gallery) == 57 and "id03" not in gallery


def test_search_beyond_gallery_size_returns_every_identity_once():
    gallery = Gallery(dim=4)
    gallery.enroll("a", np.eye(4)[:1])
    gallery.enroll("b", np.eye(4)[1:2])
    result = gallery.search(np.eye(4)[:1], k=3)
    assert result.identities == [["a", "b"]]
    np.testing.assert_allclose(result.scores, [[1.0, 0.0]], atol=1e-6)


def test_save_and_reopen_gives_identical_gallery(enrolled, tmp_path):
    gallery, raw, rng = enrolled
    path = tmp_path / "gallery.npz"
    gallery.save(path)
    gallery.save(path)  # overwrite in place: still one file, no temporaries left behind
    assert [p.name for p in tmp_path.iterdir()] == ["gallery.npz"]
    reopened = Gallery.open(path)
    assert reopened.identities == gallery.identities and reopened.model == "test-model"
    queries = rng.normal(size=(10, 32))
    a, b = gallery.search(queries, 4), reopened.search(queries, 4)
    assert a.identities == b.identities
    np.testing.assert_array_equal(a.scores, b.scores)
    reopened.enroll("new", rng.normal(size=(1, 32)))  # ids stay unique after reopening
    assert len(set(reopened._names.values())) == len(reopened)


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "foreign"])
def test_corrupted_gallery_is_refused(enrolled, tmp_path, damage):
    gallery, _, _ = enrolled
    path = tmp_path / "gallery.npz"
    gallery.save(path)
    data = bytearray(path.read_bytes())
    if damage == "flip_byte":
        data[len(data) // 2] ^= 0xFF  # inside the template sums
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        buf = tmp_path / "other.npz"
        meta = np.frombuffer(b'{"format": "x"}', dtype=np.uint8)
        np.savez(buf, meta=meta, ids=[], sums=[], counts=[])
        data = buf.read_bytes()
    path.write_bytes(bytes(data))
    with pytest.raises(GalleryFileError, match="gallery.npz"):
        Gallery.open(path)


def test_bad_enrolment_is_a_clear_error():
    gallery = Gallery(dim=4)
    with pytest.raises(ValueError, match="must be \\(n >= 1, 4\\)"):
        gallery.enroll("a", np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        gallery.enroll("a", np.full((1, 4), np.nan))
    with pytest.raises(KeyError, match="not enrolled"):
        gallery.remove("nobody")


def _claim_rows(data: bytes, rows: int) -> bytes:
    """The gallery file with the ``sums`` header claiming ``rows`` rows: the header's dict is
    rewritten inside its space padding, so every offset of the file stays the same."""
    start = data.index(b"{'descr'", data.index(b"sums.npy"))
    end = data.index(b"\n", start)
    claim = f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({rows}, 32), }}".encode()
    assert len(claim) <= end - start
    return data[:start] + claim.ljust(end - start) + data[end:]


@pytest.mark.parametrize("rows", [10**9, 61])
def test_array_header_claiming_more_than_the_file_holds_is_refused_before_allocating(
    enrolled, tmp_path, rows
):
    gallery, _, _ = enrolled
    path = tmp_path / "gallery.npz"
    gallery.save(path)
    path.write_bytes(_claim_rows(path.read_bytes(), rows))
    # 1e9 x 32 float64 would be a 256 GB allocation; one extra row is the smallest lie
    with pytest.raises(GalleryFileError, match=rf"gallery.npz: array 'sums.npy' claims shape "
                       rf"\({rows}, 32\) of float64 \({rows * 256} bytes\), but the member "
                       rf"holds 15360 bytes"):  # fmt: skip
        Gallery.open(path)


def test_compressed_gallery_members_are_refused(enrolled, tmp_path):
    gallery, _, _ = enrolled
    path = tmp_path / "gallery.npz"
    gallery.save(path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez_compressed(path, **arrays)  # same arrays, deflated: a zip bomb would look like this
    with pytest.raises(GalleryFileError, match="gallery.npz: member 'meta.npy' is compressed"):
        Gallery.open(path)
