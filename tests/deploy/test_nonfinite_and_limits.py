"""Non-finite embeddings are refused with the rows named (never a threshold of inf, NaN in
JSON or silently empty matches); gallery files are fully checksummed and checked; search and
the numeric options are bounded."""

from __future__ import annotations

import json
import tracemalloc

import cv2
import numpy as np
import pytest

from partialfc.cli import main
from partialfc.deploy import Embedder, Gallery, GalleryFileError, calibrate, decide
from partialfc.deploy import command as deploy_command
from partialfc.deploy.verify import CalibratedThreshold, threshold_from_impostors


def unit_rows(n: int, d: int = 8, seed: int = 0) -> np.ndarray:
    e = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_calibrate_names_non_finite_rows(bad):
    e, labels = unit_rows(12), np.repeat(np.arange(4), 3)
    e[[4, 9], 2] = bad
    with pytest.raises(
        ValueError,
        match=r"^cal.rec: 2 of 12 embeddings contain NaN or inf: row 4 \(label 1\), row 9 "
        r"\(label 3\)$",
    ):
        calibrate(e, labels, 0.1, source="cal.rec")
    with pytest.raises(ValueError, match=r"impostor_scores: 1 of 3 are NaN or inf"):
        threshold_from_impostors(np.array([0.2, bad, 0.1]), 0.5)


def test_decide_and_gallery_search_name_non_finite_rows():
    e = unit_rows(6)
    t = CalibratedThreshold(0.5, 0.1, 1, 1, 10, (0.0, 0.5))
    b = e.copy()
    b[3] = np.nan
    with pytest.raises(ValueError, match=r"second images of the pairs: 1 of 6 .*: row 3$"):
        decide(e, b, t)
    gallery = Gallery(8)
    gallery.enroll("a", e[:2])
    with pytest.raises(ValueError, match=r"query rows \[3\] contain NaN or inf"):
        gallery.search(b)


# ---------------------------------------------------------------- the commands


