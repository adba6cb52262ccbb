"""An InsightFace model pack folder (SCRFD detection ONNX + recognition ONNX + others) as the
model and the detector of ``embed``/``search``/``verify``; graphs built by the test."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from partialfc.backbone.embedder import Embedder
from partialfc.cli import main
from partialfc.data.align import align_face
from partialfc.detect.base import largest_face
from partialfc.detect.scrfd import SCRFD
from tests.insightface_graphs import other_graph, recognition_graph, scrfd_red_graph


@pytest.fixture()
def pack(tmp_path):
    folder = tmp_path / "buffalo_l"
    folder.mkdir()
    other_graph(folder / "1k3d68.onnx", side=192)
    scrfd_red_graph(folder / "det_10g.onnx")
    other_graph(folder / "genderage.onnx", side=96)
    recognition_graph(folder / "w600k_r50.onnx")
    return folder


def _square(top, left, side, channel=0):
    image = np.zeros((240, 320, 3), np.uint8)
    image[top : top + side, left : left + side, channel] = 255
    return image


@pytest.fixture()
def photos(tmp_path):
    root = tmp_path / "photos"
    for name, image in {
        "alice/a1.png": _square(40, 64, 64),
        "bob/b1.png": _square(96, 160, 96),
        "bob/wall.png": _square(40, 64, 64, channel=2),  # blue: the red detector finds nothing
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / name), image[..., ::-1])  # stored as BGR files
    return root


def test_embed_with_a_pack_uses_its_detector_and_recogniser(pack, photos, tmp_path, capsys):
    out = tmp_path / "e.npz"
    assert main(["embed", str(pack), str(photos), "--out", str(out), "--detect"]) == 0
    err = capsys.readouterr().err
    assert f"face detector: SCRFD {pack / 'det_10g.onnx'}" in err
    assert f"{pack / 'w600k_r50.onnx'}: InsightFace preprocessing: 112x112" in err
    assert "no face found in 1 photo(s)" in err
    rgb = _square(40, 64, 64)
    face = largest_face(SCRFD(pack / "det_10g.onnx").detect(rgb))
    crop = align_face(rgb, face.landmarks, size=112)
    expected = Embedder.load(pack / "w600k_r50.onnx", preprocessing="insightface").embed(crop[None])
    with np.load(out) as f:
        assert f["embeddings"].shape == (2, 16)
        np.testing.assert_allclose(f["boxes"][0], face.box)
        np.testing.assert_allclose(f["embeddings"][0], expected[0], atol=1e-5)


def test_search_and_verify_with_a_pack(pack, photos, tmp_path, capsys):
    gallery = tmp_path / "g.npz"
    assert main(["search", str(pack), str(gallery), "--enroll", str(photos), "--detect"]) == 0
    capsys.readouterr()
    query = photos / "bob" / "b1.png"
    assert (
        main(["search", str(pack), str(gallery), "--query", str(query), "--detector", str(pack)])
        == 0
    )
    (row,) = [json.loads(r) for r in capsys.readouterr().out.strip().splitlines()]
    assert row["matches"][0]["identity"] == "bob"
    assert row["matches"][0]["score"] == pytest.approx(1.0, abs=1e-5)

    from partialfc.deploy.verify import CalibratedThreshold

    t = tmp_path / "t.json"
    CalibratedThreshold(0.5, 0.01, 0, 0, 100, (0.0, 0.03)).save(t)
    a = photos / "alice" / "a1.png"
    verify = ["verify", str(pack), "--detect", "--threshold", str(t), "--allow-other-model"]
    assert main([*verify, "--pair", str(a), str(a)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["score"] == pytest.approx(1.0, abs=1e-5) and result["match"]


def test_a_folder_without_a_recogniser_is_named_with_what_it_holds(tmp_path, photos, capsys):
    folder = tmp_path / "half_pack"
    folder.mkdir()
    scrfd_red_graph(folder / "det_10g.onnx")
    other_graph(folder / "2d106det.onnx", side=192)
    assert (
        main(["embed", str(folder), str(photos), "--out", str(tmp_path / "e.npz"), "--detect"]) == 2
    )
    err = capsys.readouterr().err
    assert f"partialfc embed: {folder}: no recognition ONNX" in err
    assert "2d106det.onnx (input (N, 3, 192, 192), 1 output)" in err
    assert "det_10g.onnx (input (1, 3, ?, ?), 9 outputs)" in err
    assert not (tmp_path / "e.npz").exists()


def test_detector_option_refuses_a_folder_without_scrfd(tmp_path, photos, capsys):
    folder = tmp_path / "rec_only"
    folder.mkdir()
    recognition_graph(folder / "w600k_r50.onnx")
    out = tmp_path / "e.npz"
    args = ["embed", str(folder), str(photos), "--out", str(out), "--detector", str(folder)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{folder}: no SCRFD detection ONNX" in err
    assert "w600k_r50.onnx (input (None, 3, 112, 112), 1 output)" in err


def test_a_128_pixel_recogniser_aligns_on_insightface_template(tmp_path, photos):
    folder = tmp_path / "pack128"
    folder.mkdir()
    scrfd_red_graph(folder / "det.onnx")
    recognition_graph(folder / "rec.onnx", side=128)
    out = tmp_path / "e.npz"
    assert main(["embed", str(folder), str(photos / "alice"), "--out", str(out), "--detect"]) == 0
    rgb = _square(40, 64, 64)
    face = largest_face(SCRFD(folder / "det.onnx").detect(rgb))
    template = np.array(
        [[46.2946, 51.6963], [81.5318, 51.5014], [64.0252, 71.7366], [49.5493, 92.3655]]
        + [[78.7299, 92.2041]]
    )
    crop = align_face(rgb, face.landmarks, size=128, template=template)
    expected = Embedder.load(folder).embed(crop[None])
    with np.load(out) as f:
        np.testing.assert_allclose(f["embeddings"][0], expected[0], atol=1e-5)
