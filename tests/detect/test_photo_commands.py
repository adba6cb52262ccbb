"""``embed|verify|search --detect`` on real photos: faces are found, aligned, and traced."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch

from partialfc.cli import main
from partialfc.deploy import Embedder

MODEL_CONFIG = {
    "name": "iresnet_small",
    "kwargs": {"embedding_dim": 32, "input_size": 56, "in_channels": 3},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained colour model (the commands' plumbing, not accuracy, is under test)."""
    from partialfc.models import build_model
    from partialfc.train.checkpoint import save_backbone

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt")
    save_backbone(build_model(MODEL_CONFIG["name"], **MODEL_CONFIG["kwargs"]), MODEL_CONFIG, path)
    return path


@pytest.fixture(scope="module")
def photos(lfw_photos, tmp_path_factory):
    """alice: 2 photos; bob: a photo with two faces side by side and a blank wall."""
    root = tmp_path_factory.mktemp("photos")
    for name in ("alice", "bob"):
        (root / name).mkdir()

    def write(path, rgb):
        cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))

    write(root / "alice" / "a1.png", lfw_photos[0][1])
    write(root / "alice" / "a2.png", lfw_photos[1][1])
    group = np.full((200, 420, 3), 90, np.uint8)
    group[25:175, 10:160], group[25:175, 250:400] = lfw_photos[2][1], lfw_photos[3][1]
    write(root / "bob" / "group.png", group)
    write(root / "bob" / "wall.png", np.full((120, 120, 3), 128, np.uint8))
    return root


def test_embed_detect_records_source_and_box_of_every_row(checkpoint, photos, tmp_path, capsys):
    out = tmp_path / "e.npz"
    args = ["embed", str(checkpoint), str(photos), "--out", str(out), "--detect"]
    assert main(args) == 0
    assert "no face found in 1 photo(s), skipped" in capsys.readouterr().err
    with np.load(out, allow_pickle=False) as f:
        assert f["embeddings"].shape == (3, 32)
        sources = [s.rsplit("/", 2)[-2] + "/" + s.rsplit("/", 1)[-1] for s in f["sources"]]
        assert sources == ["alice/a1.png", "alice/a2.png", "bob/group.png"]
        assert list(f["labels"]) == [0, 0, 1] and list(f["identity_names"]) == ["alice", "bob"]
        boxes = f["boxes"]
        assert boxes.shape == (3, 4) and f["landmarks"].shape == (3, 5, 2)
        assert list(f["no_face"]) == [str(photos / "bob" / "wall.png")]
    # the row equals the API on the aligned crop of the same detection
    from partialfc.data.align import align_face
    from partialfc.detect import detect_and_align, load_detector

    rgb = cv2.cvtColor(cv2.imread(str(photos / "alice" / "a1.png")), cv2.COLOR_BGR2RGB)
    (aligned,) = detect_and_align(rgb, load_detector(), size=56)
    np.testing.assert_allclose(boxes[0], aligned.face.box, atol=1e-4)
    crop = align_face(rgb, aligned.face.landmarks, size=56)
    with np.load(out) as f:
        np.testing.assert_allclose(
            f["embeddings"][0], Embedder.load(checkpoint).embed(crop[None])[0], atol=1e-5
        )

    # --all-faces: both faces of the group photo, each with its own box
    args = [*args[:4], str(tmp_path / "all.npz"), "--detect", "--all-faces"]
    assert main(args) == 0
    with np.load(tmp_path / "all.npz") as f:
        group_rows = [i for i, s in enumerate(f["sources"]) if s.endswith("group.png")]
        assert len(group_rows) == 2
        centres = sorted(((f["boxes"][i, 0] + f["boxes"][i, 2]) / 2) for i in group_rows)
        assert abs(centres[0] - 85) < 20 and abs(centres[1] - 325) < 20


def test_search_and_verify_with_detect(checkpoint, photos, tmp_path, capsys):
    gallery = tmp_path / "g.npz"
    base = ["search", str(checkpoint), str(gallery), "--detect"]
    assert main([*base, "--enroll", str(photos)]) == 0
    capsys.readouterr()
    assert main([*base, "--query", str(photos / "bob" / "group.png"), "--all-faces"]) == 0
    rows = [json.loads(r) for r in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 2 and all(len(r["box"]) == 4 for r in rows)
    assert {m["identity"] for m in rows[0]["matches"]} == {"alice", "bob"}

    from partialfc.deploy.verify import CalibratedThreshold

    t = tmp_path / "t.json"
    CalibratedThreshold(0.5, 0.01, 0, 0, 100, (0.0, 0.03)).save(t)
    a, wall = photos / "alice" / "a1.png", photos / "bob" / "wall.png"
    verify = ["verify", str(checkpoint), "--detect", "--threshold", str(t), "--pair"]
    assert main([*verify, str(a), str(a)]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["score"] == pytest.approx(1.0, abs=1e-5) and row["match"]
    assert main([*verify, str(a), str(wall)]) == 2
    assert f"{wall}: no face found" in capsys.readouterr().err