class BlankIsNaN:
    """The backend of a model that returns NaN for a blank (constant) input image."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x):
        out = np.array(self.inner(x), dtype=np.float32)
        out[x.reshape(len(x), -1).std(axis=1) == 0] = np.nan
        return out


@pytest.fixture
def nan_model(small_model, monkeypatch):
    model, spec = small_model
    embedder = Embedder.from_module(model, spec)
    embedder.backend = BlankIsNaN(embedder.backend)
    monkeypatch.setattr(deploy_command, "_load", lambda args: embedder)
    return embedder


@pytest.fixture
def faces(omniglot_images, tmp_path):
    """4 identities x 4 drawings, and one blank image in identity char2."""
    images, _ = omniglot_images
    root = tmp_path / "faces"
    for c in range(4):
        (root / f"char{c}").mkdir(parents=True)
        for j in range(4):
            cv2.imwrite(str(root / f"char{c}" / f"{j}.png"), images[c * 20 + j])
    blank = root / "char2" / "blank.png"
    cv2.imwrite(str(blank), np.zeros((28, 28), np.uint8))
    return root, blank


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_commands_name_the_image_with_a_non_finite_embedding(nan_model, faces, tmp_path, capsys):
    root, blank = faces
    good = root / "char0" / "0.png"
    named = f"row 12 ({blank}, identity char2)"  # after char0, char1 and char2's 0-3.png
    code, out, err = run(capsys, "embed", "m", root, "--out", tmp_path / "e.npz")
    assert code == 2 and f"{root}: 1 of 17 embeddings contain NaN or inf: {named}" in err
    assert not (tmp_path / "e.npz").exists()
    code, out, err = run(capsys, "verify", "m", "--calibrate", root, "--far", "0.1")
    assert code == 2 and f"{root}: 1 of 17 embeddings contain NaN or inf: {named}" in err
    t = tmp_path / "t.json"
    CalibratedThreshold(0.5, 0.1, 1, 1, 10, (0.0, 0.5)).save(t)
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(f"{good} {good}\n{good} {blank}\n")
    code, out, err = run(capsys, "verify", "m", "--threshold", t, "--pairs", pairs)
    assert (
        code == 2
        and f"{pairs}: 1 of 2 embeddings contain NaN or inf: row 1 ({blank}, pair 2)" in err
    )
    assert "NaN" not in out and all(json.loads(line) for line in out.splitlines())
    gallery = tmp_path / "g.npz"
    code, out, err = run(capsys, "search", "m", gallery, "--enroll", root)
    assert code == 2 and named in err and not gallery.exists()
    clean = tmp_path / "clean"
    for c in (0, 1):
        (clean / f"char{c}").mkdir(parents=True)
        (clean / f"char{c}" / "0.png").write_bytes((root / f"char{c}" / "0.png").read_bytes())
    assert run(capsys, "search", "m", gallery, "--enroll", clean)[0] == 0
    code, out, err = run(capsys, "search", "m", gallery, "--query", blank)
    assert code == 2 and f"{blank}: 1 of 1 embeddings contain NaN or inf: row 0 ({blank})" in err
    assert out == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["embed", "m", "x", "--out", "e.npz", "--batch-size", "0"],
            "--batch-size must be an integer >= 1, got 0",
        ),
        (
            ["gallery", "query", "m", "g.npz", "q.png", "--top-k", "0"],
            "--top-k must be an integer >= 1, got 0",
        ),
        (
            ["verify", "m", "--calibrate", "x", "--far", "2"],
            "--far must be a finite number in (0, 1), got 2.0",
        ),
        (
            ["verify", "m", "--calibrate", "x", "--far", "nan"],
            "--far must be a finite number in (0, 1), got nan",
        ),
        (["export", "m", "out", "--opset", "-1"], "--opset must be an integer in [7, 100], got -1"),
    ],
)
def test_numeric_options_are_checked_before_anything_runs(args, message, capsys):
    code, _, err = run(capsys, *args)
    assert code == 2 and err == f"partialfc {args[0]}: {message}\n"


# ---------------------------------------------------------------- gallery files and search


def rewrite(path, **changes):
    """Rewrite a gallery file with ``meta`` fields changed (the digest left as it was)."""
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(changes)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    return meta


def v1_digest(path):
    from partialfc.deploy.gallery import _digest

    with np.load(path, allow_pickle=False) as f:
        return _digest(f["ids"], f["sums"], f["counts"], None)


@pytest.fixture
def saved(tmp_path):
    gallery = Gallery(8, model="m1")
    for i, name in enumerate(["ann", "bob", "cid"]):
        gallery.enroll(name, unit_rows(2, seed=i))
    path = tmp_path / "g.npz"
    gallery.save(path)
    return gallery, path


@pytest.mark.parametrize(
    "field, value",
    [("next_id", 0), ("names", ["bob", "ann", "cid"]), ("model", "m2"), ("dim", 8.0)],
)
def test_every_field_is_checksummed(saved, field, value):
    _, path = saved
    rewrite(path, **{field: value})
    with pytest.raises(GalleryFileError, match=r"g.npz: checksum mismatch"):
        Gallery.open(path)


def test_version_1_files_are_read_with_consistency_checks(saved):
    gallery, path = saved
    rewrite(path, version=1, sha256=v1_digest(path))
    reopened = Gallery.open(path)
    assert reopened.identities == ["ann", "bob", "cid"] and reopened._next_id == 3
    np.testing.assert_allclose(reopened.template("bob"), gallery.template("bob"))
    reopened.save(path)
    assert json.loads(np.load(path)["meta"].tobytes())["version"] == 2
    for changes, message in [
        ({"next_id": 0}, r"next_id 0 is not above every id in use \(largest 2\)"),
        ({"next_id": True}, r"next_id True is not above"),
        ({"names": ["ann", "ann", "cid"]}, r"names contains duplicates"),
        ({"names": ["ann", "bob"]}, r"array shapes disagree with 2 identities of dim 8"),
        ({"dim": 0}, r"dim 0 is not a positive integer"),
        ({"version": 3}, r"partialfc.gallery version 3; this partialfc reads versions 1, 2"),
    ]:
        gallery.save(path)
        rewrite(path, **{"version": 1, "sha256": v1_digest(path), **changes})
        with pytest.raises(GalleryFileError, match=rf"g.npz: {message}"):
            Gallery.open(path)


def test_top_k_is_clamped_to_the_gallery_size(saved, tmp_path):
    gallery, _ = saved
    queries = unit_rows(4, seed=5)
    tracemalloc.start()
    try:
        result = gallery.search(queries, k=100_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"
    assert result.scores.shape == (4, 3) and all(len(row) == 3 for row in result.identities)
    assert sorted(result.identities[0]) == ["ann", "bob", "cid"]
    np.testing.assert_array_equal(result.scores, gallery.search(queries, k=3).scores)
    empty = Gallery(8).search(queries, k=5)
    assert empty.identities == [[], [], [], []] and empty.scores.shape == (4, 0)
