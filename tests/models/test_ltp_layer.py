"""The in-graph LTP histograms against the numpy codes recounted by hand, their mirror
permutation, the area resampling against OpenCV, and ONNX agreement."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from partialfc.models.lbp import UNIFORM_BIN, ltp_codes
from partialfc.models.ltp_layer import LtpHistograms, area_resize_matrix


def _normalised(grey: np.ndarray) -> torch.Tensor:
    return torch.from_numpy((grey / 255.0 - 0.5) / 0.5).float().unsqueeze(1)


def _reference(grey: np.ndarray, radius: int, cell: int, threshold: float) -> np.ndarray:
    """Centred-cell histograms of the upper then lower codes of ``ltp_codes``, by bincount."""
    blocks = []
    for code in ltp_codes(grey, radius, threshold):
        bins = UNIFORM_BIN[code]
        interior = bins.shape[1]
        cells = interior // cell
        off = (interior - cells * cell) // 2
        hist = np.zeros((len(grey), cells, cells, 59))
        for i in range(cells):
            for j in range(cells):
                rows = slice(off + i * cell, off + (i + 1) * cell)
                cols = slice(off + j * cell, off + (j + 1) * cell)
                patch = bins[:, rows, cols]
                for n in range(len(grey)):
                    hist[n, i, j] = np.bincount(patch[n].ravel(), minlength=59)
        blocks.append(np.sqrt(hist / cell**2).reshape(len(grey), -1))
    return np.concatenate(blocks, axis=1)


def test_histograms_equal_the_numpy_ternary_codes_counted_per_cell():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (3, 30, 30)).astype(np.uint8)
    layer = LtpHistograms(
        input_size=30,
        scales_px=(30,),
        radii_px=(1, 2),
        cell_px=8,
        threshold_grey=5,
        overlap=False,
    )
    expected = np.concatenate([_reference(grey, r, 8, 5.0) for r in (1, 2)], axis=1)
    got = layer(_normalised(grey)).numpy()
    assert got.shape == (3, layer.output_dim) == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6)


def _bars(right: int, left: int) -> torch.Tensor:
    """4×4 grey 100 with rows 1–2 of the right column at ``right`` and of the left at ``left``."""
    grey = np.full((1, 4, 4), 100, np.uint8)
    grey[0, 1:3, 3], grey[0, 1:3, 0] = right, left
    return _normalised(grey)


def test_a_difference_of_exactly_t_sets_the_bit_and_one_grey_level_less_does_not():
    layer = LtpHistograms(
        input_size=4, scales_px=(4,), radii_px=(1,), cell_px=2, threshold_grey=8, overlap=False
    )
    # the 2×2 interior is one cell. With 108 on the right (c + t): pixel (1,2) sees it at bits 0
    # (right) and 1 (down-right), pixel (2,2) at bits 0 and 7 (up-right); with 92 on the left
    # (c − t): pixel (1,1) has lower bits 4 (left) and 3 (down-left), pixel (2,1) bits 4 and 5
    hist = layer(_bars(108, 92)).numpy().reshape(2, 59) ** 2 * 4  # counts: upper, lower
    upper = np.bincount(UNIFORM_BIN[[0, 0b11, 0, 0b10000001]], minlength=59)
    lower = np.bincount(UNIFORM_BIN[[0b11000, 0, 0b110000, 0]], minlength=59)
    np.testing.assert_allclose(hist, np.stack([upper, lower]), atol=1e-5)
    # 107 and 93 are one grey level inside the band: every code is 0
    hist = layer(_bars(107, 93)).numpy().reshape(2, 59) ** 2 * 4
    np.testing.assert_allclose(hist, 4 * np.eye(59)[[UNIFORM_BIN[0]] * 2], atol=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        LtpHistograms(input_size=3, scales_px=(3,), radii_px=(1,), cell_px=2, overlap=False)


def test_overlapping_cells_equal_the_numpy_grid_every_half_cell():
    from partialfc.models.lbp import LbpGrid, lbp_histograms

    rng = np.random.default_rng(4)
    grey = rng.integers(0, 256, (2, 40, 40)).astype(np.uint8)
    layer = LtpHistograms(input_size=40, scales_px=(40,), radii_px=(1,), cell_px=8)
    # interior 38 px: nine 4-px half-cells (36 px) centred at offset 1, so 8 cells a row;
    # LbpGrid counts cells from the top-left, so its image is cropped by that offset
    expected = lbp_histograms(grey[:, 1:, 1:], LbpGrid((39,), (1,), 8, 4, 8.0))
    got = layer(_normalised(grey)).numpy()
    assert got.shape == expected.shape == (2, 2 * 8 * 8 * 59)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_area_resampling_matches_opencv_inter_area():
    rng = np.random.default_rng(1)
    image = rng.uniform(0, 255, (96, 96)).astype(np.float32)
    for side in (64, 48, 40):
        matrix = area_resize_matrix(96, side)
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
        expected = cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)
        np.testing.assert_allclose(matrix @ image @ matrix.T, expected, atol=1e-3)
    with pytest.raises(ValueError, match="target"):
        area_resize_matrix(48, 96)


def test_mirror_image_histograms_are_the_stated_permutation():
    rng = np.random.default_rng(2)
    grey = rng.integers(0, 256, (4, 48, 48)).astype(np.uint8)
    layer = LtpHistograms(input_size=48, scales_px=(48, 24), radii_px=(1, 2), cell_px=8)
    assert layer.overlap  # the default, the harder case: cells straddle the centre line
    h = layer(_normalised(grey))
    mirrored = layer(_normalised(np.ascontiguousarray(grey[:, :, ::-1])))
    perm = layer.mirror_permutation()
    assert sorted(perm.tolist()) == list(range(layer.output_dim))  # a permutation
    torch.testing.assert_close(mirrored, h[:, perm], atol=1e-6, rtol=0)
    assert not torch.equal(mirrored, h)  # random faces are not symmetric


def test_default_dimension_and_refusals():
    # 12-px cells every 6 px: 15, 15, 7 and 7 half-cells a row at (side, radius) = (96, 1),
    # (96, 2), (48, 1), (48, 2), so one cell fewer a row
    assert LtpHistograms().output_dim == 2 * 59 * (14 * 14 + 14 * 14 + 6 * 6 + 6 * 6) == 54_752
    assert LtpHistograms(overlap=False).output_dim == 2 * 59 * (7 * 7 * 2 + 3 * 3 * 2) == 13_688
    with pytest.raises(ValueError, match="even"):
        LtpHistograms(cell_px=11, overlap=False)
    with pytest.raises(ValueError, match="multiple of 4"):
        LtpHistograms(cell_px=10)
    with pytest.raises(ValueError, match="threshold"):
        LtpHistograms(threshold_grey=0)
    with pytest.raises(ValueError, match="exceeds"):
        LtpHistograms(input_size=64, scales_px=(96,))


def test_onnx_export_agrees_with_pytorch(tmp_path):
    import onnxruntime as ort

    layer = LtpHistograms(input_size=48, scales_px=(48, 32), radii_px=(1, 2), cell_px=8).eval()
    rng = np.random.default_rng(3)
    x = _normalised(rng.integers(0, 256, (5, 48, 48)).astype(np.uint8))
    path = tmp_path / "ltp.onnx"
    torch.onnx.export(
        layer,
        (x[:2],),
        str(path),
        input_names=["images"],
        output_names=["h"],
        dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
        opset_version=18,
        dynamo=True,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_out = session.run(None, {"images": x.numpy()})[0]
    np.testing.assert_allclose(onnx_out, layer(x).numpy(), atol=1e-5)
