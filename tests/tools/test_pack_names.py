"""pack -> unpack keeps identity names (a sidecar beside the .rec) and the stored bytes."""

from __future__ import annotations

import json

import pytest

from partialfc.cli import main
from partialfc.data import load_omniglot, read_identity_names
from partialfc.data.datasets import scan_image_folder
from partialfc.data.decode import encode_image
from partialfc.data.pack import identity_names_path, pack_images

NAMES = ["Zoë Baird", "alice", "José María Aznar"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """3 identities with non-ASCII and spaced names; JPEG and PNG files mixed."""
    data = load_omniglot("background", 28)
    root = tmp_path_factory.mktemp("names") / "src"
    originals = {}
    for c, name in enumerate(NAMES):
        (root / name).mkdir(parents=True)
        for j in range(3):
            ext = ".jpg" if j % 2 == 0 else ".png"
            payload = encode_image(data.images[20 * c + j], ext)
            (root / name / f"img{j}{ext}").write_bytes(payload)
            originals[(name, j)] = (payload, ext)
    return root, originals


def _pack(source, rec, capsys) -> dict:
    assert main(["pack", str(source), str(rec), "--workers", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pack_unpack_round_trip_keeps_names_and_bytes(photos, tmp_path, capsys):
    root, originals = photos
    report = _pack(root, tmp_path / "faces.rec", capsys)
    assert report["names"] == str(tmp_path / "faces.names.json")
    assert read_identity_names(tmp_path / "faces.rec") == sorted(NAMES)

    assert main(["unpack", str(tmp_path / "faces.rec"), str(tmp_path / "out")]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 9
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*NAMES, "list.txt"])
    for name in NAMES:
        files = sorted((tmp_path / "out" / name).iterdir())
        assert len(files) == 3
        for j, path in enumerate(files):  # keys follow the source order inside an identity
            payload, ext = originals[(name, j)]
            assert path.suffix == ext  # the stored format, not always .jpg
            assert path.read_bytes() == payload
    lines = (tmp_path / "out" / "list.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("José María Aznar/") and lines[0].endswith(" 0")
    assert lines[-1].startswith("alice/") and lines[-1].endswith(" 2")

    # packing the unpacked folder again gives the same set, byte for byte
    _pack(tmp_path / "out", tmp_path / "again.rec", capsys)
    for suffix in (".rec", ".idx"):
        again = (tmp_path / f"again{suffix}").read_bytes()
        assert again == (tmp_path / f"faces{suffix}").read_bytes()


def test_the_sidecar_leaves_the_mxnet_files_unchanged(photos, tmp_path):
    paths, labels, names = scan_image_folder(photos[0])
    pack_images(paths, labels, tmp_path / "a.rec", progress=False, names=names)
    pack_images(paths, labels, tmp_path / "b.rec", progress=False)
    assert identity_names_path(tmp_path / "a.rec").is_file()
    assert not identity_names_path(tmp_path / "b.rec").exists()
    for suffix in (".rec", ".idx"):
        assert (tmp_path / f"a{suffix}").read_bytes() == (tmp_path / f"b{suffix}").read_bytes()


def test_numbered_folders_and_sets_without_names(photos, tmp_path, capsys):
    root, _ = photos
    _pack(root, tmp_path / "faces.rec", capsys)
    assert main(["unpack", str(tmp_path / "faces.rec"), str(tmp_path / "n"), "--numbered"]) == 0
    assert sorted(p.name for p in (tmp_path / "n").iterdir()) == ["0", "1", "2", "list.txt"]
    # a list file has labels only: re-packing under the same name drops the stale sidecar
    (tmp_path / "train.lst").write_text((tmp_path / "n" / "list.txt").read_text())
    (tmp_path / "n" / "list.txt").unlink()
    assert main(["pack", str(tmp_path / "train.lst"), str(tmp_path / "faces.rec"), "--root",
                 str(tmp_path / "n"), "--workers", "1"]) == 0  # fmt: skip
    assert not identity_names_path(tmp_path / "faces.rec").exists()
    assert read_identity_names(tmp_path / "faces.rec") is None


def test_a_stale_or_hostile_sidecar_is_refused(photos, tmp_path, capsys):
    root, _ = photos
    _pack(root, tmp_path / "faces.rec", capsys)
    sidecar = identity_names_path(tmp_path / "faces.rec")
    record = json.loads(sidecar.read_text(encoding="utf-8"))

    sidecar.write_text(json.dumps(dict(record, idx_sha256="0" * 64)))
    assert main(["unpack", str(tmp_path / "faces.rec"), str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert f"{sidecar}: written for another version of faces.rec" in err
    assert not (tmp_path / "o1").exists()

    sidecar.write_text(json.dumps(dict(record, names=["a", "../escape", "c"])))
    assert main(["unpack", str(tmp_path / "faces.rec"), str(tmp_path / "o2")]) == 2
    assert "identity 1 has an unusable name '../escape'" in capsys.readouterr().err
    assert not (tmp_path / "escape").exists() and not (tmp_path / "o2").exists()

    sidecar.write_text(json.dumps(dict(record, names=["a", "b"])))
    assert main(["unpack", str(tmp_path / "faces.rec"), str(tmp_path / "o3")]) == 2
    assert "2 names for 3 identities" in capsys.readouterr().err
