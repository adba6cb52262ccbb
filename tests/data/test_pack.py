"""pack -> read round trips on real Omniglot images, list files, and bad input."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from partialfc.cli import main as cli_main
from partialfc.data import ImageFolderDataset, ListFileDataset, RecordIODataset, load_omniglot
from partialfc.data.decode import encode_image
from partialfc.data.pack import pack_images


@pytest.fixture(scope="module")
def omniglot_folder(tmp_path_factory):
    """60 real Omniglot drawings (3 classes x 20) as PNG files, one folder per class."""
    root = tmp_path_factory.mktemp("omniglot") / "src"
    data = load_omniglot("background", 28)
    for i in range(60):
        folder = root / f"class_{data.labels[i]:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.png").write_bytes(encode_image(data.images[i], ".png"))
    return root, data.images[:60], data.labels[:60]


@pytest.mark.parametrize("header", [True, False])
def test_pack_roundtrip_equals_source(omniglot_folder, tmp_path, header):
    root, source_images, source_labels = omniglot_folder
    folder = ImageFolderDataset(root, grayscale=True)
    report = pack_images(
        folder.paths, folder.labels, tmp_path / "o.rec", workers=2, header=header, progress=False
    )
    assert (report.images, report.classes, report.has_header) == (60, 3, header)
    ds = RecordIODataset(tmp_path / "o.rec", grayscale=True)
    assert ds.layout.has_header == header and len(ds) == 60
    got = np.stack([ds[i][0][0].numpy() for i in range(60)])
    np.testing.assert_array_equal(got, source_images)  # PNG bytes are stored unchanged
    np.testing.assert_array_equal(ds.labels, source_labels)
    np.testing.assert_array_equal([ds[i][1] for i in range(60)], source_labels)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.idx", "o.rec"]  # no temporaries


def test_cli_pack_list_file_and_unpack(omniglot_folder, tmp_path, capsys):
    root, source_images, source_labels = omniglot_folder
    folder = ImageFolderDataset(root)
    order = np.random.default_rng(0).permutation(60)  # a list file in arbitrary order
    lines = [f"{folder.paths[i]} {folder.labels[i]}" for i in order]
    (tmp_path / "train.lst").write_text("\n".join(lines) + "\n")
    assert (
        cli_main(["pack", str(tmp_path / "train.lst"), str(tmp_path / "t.rec"), "--workers", "1"])
        == 0
    )
    packed = RecordIODataset(tmp_path / "t.rec")
    assert cli_main(["unpack", str(tmp_path / "t.rec"), str(tmp_path / "out")]) == 0
    unpacked = ImageFolderDataset(tmp_path / "out")
    listed = ListFileDataset(tmp_path / "out" / "list.txt")
    # pack groups images by label, keeping the list's order within a label
    expected = order[np.argsort(folder.labels[order], kind="stable")]
    for i, j in enumerate(expected):
        assert torch.equal(packed[i][0], folder[j][0]) and packed[i][1] == folder[j][1]
        assert torch.equal(unpacked[i][0], folder[j][0]) and unpacked[i][1] == folder[j][1]
        assert listed[i][1] == folder[j][1]
    assert cli_main(["unpack", str(tmp_path / "t.rec"), str(tmp_path / "out")]) == 2
    assert f"partialfc unpack: {tmp_path / 'out'}: already exists" in capsys.readouterr().err


def test_pack_resize_reencodes_jpeg(omniglot_folder, tmp_path):
    root, source_images, _ = omniglot_folder
    folder = ImageFolderDataset(root)
    pack_images(folder.paths[:5], [0] * 5, tmp_path / "r.rec", resize=56, progress=False)
    ds = RecordIODataset(tmp_path / "r.rec")
    assert ds[0][0].shape == (3, 56, 56)
    assert ds.reader.read(1)[24:27] == b"\xff\xd8\xff"


def test_unreadable_image_fails_cleanly_or_is_skipped(omniglot_folder, tmp_path):
    root, _, _ = omniglot_folder
    folder = ImageFolderDataset(root)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    paths = folder.paths[:4] + [str(bad)]
    with pytest.raises(ValueError, match=r"broken.png: unreadable image"):
        pack_images(paths, [0, 0, 1, 1, 1], tmp_path / "b.rec", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.png"]  # nothing half-written
    report = pack_images(paths, [0, 0, 1, 1, 1], tmp_path / "b.rec", skip_bad=True, progress=False)
    assert report.images == 4 and len(report.skipped) == 1
    with pytest.raises(ValueError, match=r"labels are not contiguous 0..2.*\[1\]"):
        pack_images(paths[:2], [0, 2], tmp_path / "d.rec", progress=False)
    with pytest.raises(ValueError, match=r"classes \[1\] have no readable image"):
        pack_images(
            paths[:2] + [str(bad)], [0, 0, 1], tmp_path / "c.rec", skip_bad=True, progress=False
        )


def test_empty_identity_folder_and_bad_lists(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(encode_image(np.zeros((4, 4), np.uint8), ".png"))
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=r"/b: identity folder has no images"):
        ImageFolderDataset(tmp_path)
    (tmp_path / "gap.lst").write_text("a/x.png 0\na/x.png 2\n")
    with pytest.raises(ValueError, match=r"gap.lst: labels are not contiguous 0..2.*\[1\]"):
        ListFileDataset(tmp_path / "gap.lst")
    assert ListFileDataset(tmp_path / "gap.lst", remap_labels=True).labels.tolist() == [0, 1]
    (tmp_path / "bad.lst").write_text("a/x.png zero\n")
    with pytest.raises(ValueError, match=r"bad.lst: line 1"):
        ListFileDataset(tmp_path / "bad.lst")


def test_unreadable_image_in_folder_dataset(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ok.png").write_bytes(encode_image(np.full((4, 4), 7, np.uint8), ".png"))
    (tmp_path / "a" / "zz.png").write_bytes(b"garbage")
    ds = ImageFolderDataset(tmp_path)
    with pytest.raises(ValueError, match=r"zz.png: not a decodable image"):
        ds[1]
    skipping = ImageFolderDataset(tmp_path, on_error="skip")
    assert int(skipping[1][0][0, 0, 0]) == 7 and skipping.skipped[0].endswith("zz.png")


def test_image_whose_header_claims_too_many_pixels_is_refused_or_skipped(
    omniglot_folder, tmp_path, capsys
):
    import json

    from tests.data.test_decode import png_claiming

    root, _, _ = omniglot_folder
    folder = ImageFolderDataset(root)
    src = tmp_path / "src"
    for path, label in zip(folder.paths[:4], [0, 0, 1, 1], strict=True):
        (src / str(label)).mkdir(parents=True, exist_ok=True)
        (src / str(label) / Path(path).name).write_bytes(Path(path).read_bytes())
    (src / "1" / "zz_huge.png").write_bytes(png_claiming(60000, 60000))
    out = tmp_path / "out"
    out.mkdir()
    assert cli_main(["pack", str(src), str(out / "h.rec"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "zz_huge.png: unreadable image" in err and "60000 x 60000 = 3600000000 pixels" in err
    assert list(out.iterdir()) == []
    assert cli_main(["pack", str(src), str(out / "h.rec"), "--workers", "1", "--skip-bad"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 4 and len(report["skipped"]) == 1
    assert (
        "zz_huge.png" in report["skipped"][0]
        and "above the limit of 67108864" in (report["skipped"][0])
    )
    assert sorted(p.name for p in out.iterdir()) == ["h.idx", "h.names.json", "h.rec"]
    # the limit is an option: 28 x 28 drawings are above a 700-pixel limit
    args = ["pack", str(src), str(out / "s.rec"), "--workers", "1", "--max-image-pixels", "700"]
    assert cli_main(args) == 2
    assert "28 x 28 = 784 pixels, above the limit of 700" in capsys.readouterr().err
    assert cli_main([*args[:-1], "0"]) == 2
    assert "--max-image-pixels must be an integer >= 1, got 0" in capsys.readouterr().err


class _FullDisk:
    """A file whose writes fail with ENOSPC after ``room`` bytes; closing it then fails too,
    as the final flush of a buffered file on a full disk does (``fail_at_close``: closing
    fails even though every write went through)."""

    def __init__(self, f, room: int, fail_at_close: bool):
        self.f, self.room, self.fail_at_close = f, room, fail_at_close

    @staticmethod
    def _full():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(self, data):
        self.room -= len(data)
        if self.room < 0:
            raise self._full()
        return self.f.write(data)

    def tell(self):
        return self.f.tell()

    @property
    def closed(self):
        return self.f.closed

    def close(self):
        self.f.close()
        if self.room < 0 or self.fail_at_close:
            raise self._full()


@pytest.mark.parametrize("room, fail_at_close", [(0, False), (3000, False), (10**9, True)])
def test_full_disk_leaves_no_temporary_files(
    omniglot_folder, tmp_path, monkeypatch, room, fail_at_close
):
    """ENOSPC while writing, or at the final flush: the error names the output, the old
    output is untouched, and no temporary file is left behind to keep the disk full."""
    from partialfc.data import recordio

    root, _, _ = omniglot_folder
    folder = ImageFolderDataset(root)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.rec").write_bytes(b"previous set")

    def full_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115 - handed to the writer
        return _FullDisk(f, room, fail_at_close) if "w" in mode else f

    monkeypatch.setattr(recordio, "open", full_open, raising=False)
    with pytest.raises(OSError, match=r"old.rec: cannot write: No space left on device") as info:
        pack_images(folder.paths[:10], [0] * 5 + [1] * 5, out / "old.rec", progress=False)
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in out.iterdir()) == ["old.rec"]
    assert (out / "old.rec").read_bytes() == b"previous set"


def test_pack_into_a_missing_folder_names_it(omniglot_folder, tmp_path, capsys):
    root, _, _ = omniglot_folder
    folder = ImageFolderDataset(root)
    target = tmp_path / "missing" / "x.rec"
    with pytest.raises(FileNotFoundError, match=rf"^{target}: output folder .*missing does not"):
        pack_images(folder.paths[:2], [0, 0], target, progress=False)
    assert cli_main(["pack", str(root), str(target), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{target}: output folder {target.parent} does not exist" in err and ".tmp" not in err
    assert list(tmp_path.iterdir()) == []


def test_fit_square_pads_crops_or_stretches_a_portrait_image():
    from partialfc.data.pack import fit_square

    image = np.full((112, 92), 200, dtype=np.uint8)  # ORL-shaped, 92 wide x 112 high
    padded = fit_square(image, 112, "pad")
    assert padded.shape == (112, 112)
    assert (padded[:, :10] == 0).all() and (padded[:, -10:] == 0).all()  # black side bars
    assert (padded[:, 10:-10] == 200).all()
    assert (fit_square(image, 56, "crop") == 200).all()  # the centred 92x92, scaled
    assert (fit_square(image, 112, "stretch") == 200).all()
    with pytest.raises(ValueError, match="fit must be one of pad, crop, stretch"):
        fit_square(image, 112, "squash")


@pytest.mark.parametrize(
    "fit, how",
    [
        (None, "padding with black (--fit pad)"),
        ("crop", "cropping the centred square (--fit crop)"),
        ("stretch", "stretching (--fit stretch)"),
    ],
)
def test_pack_resize_says_how_non_square_images_were_made_square(
    omniglot_folder, tmp_path, capsys, fit, how
):
    _, images, _ = omniglot_folder
    for c in range(2):
        (tmp_path / "src" / f"id{c}").mkdir(parents=True)
        for j in range(3):
            image = images[3 * c + j]
            image = image[:, 4:-4] if (c, j) != (0, 0) else image  # 5 are 28 high x 20 wide
            (tmp_path / "src" / f"id{c}" / f"{j}.png").write_bytes(encode_image(image, ".png"))
    args = ["pack", str(tmp_path / "src"), str(tmp_path / "o.rec"), "--workers", "1"]
    args += ["--resize", "56", *(["--fit", fit] if fit else [])]
    assert cli_main(args) == 0
    out, err = capsys.readouterr()
    assert f"resized 5 non-square images to 56x56 by {how}\n" in err
    assert json.loads(out)["resize"] == {"size": 56, "fit": fit or "pad", "non_square": 5}
    assert RecordIODataset(tmp_path / "o.rec")[5][0].shape == (3, 56, 56)


def test_pack_resize_of_square_images_says_nothing_about_fit(omniglot_folder, tmp_path, capsys):
    root, _, _ = omniglot_folder
    args = ["pack", str(root), str(tmp_path / "o.rec"), "--workers", "1", "--resize", "56"]
    assert cli_main(args) == 0
    out, err = capsys.readouterr()
    assert "non-square" not in err and json.loads(out)["resize"]["non_square"] == 0
