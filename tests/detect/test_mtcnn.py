"""MTCNN on real photos: detection rate, landmark sanity, several faces, alignment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.data.align import apply_transform, template_for_size, umeyama_similarity
from partialfc.detect import Face, FaceDetector, detect_and_align, largest_face, load_detector
from partialfc.detect.mtcnn import ONet, PNet, RNet
from partialfc.detect.nms import nms


def test_nms_keeps_best_of_each_cluster():
    boxes = torch.tensor(
        [[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 10, 10.5], [2, 2, 6, 6]],
        dtype=torch.float32,
    )
    scores = torch.tensor([0.9, 0.95, 0.5, 0.1, 0.8])
    assert nms(boxes, scores, 0.5).tolist() == [1, 4, 2]  # small box: IoU 0.16 with box 1
    assert nms(boxes, scores, 0.5, mode="min").tolist() == [1, 2]  # inside box 1: dropped
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).tolist() == []


def test_network_shapes():
    prob, offsets = PNet()(torch.zeros(2, 3, 12, 30))
    assert prob.shape == (2, 1, 10) and offsets.shape == (2, 4, 1, 10)
    prob, offsets = RNet()(torch.zeros(3, 3, 24, 24))
    assert prob.shape == (3,) and offsets.shape == (3, 4)
    prob, offsets, points = ONet()(torch.zeros(3, 3, 48, 48))
    assert prob.shape == (3,) and offsets.shape == (3, 4) and points.shape == (3, 10)


def test_detector_protocol(detector):
    assert isinstance(detector, FaceDetector)
    with pytest.raises(ValueError, match="unknown face detector 'hog'"):
        load_detector("hog")


def _check_anatomy(face: Face, image_side: int):
    (lex, ley), (rex, rey), (nx, ny), (lmx, lmy), (rmx, rmy) = face.landmarks
    x1, y1, x2, y2 = face.box
    assert np.all((face.landmarks[:, 0] > x1) & (face.landmarks[:, 0] < x2))
    assert np.all((face.landmarks[:, 1] > y1) & (face.landmarks[:, 1] < y2))
    assert lex < nx < rex and lmx < nx < rmx  # nose between the eyes and mouth corners
    assert max(ley, rey) < ny < min(lmy, rmy)  # eyes above nose above mouth
    assert lex < rex and lmx < rmx
    eyes = np.hypot(rex - lex, rey - ley)
    assert 0.2 * image_side < eyes < 0.45 * image_side  # LFW 150x150: ~40 px
    assert 0.25 < eyes / (x2 - x1) < 0.65


def test_lfw_detection_rate_and_landmarks(detector, lfw_photos):
    found = 0
    for name, image in lfw_photos:
        faces = detector.detect(image)
        face = largest_face(faces)
        if face is None:
            continue
        found += 1
        assert face.score > 0.9, name
        # LFW crops are centred on the face
        centre = (face.box[:2] + face.box[2:]) / 2
        assert np.all(np.abs(centre - 75) < 25), (name, face.box)
        _check_anatomy(face, 150)
    # 200 of 200 measured (benchmarks/detect_lfw.py); allow one miss in this sample
    assert found >= len(lfw_photos) - 1


def test_two_faces_in_a_composed_photo(detector, lfw_photos):
    canvas = np.full((320, 560, 3), 90, dtype=np.uint8)
    places = [(20, 40), (330, 130)]  # (x, y) of each pasted 150x150 photo
    for (x, y), (_, photo) in zip(places, lfw_photos[:2], strict=True):
        canvas[y : y + 150, x : x + 150] = photo
    small = cv2_resize(lfw_photos[2][1], 75)  # a third, smaller face
    canvas[200:275, 200:275] = small
    faces = detector.detect(canvas)
    assert len(faces) == 3, [f.to_dict() for f in faces]
    centres = sorted(((f.box[:2] + f.box[2:]) / 2).tolist() for f in faces)
    expected = sorted([[95, 115], [405, 205], [237.5, 237.5]])
    assert np.allclose(centres, expected, atol=20), centres
    for face in faces:
        assert face.score > 0.9
    assert len(detect_and_align(canvas, detector, all_faces=True)) == 3


def cv2_resize(image, side):
    import cv2

    return cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)


def test_no_face_in_a_blank_image(detector):
    assert detector.detect(np.full((200, 300, 3), 128, dtype=np.uint8)) == []
    assert detect_and_align(np.zeros((64, 64), dtype=np.uint8), detector) == []


def test_aligned_crop_puts_landmarks_on_the_template(detector, lfw_photos):
    _, image = lfw_photos[0]
    (aligned,) = detect_and_align(image, detector)
    assert aligned.crop.shape == (112, 112, 3) and aligned.crop.dtype == np.uint8
    matrix = umeyama_similarity(aligned.face.landmarks, template_for_size(112))
    residual = apply_transform(matrix, aligned.face.landmarks) - template_for_size(112)
    assert np.abs(residual).max() < 8  # a similarity fits five real landmarks to a few px
    # the crop is a face: detecting again finds one face filling most of it
    again = largest_face(detector.detect(aligned.crop))
    assert again is not None and again.box[2] - again.box[0] > 60
