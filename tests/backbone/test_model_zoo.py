"""InsightFace model-zoo recognition ONNX: the graph rule and the preprocessing it implies,
pinned against the blob InsightFace's ArcFaceONNX builds (``cv2.dnn.blobFromImages`` on BGR
crops with ``swapRB=True``), computed here independently of partialfc."""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from partialfc.backbone.embedder import Embedder
from partialfc.backbone.model_zoo import (
    find_recognition_onnx,
    insightface_spec,
    normalises_inside,
    recognition_problem,
)
from partialfc.onnx_layout import read_onnx_layout
from tests.insightface_graphs import other_graph, recognition_graph, scrfd_red_graph


def _crops(count=5, side=112, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, side, side, 3), dtype=np.uint8)


def _insightface_blob(rgb: np.ndarray, mean: float, std: float) -> np.ndarray:
    """ArcFaceONNX.get_feat's input: BGR images, blobFromImages(1/std, mean, swapRB=True)."""
    bgr = [np.ascontiguousarray(image[..., ::-1]) for image in rgb]
    side = rgb.shape[1]
    return cv2.dnn.blobFromImages(bgr, 1.0 / std, (side, side), (mean, mean, mean), swapRB=True)


@pytest.mark.parametrize(("inside", "mean", "std"), [(False, 127.5, 127.5), (True, 0.0, 1.0)])
def test_preprocessing_equals_arcface_onnx_blob(tmp_path, inside, mean, std):
    path = recognition_graph(tmp_path / "r.onnx", normalises_inside=inside)
    layout = read_onnx_layout(path)
    assert normalises_inside(layout) is inside
    spec = insightface_spec(layout)
    assert (spec.input_size, spec.embedding_dim, spec.colour_order) == ((112, 112), 16, "RGB")
    rgb = _crops()
    expected = _insightface_blob(rgb, mean, std)
    np.testing.assert_allclose(spec.preprocess(rgb), expected, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize(("inside", "mean", "std"), [(False, 127.5, 127.5), (True, 0.0, 1.0)])
def test_embedder_gives_arcface_onnx_features(tmp_path, inside, mean, std):
    path = recognition_graph(tmp_path / "w600k_r50.onnx", normalises_inside=inside)
    rgb = _crops(7)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"input.1": _insightface_blob(rgb, mean, std)})[0]
    for preprocessing in ("auto", "insightface"):
        embedder = Embedder.load(path, preprocessing=preprocessing)
        assert embedder.preprocessing_source == "insightface"
        np.testing.assert_allclose(embedder.embed_raw(rgb), theirs, rtol=1e-4, atol=1e-4)
    # the channel order matters for this graph: BGR fed as RGB gives other features
    assert np.abs(embedder.embed_raw(rgb[..., ::-1].copy()) - theirs).max() > 1e-2


def test_the_graph_rule_names_what_does_not_fit(tmp_path):
    landmark = read_onnx_layout(other_graph(tmp_path / "2d106det.onnx", side=192))
    assert recognition_problem(landmark) == "input sides 192x192: an InsightFace landmark model"
    two = read_onnx_layout(other_graph(tmp_path / "two.onnx", side=112, outputs=2))
    assert recognition_problem(two) == "outputs [('N', 3), ('N', 3)] are not one (N, d) embedding"
    small = read_onnx_layout(other_graph(tmp_path / "small.onnx", side=96))
    assert recognition_problem(small) == (
        "input sides 96x96 are not one fixed S >= 112 divisible by 16"
    )
    detector = read_onnx_layout(scrfd_red_graph(tmp_path / "det.onnx"))
    assert "not one fixed S" in recognition_problem(detector)
    with pytest.raises(ValueError, match="small.onnx: not an InsightFace recognition model"):
        insightface_spec(small)


def test_stored_spec_wins_and_stored_only_refuses_a_bare_graph(tmp_path):
    path = recognition_graph(tmp_path / "r.onnx")
    with pytest.raises(ValueError, match="r.onnx: no preprocessing spec.*'insightface'"):
        Embedder.load(path, preprocessing="stored")
    bare = other_graph(tmp_path / "x.onnx", side=96)
    with pytest.raises(ValueError, match="x.onnx: no preprocessing spec.*input sides 96x96"):
        Embedder.load(bare)
    with pytest.raises(ValueError, match="preprocessing must be one of auto, stored"):
        Embedder.load(path, preprocessing="arcface")


def test_a_model_pack_folder_embeds_with_its_recognition_onnx(tmp_path):
    pack = tmp_path / "buffalo_s"
    pack.mkdir()
    other_graph(pack / "1k3d68.onnx", side=192)
    scrfd_red_graph(pack / "det_500m.onnx")
    recognition_graph(pack / "w600k_mbf.onnx", seed=3)
    assert find_recognition_onnx(pack).name == "w600k_mbf.onnx"
    embedder = Embedder.load(pack)
    assert embedder.backend.path.name == "w600k_mbf.onnx"
    direct = Embedder.load(pack / "w600k_mbf.onnx")
    np.testing.assert_array_equal(embedder.embed(_crops()), direct.embed(_crops()))
    with pytest.raises(ValueError, match="backend 'torch' cannot run a folder"):
        Embedder.load(pack, backend="torch")


def test_a_folder_without_a_recogniser_lists_what_it_holds(tmp_path):
    pack = tmp_path / "pack"
    pack.mkdir()
    other_graph(pack / "genderage.onnx", side=96)
    scrfd_red_graph(pack / "det_10g.onnx")
    with pytest.raises(ValueError) as err:
        Embedder.load(pack)
    message = str(err.value)
    assert message.startswith(f"{pack}: no recognition ONNX")
    assert "det_10g.onnx (input (1, 3, ?, ?), 9 outputs)" in message
    assert "genderage.onnx (input (N, 3, 96, 96), 1 output)" in message


def test_insightface_arcface_onnx_agrees(tmp_path):
    arcface = pytest.importorskip("insightface.model_zoo.arcface_onnx", reason="no insightface")
    path = recognition_graph(tmp_path / "r.onnx")
    model = arcface.ArcFaceONNX(model_file=str(path))
    rgb = _crops(4)
    theirs = model.get_feat([np.ascontiguousarray(c[..., ::-1]) for c in rgb])
    np.testing.assert_allclose(Embedder.load(path).embed_raw(rgb), theirs, atol=1e-4)


def test_a_128_pixel_graph_takes_insightface_shifted_template(tmp_path):
    spec = insightface_spec(read_onnx_layout(recognition_graph(tmp_path / "r.onnx", side=128)))
    # norm_crop for 128: the 112 template at scale 128 / 128 moved 8 pixels right
    expected = [
        [46.2946, 51.6963],
        [81.5318, 51.5014],
        [64.0252, 71.7366],
        [49.5493, 92.3655],
        [78.7299, 92.2041],
    ]
    np.testing.assert_allclose(spec.alignment_landmarks, expected, atol=1e-9)
    big = insightface_spec(read_onnx_layout(recognition_graph(tmp_path / "b.onnx", side=224)))
    assert big.alignment_landmarks is None  # 112 divides 224: the template scaled, the default
