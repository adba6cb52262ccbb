"""SCRFD decoding on SCRFD-shaped ONNX graphs built here: boxes, landmarks, threshold, NMS and
the input preprocessing checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.detect import load_detector
from partialfc.detect.nms import nms
from partialfc.detect.scrfd import SCRFD, anchor_centres, find_scrfd_onnx
from tests.insightface_graphs import (
    other_graph,
    recognition_graph,
    scrfd_constant_graph,
    scrfd_red_graph,
)

KPS = [0, 0, 1, 0, 0.5, 0.5, 0, 1, 1, 1]  # five landmarks, in strides from the anchor centre


def test_anchor_centres_are_row_major_with_consecutive_anchors():
    centres = anchor_centres(2, 3, 8, 2)
    expected = [[0, 0], [0, 0], [8, 0], [8, 0], [16, 0], [16, 0]]
    expected += [[0, 8], [0, 8], [8, 8], [8, 8], [16, 8], [16, 8]]
    np.testing.assert_array_equal(centres, expected)


def test_decoding_three_strides_two_anchors_by_hand(tmp_path):
    # 64x64 input; stride 8 has 8x8 cells, 2 anchors: cell (row 2, col 3) anchor 0 = index 38
    entries = {
        (8, 38): (0.9, [1, 1, 2, 2], KPS),  # centre (24, 16)
        (8, 39): (0.8, [1, 1, 2, 2], KPS),  # same box, lower score: NMS drops it
        (8, 0): (0.49, [1, 1, 1, 1], KPS),  # under the 0.5 threshold
        (32, 5): (0.7, [0.5, 0.5, 0.5, 0.5], [0] * 10),  # stride 32 cell (1, 0), anchor 1
    }
    path = scrfd_constant_graph(tmp_path / "det.onnx", (64, 64), (8, 16, 32), 2, entries)
    detector = SCRFD(path)
    assert detector.input_size == (64, 64)  # fixed in the graph
    # a 128 (high) x 96 image fits the 64x64 input at scale 0.5: coordinates double
    found = detector.detect_arrays(np.zeros((128, 96, 3), np.uint8))
    np.testing.assert_array_equal(found.scores, np.float32([0.9, 0.7]))
    np.testing.assert_array_equal(found.boxes, [[32, 16, 80, 64], [-32, 32, 32, 96]])
    np.testing.assert_array_equal(
        found.keypoints[0], [[48, 32], [64, 32], [56, 40], [48, 48], [64, 48]]
    )
    np.testing.assert_array_equal(found.keypoints[1], [[0, 64]] * 5)
    faces = detector.detect(np.zeros((128, 96, 3), np.uint8))
    assert [f.score for f in faces] == pytest.approx([0.9, 0.7])
    low = SCRFD(path, score_threshold=0.4).detect_arrays(np.zeros((128, 96, 3), np.uint8))
    assert low.scores.tolist() == pytest.approx([0.9, 0.7, 0.49])


def test_decoding_five_strides_one_anchor_batched_outputs(tmp_path):
    entries = {
        (64, 3): (0.8, [0.25, 0.25, 0.5, 0.5], KPS),  # cell (1, 1): centre (64, 64)
        (128, 0): (0.6, [0.5, 0.5, 0.5, 0.5], [0] * 10),  # centre (0, 0)
    }
    path = scrfd_constant_graph(
        tmp_path / "det.onnx", (128, 128), (8, 16, 32, 64, 128), 1, entries, batched=True
    )
    found = SCRFD(path).detect_arrays(np.zeros((128, 128, 3), np.uint8))
    np.testing.assert_array_equal(found.boxes, [[48, 48, 96, 96], [-64, -64, 64, 64]])
    np.testing.assert_array_equal(found.keypoints[0, 4], [128, 128])
    no_kps = scrfd_constant_graph(
        tmp_path / "nokps.onnx", (128, 128), (8, 16, 32, 64, 128), 1, entries, keypoints=False
    )
    detector = SCRFD(no_kps)
    assert detector.detect_arrays(np.zeros((128, 128, 3), np.uint8)).keypoints is None
    with pytest.raises(ValueError, match="gives no landmarks"):
        detector.detect(np.zeros((128, 128, 3), np.uint8))


def _red_square(height, width, top, left, side, channel=0):
    image = np.zeros((height, width, 3), np.uint8)
    image[top : top + side, left : left + side, channel] = 255
    return image


def test_preprocessing_resize_normalisation_and_channel_order(tmp_path):
    detector = SCRFD(scrfd_red_graph(tmp_path / "det.onnx"), input_size=(640, 640))
    # 960 x 1280 photo -> 480 x 640 in the input (scale 0.5); the square lands on input pixels
    # rows 96-160, cols 192-256: the first stride-8 cell (12, 24) has centre (192, 96)
    found = detector.detect_arrays(_red_square(960, 1280, 192, 384, 128))
    assert found.scores[0] == pytest.approx((255 - 127.5) / 128)
    np.testing.assert_allclose(found.boxes[0], np.array([176, 80, 208, 112]) / 0.5)
    expected = np.array([[192 + 2 * k, 96 + 2 * k] for k in range(5)]) / 0.5
    np.testing.assert_allclose(found.keypoints[0], expected)
    # the graph reads channel 0 as red: a blue square must find nothing (RGB order kept)
    assert len(detector.detect_arrays(_red_square(960, 1280, 192, 384, 128, 2)).boxes) == 0


def test_max_num_ranks_by_area_and_distance_from_centre(tmp_path):
    detector = SCRFD(scrfd_red_graph(tmp_path / "det.onnx"))
    image = _red_square(640, 640, 96, 192, 64)
    every = detector.detect_arrays(image)
    best = detector.detect_arrays(image, max_num=2)
    boxes = every.boxes.astype(np.float64)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2 - 320
    rank = np.argsort(-(area - 2 * (centres**2).sum(1)), kind="stable")[:2]
    assert len(every.boxes) > 2
    np.testing.assert_array_equal(best.boxes, every.boxes[rank])


def test_inclusive_nms_counts_pixel_indices():
    boxes = torch.tensor([[0.0, 0, 9, 9], [5, 0, 14, 9]])
    scores = torch.tensor([0.9, 0.8])
    # exclusive: 36 / (81 + 81 - 36) = 0.286; inclusive: 50 / (100 + 100 - 50) = 0.333
    assert nms(boxes, scores, 0.3).tolist() == [0, 1]
    assert nms(boxes, scores, 0.3, inclusive=True).tolist() == [0]


def test_a_pack_folder_finds_its_detector_and_names_what_it_holds(tmp_path):
    pack = tmp_path / "buffalo_l"
    pack.mkdir()
    other_graph(pack / "2d106det.onnx", side=192)
    scrfd_red_graph(pack / "det_10g.onnx")
    recognition_graph(pack / "w600k_r50.onnx")
    assert find_scrfd_onnx(pack).name == "det_10g.onnx"
    assert load_detector("scrfd", path=str(pack)).path.name == "det_10g.onnx"
    (pack / "det_10g.onnx").unlink()
    with pytest.raises(ValueError) as err:
        load_detector("scrfd", path=str(pack))
    message = str(err.value)
    assert message.startswith(f"{pack}: no SCRFD detection ONNX")
    assert "2d106det.onnx (input (N, 3, 192, 192), 1 output)" in message
    assert "w600k_r50.onnx (input (None, 3, 112, 112), 1 output)" in message
    with pytest.raises(ValueError, match="w600k_r50.onnx: not an SCRFD detection model"):
        SCRFD(pack / "w600k_r50.onnx")


def test_insightface_scrfd_agrees(tmp_path):
    scrfd = pytest.importorskip("insightface.model_zoo.scrfd", reason="no insightface")
    path = scrfd_red_graph(tmp_path / "det.onnx")
    theirs = scrfd.SCRFD(model_file=str(path))
    theirs.prepare(-1, input_size=(640, 640))
    image = _red_square(480, 700, 100, 200, 90)
    det, kps = theirs.detect(np.ascontiguousarray(image[..., ::-1]), input_size=(640, 640))
    ours = SCRFD(path).detect_arrays(image)
    np.testing.assert_allclose(ours.boxes, det[:, :4], atol=1e-3)
    np.testing.assert_allclose(ours.keypoints, kps, atol=1e-3)
