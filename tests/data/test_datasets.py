"""Labelled image folders: identity sub-folders, or one identity per image in a flat folder."""

from __future__ import annotations

import numpy as np
import pytest

from partialfc.data.datasets import scan_image_folder, scan_labelled_images


def test_flat_folder_gives_one_identity_per_image_and_sub_folders_win(tmp_path):
    for name in ("b.png", "a.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    paths, labels, names = scan_labelled_images(tmp_path)
    assert paths == [str(tmp_path / "a.jpg"), str(tmp_path / "b.png")]
    assert labels.tolist() == [0, 1] and names == ["a", "b"]
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "1.png").write_bytes(b"")
    paths, labels, names = scan_labelled_images(tmp_path)  # identity folders: loose files ignored
    assert (paths, names) == ([str(tmp_path / "carol" / "1.png")], ["carol"])
    assert np.array_equal(labels, scan_image_folder(tmp_path)[1])


def test_empty_or_missing_folders_are_named(tmp_path):
    with pytest.raises(ValueError, match=rf"^{tmp_path}: no images \(expected"):
        scan_labelled_images(tmp_path)
    with pytest.raises(ValueError, match="nope: image folder not found"):
        scan_labelled_images(tmp_path / "nope")
