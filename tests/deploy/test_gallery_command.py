"""``partialfc gallery enroll | remove | query`` against the older ``partialfc search`` spelling:
the same galleries, the same answers, and a note on stderr for the old names."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from partialfc.cli import main
from partialfc.deploy import Gallery


@pytest.fixture(scope="module")
def folder(omniglot_images, tmp_path_factory):
    """5 identities × 4 PNG drawings in root/<identity>/<image>.png."""
    images, _ = omniglot_images
    root = tmp_path_factory.mktemp("people")
    for c in range(5):
        (root / f"p{c}").mkdir()
        for j in range(4):
            cv2.imwrite(str(root / f"p{c}" / f"{j}.png"), images[c * 20 + j])
    return root


def _lines(capsys):
    return [json.loads(r) for r in capsys.readouterr().out.strip().splitlines()]


def test_the_new_names_build_the_gallery_the_old_spelling_builds(
    checkpoint, folder, tmp_path, capsys
):
    new, old = tmp_path / "new.npz", tmp_path / "old.npz"
    model = str(checkpoint)
    assert main(["gallery", "enroll", model, str(new), str(folder)]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["search", model, str(old), "--enroll", str(folder)]) == 0
    err = capsys.readouterr().err
    assert "note: `partialfc search` is now `partialfc gallery enroll | remove | query`" in err
    a, b = Gallery.open(new), Gallery.open(old)
    assert sorted(a.identities) == sorted(b.identities) == [f"p{c}" for c in range(5)]
    for name in a.identities:
        np.testing.assert_array_equal(a.template(name), b.template(name))

    query = folder  # its own images: each one's identity ranks first
    assert main(["gallery", "query", model, str(new), str(query), "--top-k", "2"]) == 0
    rows_new = _lines(capsys)
    assert main(["search", model, str(old), "--query", str(query), "--top-k", "2"]) == 0
    assert _lines(capsys) == rows_new and len(rows_new) == 20
    for row in rows_new:
        assert len(row["matches"]) == 2 and f"/{row['matches'][0]['identity']}/" in row["query"]

    assert main(["gallery", "remove", model, str(new), "p3", "p4"]) == 0
    assert sorted(Gallery.open(new).identities) == ["p0", "p1", "p2"]


def test_errors_name_the_new_command(checkpoint, folder, tmp_path, capsys):
    gallery = tmp_path / "g.npz"
    assert main(["gallery", "enroll", str(checkpoint), str(gallery), str(folder)]) == 0
    capsys.readouterr()
    assert main(["gallery", "remove", str(checkpoint), str(gallery), "alice"]) == 2
    assert capsys.readouterr().err.startswith("partialfc gallery: identity")
    args = ["gallery", "query", str(checkpoint), str(gallery), str(folder), "--enroll", "x"]
    assert main(args) == 2
    assert "--enroll belongs to `partialfc gallery enroll`" in capsys.readouterr().err


def test_each_action_lists_only_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["gallery", "enroll", "--help"])
    enroll = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["gallery", "query", "--help"])
    query = capsys.readouterr().out
    assert "--top-k" in query and "--threshold" in query and "--top-k" not in enroll
    assert "--enroll" not in enroll and "--query" not in query and "INPUT" in enroll
