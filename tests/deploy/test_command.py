"""The export / embed / verify / search commands end to end on a folder of real images."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from partialfc.cli import main
from partialfc.deploy import Embedder, Gallery


@pytest.fixture(scope="module")
def folder(omniglot_images, tmp_path_factory):
    """8 identities × 5 PNG drawings in root/<identity>/<image>.png."""
    images, labels = omniglot_images
    root = tmp_path_factory.mktemp("faces")
    for c in range(8):
        (root / f"char{c}").mkdir()
        for j in range(5):
            cv2.imwrite(str(root / f"char{c}" / f"{j}.png"), images[c * 20 + j])
    return root


def test_embed_writes_normalised_embeddings_equal_to_the_api(checkpoint, folder, tmp_path, capsys):
    out = tmp_path / "e.npz"
    assert main(["embed", str(checkpoint), str(folder), "--out", str(out), "--flip"]) == 0
    with np.load(out, allow_pickle=False) as f:
        e, labels, names = f["embeddings"], f["labels"], f["identity_names"]
    assert e.shape == (40, 64) and list(labels[:6]) == [0] * 5 + [1]
    assert list(names) == [f"char{c}" for c in range(8)]
    img = cv2.imread(str(folder / "char0" / "0.png"), cv2.IMREAD_GRAYSCALE)[None]
    np.testing.assert_allclose(e[0], Embedder.load(checkpoint).embed(img, flip=True)[0], atol=1e-6)


def test_verify_calibrates_saves_and_scores_a_pair(checkpoint, folder, tmp_path, capsys):
    t = tmp_path / "t.json"
    a, b = folder / "char0" / "0.png", folder / "char0" / "1.png"
    args = ["verify", str(checkpoint), "--calibrate", str(folder), "--far", "0.05"]
    assert main([*args, "--save-threshold", str(t), "--pair", str(a), str(b)]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads(t.read_text())
    assert saved["n_impostor"] == 40 * 39 // 2 - 8 * 10 and saved["target_far"] == 0.05
    assert row["match"] == (row["score"] >= saved["threshold"])
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(f"{a} {b}\n{a} {a}\n")
    assert main(["verify", str(checkpoint), "--threshold", str(t), "--pairs", str(pairs)]) == 0
    rows = [json.loads(r) for r in capsys.readouterr().out.strip().splitlines()]
    assert rows[0]["score"] == pytest.approx(row["score"], abs=1e-6)
    assert rows[1]["score"] == pytest.approx(1.0, abs=1e-5) and rows[1]["match"]


def test_search_enrolls_persists_and_finds_the_right_identity(checkpoint, folder, tmp_path, capsys):
    gallery_path = tmp_path / "g.npz"
    assert main(["search", str(checkpoint), str(gallery_path), "--enroll", str(folder)]) == 0
    gallery = Gallery.open(gallery_path)
    assert len(gallery) == 8 and gallery.count("char3") == 5
    query = folder / "char3" / "2.png"  # an enrolled image: its own template ranks first
    assert main(["search", str(checkpoint), str(gallery_path), "--query", str(query)]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["matches"][0]["identity"] == "char3" and len(row["matches"]) == 5
    assert main(["search", str(checkpoint), str(gallery_path), "--remove", "char3"]) == 0
    assert "char3" not in Gallery.open(gallery_path)


def test_search_flips_a_single_query_file(checkpoint, folder, tmp_path, capsys):
    gallery_path = tmp_path / "g.npz"
    assert main(["search", str(checkpoint), str(gallery_path), "--enroll", str(folder)]) == 0
    query = folder / "char3" / "2.png"

    def scores(*extra):
        args = ["search", str(checkpoint), str(gallery_path), "--query", str(query), *extra]
        assert main([*args, "--top-k", "8"]) == 0
        row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return {m["identity"]: m["score"] for m in row["matches"]}

    flipped, plain = scores("--flip"), scores()
    img = cv2.imread(str(query), cv2.IMREAD_GRAYSCALE)[None]
    embedder = Embedder.load(checkpoint)
    raw = embedder.embed_raw(img)[0] + embedder.embed_raw(np.ascontiguousarray(img[:, :, ::-1]))[0]
    gallery = Gallery.open(gallery_path)
    expected = {name: float(raw @ gallery.template(name)) / np.linalg.norm(raw) for name in plain}
    assert flipped.keys() == expected.keys() and len(flipped) == 8
    for name, score in flipped.items():
        assert score == pytest.approx(expected[name], abs=1e-5), name
    assert max(abs(flipped[n] - plain[n]) for n in plain) > 1e-3


def test_a_packed_set_enrolls_under_its_identity_names(checkpoint, folder, tmp_path, capsys):
    rec = tmp_path / "faces.rec"
    assert main(["pack", str(folder), str(rec), "--workers", "1"]) == 0
    gallery_path = tmp_path / "g.npz"
    assert main(["search", str(checkpoint), str(gallery_path), "--enroll", str(rec)]) == 0
    gallery = Gallery.open(gallery_path)
    assert sorted(gallery.identities) == [f"char{c}" for c in range(8)]
    assert gallery.count("char3") == 5


def test_bad_input_is_a_clear_error(checkpoint, tmp_path, capsys):
    code = main(["embed", str(checkpoint), str(tmp_path / "nowhere"), "--out", "x.npz"])
    assert code == 2
    assert "nowhere: expected an image folder" in capsys.readouterr().err


def test_commands_with_nothing_to_do_say_so(checkpoint, tmp_path, capsys):
    assert main(["search", str(checkpoint), str(tmp_path / "g.npz")]) == 2
    assert "nothing to do: give --enroll, --query and/or --remove" in capsys.readouterr().err
    t = tmp_path / "t.json"
    t.write_text("{}")
    assert main(["verify", str(checkpoint), "--threshold", str(t)]) == 2
    assert "--threshold needs pairs to score" in capsys.readouterr().err


def test_errors_print_without_extra_quotes(checkpoint, folder, tmp_path, capsys):
    gallery = tmp_path / "g.npz"
    assert main(["search", str(checkpoint), str(gallery), "--enroll", str(folder)]) == 0
    capsys.readouterr()
    assert main(["gallery", "remove", str(checkpoint), str(gallery), "alice"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partialfc gallery: identity") and not err.endswith('"'), err


def _huge_png_header() -> bytes:
    import struct
    import zlib

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 100000, 100000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


@pytest.fixture
def folder_with_bad_files(folder, tmp_path):
    """Two identities of 2 good images each, and four bad files in the first identity."""
    import shutil

    root = tmp_path / "mixed"
    for c in range(2):
        (root / f"char{c}").mkdir(parents=True)
        for j in range(2):
            shutil.copy(folder / f"char{c}" / f"{j}.png", root / f"char{c}" / f"{j}.png")
    bad = root / "char0"
    (bad / "cut.png").write_bytes((folder / "char0" / "2.png").read_bytes()[:60])
    (bad / "huge.png").write_bytes(_huge_png_header())
    (bad / "text.png").write_text("not an image")
    (bad / "zero.png").write_bytes(b"")
    return root


def test_skip_bad_embeds_what_it_can_and_lists_the_rest(
    checkpoint, folder_with_bad_files, tmp_path, capsys
):
    root, out = folder_with_bad_files, tmp_path / "e.npz"
    assert main(["embed", str(checkpoint), str(root), "--out", str(out)]) == 2  # strict default
    assert (
        f"{root / 'char0' / 'cut.png'}: not a decodable image (60 bytes)" in capsys.readouterr().err
    )
    assert not out.exists()
    assert main(["embed", str(checkpoint), str(root), "--out", str(out), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    listed = tmp_path / "e.refused.tsv"
    assert f"4 embeddings of dim 64 written to {out}; 4 file(s) refused, listed in {listed}" in (
        captured.out
    )
    rows = [line.split("\t") for line in listed.read_text().splitlines()]
    assert rows[0] == ["file", "reason"]
    assert {Path(f).name: reason for f, reason in rows[1:]} == {
        "cut.png": "not a decodable image (60 bytes)",
        "huge.png": "image header claims 100000 x 100000 = 10000000000 pixels, above the limit "
        "of 67108864 (set the environment variable PARTIALFC_MAX_IMAGE_PIXELS to allow more)",
        "text.png": "not a decodable image (12 bytes)",
        "zero.png": "not a decodable image (0 bytes)",
    }
    with np.load(out, allow_pickle=False) as f:
        sources, labels, e = list(f["sources"]), list(f["labels"]), f["embeddings"]
    good = [root / f"char{c}" / f"{j}.png" for c in range(2) for j in range(2)]
    assert sources == [str(p) for p in good] and labels == [0, 0, 1, 1]
    images = np.stack([cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in good])
    np.testing.assert_allclose(e, Embedder.load(checkpoint).embed(images), atol=1e-6)


def test_search_skip_bad_enrolls_and_queries_the_readable_images(
    checkpoint, folder_with_bad_files, tmp_path, capsys
):
    root, gallery_path = folder_with_bad_files, tmp_path / "g.npz"
    args = ["search", str(checkpoint), str(gallery_path), "--enroll", str(root)]
    assert main([*args, "--query", str(root)]) == 2 and not gallery_path.exists()
    assert main([*args, "--query", str(root), "--skip-bad"]) == 0
    gallery = Gallery.open(gallery_path)
    assert gallery.count("char0") == 2 and gallery.count("char1") == 2
    queries = [json.loads(r)["query"] for r in capsys.readouterr().out.strip().splitlines()]
    assert [Path(q).name for q in queries] == ["0.png", "1.png"] * 2
    refused = (tmp_path / "g.refused.tsv").read_text().splitlines()
    assert len(refused) == 1 + 8  # four files refused while enrolling, the same four as queries


def test_flat_folder_is_one_identity_per_image(checkpoint, folder, tmp_path, capsys):
    """``embed`` without ``--detect`` used to refuse a folder without identity sub-folders."""
    import shutil

    flat = tmp_path / "flat"
    flat.mkdir()
    for c in (3, 5):
        shutil.copy(folder / f"char{c}" / "0.png", flat / f"person{c}.png")
    out = tmp_path / "e.npz"
    assert main(["embed", str(checkpoint), str(flat), "--out", str(out)]) == 0
    with np.load(out, allow_pickle=False) as f:
        assert list(f["identity_names"]) == ["person3", "person5"]
        assert list(f["labels"]) == [0, 1]
        e = f["embeddings"]
    images = np.stack([cv2.imread(str(flat / f"person{c}.png"), 0) for c in (3, 5)])
    np.testing.assert_allclose(e, Embedder.load(checkpoint).embed(images), atol=1e-6)
