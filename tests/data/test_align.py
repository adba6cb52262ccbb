"""Five-landmark alignment: Umeyama against known transforms, and the warp."""

from __future__ import annotations

import math

import numpy as np
import pytest

from partialfc.data.align import (
    ARCFACE_TEMPLATE_112,
    align_face,
    apply_transform,
    umeyama_similarity,
)


def similarity(scale: float, angle_rad: float, tx: float, ty: float) -> np.ndarray:
    c, s = scale * math.cos(angle_rad), scale * math.sin(angle_rad)
    return np.array([[c, -s, tx], [s, c, ty]])


def test_template_onto_itself_is_identity():
    matrix = umeyama_similarity(ARCFACE_TEMPLATE_112, ARCFACE_TEMPLATE_112)
    np.testing.assert_allclose(matrix, [[1, 0, 0], [0, 1, 0]], atol=1e-12)


def test_recovers_a_known_similarity_transform():
    truth = similarity(1.7, math.radians(23.0), -12.5, 30.25)
    src = ARCFACE_TEMPLATE_112
    np.testing.assert_allclose(
        umeyama_similarity(src, apply_transform(truth, src)), truth, atol=1e-10
    )


def test_least_squares_with_noise_beats_perturbed_solutions():
    rng = np.random.default_rng(0)
    truth = similarity(0.6, -0.4, 5.0, -3.0)
    src = rng.uniform(0, 200, (5, 2))
    dst = apply_transform(truth, src) + rng.normal(0, 0.5, (5, 2))
    best = umeyama_similarity(src, dst)

    def err(m):
        return ((apply_transform(m, src) - dst) ** 2).sum()

    for _ in range(50):  # any nearby similarity fits worse
        a, b, tx, ty = rng.normal(0, 1e-3, 4)
        perturbed = best + np.array([[a, -b, tx], [b, a, ty]])
        assert err(perturbed) >= err(best)


def test_reflection_is_not_used():
    mirrored = ARCFACE_TEMPLATE_112 * np.array([-1.0, 1.0])
    matrix = umeyama_similarity(ARCFACE_TEMPLATE_112, mirrored)
    assert np.linalg.det(matrix[:, :2]) > 0


def test_align_warps_landmarks_onto_template_and_keeps_rgb():
    # a 200x200 "photo": the template scaled x1.5, rotated 10 deg, shifted; a red dot per landmark
    truth = similarity(1.5, math.radians(10), 20.0, 15.0)
    landmarks = apply_transform(truth, ARCFACE_TEMPLATE_112)
    photo = np.zeros((200, 200, 3), np.uint8)
    for x, y in landmarks:
        photo[int(round(y)) - 2 : int(round(y)) + 3, int(round(x)) - 2 : int(round(x)) + 3] = (
            255,
            0,
            0,
        )
    aligned = align_face(photo, landmarks)
    assert aligned.shape == (112, 112, 3)
    for x, y in ARCFACE_TEMPLATE_112:
        patch = aligned[
            int(round(y)) - 1 : int(round(y)) + 2, int(round(x)) - 1 : int(round(x)) + 2
        ]
        assert patch[..., 0].mean() > 150 and patch[..., 2].max() == 0
    bgr = align_face(photo[..., ::-1].copy(), landmarks, input_order="bgr")
    np.testing.assert_array_equal(bgr, aligned)


def test_bad_landmarks():
    with pytest.raises(ValueError, match=r"\(5, 2\)"):
        align_face(np.zeros((10, 10, 3), np.uint8), np.zeros((4, 2)))


def test_custom_template_on_a_grey_image_with_replicated_border():
    # grey 96x96 image: bright dots at landmarks shifted by (+6, -4) from a custom template
    template = np.array([[30.0, 40.0], [66.0, 40.0], [48.0, 58.0], [34.0, 76.0], [62.0, 76.0]])
    landmarks = template + np.array([6.0, -4.0])
    image = np.full((96, 96), 50, np.uint8)
    for x, y in landmarks:
        image[int(y) - 1 : int(y) + 2, int(x) - 1 : int(x) + 2] = 250
    aligned = align_face(image, landmarks, size=96, template=template, border="replicate")
    assert aligned.shape == (96, 96)
    for x, y in template:  # the dots moved onto the template
        assert aligned[int(y), int(x)] > 200
    # a pure shift by (-6, +4): the uncovered right columns and top rows repeat the edge (50),
    # where a constant border would give 0
    assert aligned[:, -6:].min() == 50 and aligned[:4].min() == 50
    black = align_face(image, landmarks, size=96, template=template)
    assert black[:, -5:].max() == 0
    with pytest.raises(ValueError, match="border"):
        align_face(image, landmarks, size=96, template=template, border="wrap")
    with pytest.raises(ValueError, match="template"):
        align_face(image, landmarks, size=96, template=template[:4])
