"""The one-network fused model: its cosine is the weighted sum of the two parts' cosines
recomputed independently (mirrored images, every cell's PCA by numpy, PCA + WCCN), a mirrored
cell's reduced numbers copy its kept twin's, the int8 projection stays within half a step of the
fitted one, and the export is one ONNX file that
reloads through the model registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from partialfc.models import build_model
from partialfc.models.lbp import LbpWccnEmbedder
from partialfc.models.ltp_fused import LtpFusedEmbedding
from partialfc.models.ltp_layer import LtpHistograms


class _Pixels(nn.Module):
    """A stand-in backbone: a fixed random linear map of the 16×16 input."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.embedding_dim, self.input_size, self.in_channels = dim, 16, 1
        self.linear = nn.Linear(256, dim)

    def forward(self, x):
        return self.linear(x.flatten(1))


def _faces(n: int, side: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    people = rng.integers(0, 256, (n // 4, side, side))
    noisy = np.repeat(people, 4, axis=0) + rng.normal(0, 20, (n, side, side))
    grey = np.clip(noisy, 0, 255).round()
    return torch.from_numpy((grey / 255.0 - 0.5) / 0.5).float().unsqueeze(1), np.repeat(
        np.arange(n // 4), 4
    )


def _fitted(
    weight: float = 3.0, flip: bool = True, overlap: bool = True
) -> tuple[LtpFusedEmbedding, torch.Tensor]:
    """Fitted on 80 noisy faces of 20 people; rows of 6 and 2 cells (``overlap``) or of 3 and 1
    (a middle column)."""
    torch.manual_seed(0)
    histograms = LtpHistograms(
        input_size=32, scales_px=(32, 16), radii_px=(1, 2), cell_px=8, overlap=overlap
    )
    fused = LtpFusedEmbedding(
        _Pixels(),
        histograms,
        num_components=12,
        ltp_weight=weight,
        flip_test=flip,
        cell_components=5,
    ).eval()
    faces, labels = _faces(80, 32, seed=1)
    return fused.fit_texture(faces, labels), faces


def _all_cells(summed: np.ndarray, h: LtpHistograms) -> np.ndarray:
    """``(N, cells, 59)``: every cell of every block of flip-summed histograms."""
    return summed.reshape(len(summed), -1, 59)


def _cell_pca(train_cells: np.ndarray, components: int) -> np.ndarray:
    """``(cells, 59, components)``: each cell's top principal axes (numpy SVD, centred)."""
    axes = []
    for cell in range(train_cells.shape[1]):
        rows = train_cells[:, cell]
        axes.append(np.linalg.svd(rows - rows.mean(axis=0), full_matrices=False)[2][:components].T)
    return np.stack(axes)


@pytest.mark.parametrize("overlap", [True, False], ids=["even-rows", "middle-column"])
def test_cosine_is_the_weighted_sum_of_the_network_and_descriptor_cosines(overlap):
    fused, train_faces = _fitted(weight=3.0, overlap=overlap)
    assert any(c % 2 for c in fused.cells_per_row) is not overlap
    faces, _ = _faces(8, 32, seed=2)
    out = fused(faces).detach().numpy().astype(np.float64)
    # independent: the network on the area-halved face and its mirror ...
    small = torch.nn.functional.avg_pool2d(faces, 2)
    net = fused.backbone(small) + fused.backbone(torch.flip(small, dims=[-1]))
    # ... and the descriptor: mirrored images, every cell of both halves of each row reduced
    # by the stored basis of its kept twin (bins mirrored for the right half: a mirrored cell's
    # own PCA gives the same numbers, next test), then LbpWccnEmbedder, all in float64
    h = fused.histograms

    def flip_summed(x):
        return (h(x) + h(torch.flip(x, dims=[-1]))).double().numpy()

    stored = (fused.cell_basis_int8.double() * fused.cell_basis_scale.double()).numpy()
    mirror_bin = fused.mirror_bin.numpy()
    bases, kept = [], 0
    for per_row in fused.cells_per_row:
        for row in range(per_row):
            for col in range(per_row):
                twin = col if col < (per_row + 1) // 2 else per_row - 1 - col
                basis = stored[kept + row * ((per_row + 1) // 2) + twin]
                if per_row % 2 and col == per_row // 2:  # stored at 1/√2: one cell, not two
                    basis = basis * np.sqrt(2)
                bases.append(basis if twin == col else basis[mirror_bin])
        kept += per_row * ((per_row + 1) // 2)
    bases = np.stack(bases)
    # the stored axes are unit vectors, a middle column's 1/√2 (int8 rounding aside)
    norms = np.linalg.norm(stored, axis=1)
    weights = np.concatenate(
        [np.tile([1.0] * (c // 2) + [np.sqrt(0.5)] * (c % 2), c) for c in fused.cells_per_row]
    )
    np.testing.assert_allclose(norms, np.repeat(weights[:, None], 5, axis=1), atol=0.02)
    train, test = _all_cells(flip_summed(train_faces), h), _all_cells(flip_summed(faces), h)
    middle = sum(c for c in fused.cells_per_row if c % 2)
    assert train.shape[1] == len(bases) == 2 * fused.kept_cells - middle

    def reduced(x):
        return np.einsum("nki,kij->nkj", x, bases).reshape(len(x), -1)

    reference = LbpWccnEmbedder(num_components=12, regularization=0.3)
    reference.fit_descriptors(reduced(train), np.repeat(np.arange(20), 4))
    texture = reference.project(reduced(test))

    def unit(x):
        x = np.asarray(x, dtype=np.float64)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    expected = (
        unit(net.detach().numpy()) @ unit(net.detach().numpy()).T
        + 3 * unit(texture) @ unit(texture).T
    ) / 4
    # int8 rounding of the 12 projection columns moves cosines by a few thousandths here
    np.testing.assert_allclose(out @ out.T / 4, expected, atol=5e-3)
    assert out.shape == (8, 6 + 12)
    assert np.abs(expected - np.eye(8)).max() > 0.1  # not a trivial comparison
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 2.0, rtol=1e-5)  # √(1 + w)


def test_mirrored_cells_reduce_to_copies_of_the_kept_cells_numbers():
    fused, train_faces = _fitted()
    h = fused.histograms
    faces, _ = _faces(8, 32, seed=5)
    train = (h(train_faces) + h(torch.flip(train_faces, dims=[-1]))).double().numpy()
    test = (h(faces) + h(torch.flip(faces, dims=[-1]))).double().numpy()
    start, checked = 0, 0
    for per_row, keep in zip(fused.cells_per_row, fused.kept_columns, strict=True):
        size = per_row * per_row * 59
        grid_train = train[:, start : start + size].reshape(-1, per_row, per_row, 59)
        grid_test = test[:, start : start + size].reshape(-1, per_row, per_row, 59)
        start += size
        for row in range(per_row):
            for col in range(keep):
                mirrored = per_row - 1 - col
                numbers = []
                for c in (col, mirrored):
                    basis = _cell_pca(grid_train[:, row, c][:, None], 5)[0]
                    numbers.append(grid_test[:, row, c] @ basis)
                # the same numbers up to each axis's sign (an eigenvector's sign is arbitrary)
                np.testing.assert_allclose(np.abs(numbers[0]), np.abs(numbers[1]), atol=1e-9)
                checked += col != mirrored
    assert start == h.output_dim and checked == fused.kept_cells - sum(
        per_row * (per_row % 2) for per_row in fused.cells_per_row
    )


@pytest.mark.parametrize("overlap", [True, False], ids=["even-rows", "middle-column"])
def test_cell_features_are_the_reduced_histograms_of_the_face_plus_its_mirror_image(overlap):
    fused, _ = _fitted(overlap=overlap)
    # any basis, not only fitted ones (whose axes are each symmetric or antisymmetric under
    # the bin mirror: random axes mix both)
    generator = torch.Generator().manual_seed(4)
    shape = fused.cell_basis_int8.shape
    fused.cell_basis_int8.copy_(torch.randint(-127, 128, shape, generator=generator))
    fused.cell_basis_scale.copy_(torch.rand(fused.cell_basis_scale.shape, generator=generator))
    faces, _ = _faces(8, 32, seed=3)
    h = fused.histograms
    # independent: histograms of the mirrored images (not a permutation), the left half of
    # every row of cells (and a middle column) each in its own basis
    summed = (h(faces) + h(torch.flip(faces, dims=[-1]))).double().numpy()
    basis = (fused.cell_basis_int8.double() * fused.cell_basis_scale.double()).numpy()
    expected, start, cell = [], 0, 0
    for per_row in fused.cells_per_row:
        grid = summed[:, start : start + per_row * per_row * 59].reshape(-1, per_row, per_row, 59)
        start += per_row * per_row * 59
        for row in range(per_row):
            for col in range((per_row + 1) // 2):
                expected.append(grid[:, row, col] @ basis[cell])
                cell += 1
    assert cell == fused.kept_cells
    expected = np.concatenate(expected, axis=1)
    got = fused.cell_features(faces).double().numpy()
    assert np.abs(expected).max() > 1.0  # not a comparison of zeros
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)


def test_int8_projection_is_within_half_a_step_of_the_fitted_one():
    fused, train_faces = _fitted()
    features = fused.cell_features(train_faces).double().numpy()
    reference = LbpWccnEmbedder(num_components=12).fit_descriptors(
        features, np.repeat(np.arange(20), 4)
    )
    exact = torch.from_numpy(reference.projection).double()
    stored = fused.projection_int8.double() * fused.projection_scale.double()
    step = fused.projection_scale.double()
    assert ((stored - exact).abs() <= step / 2 * (1 + 1e-4) + 1e-9).all()
    assert fused.projection_int8.abs().max() == 127  # each column uses the full range
    # the bias is −μ W of the stored matrix, so that rounding errors cancel on the mean face
    mean = torch.from_numpy(reference.mean).double()
    torch.testing.assert_close(fused.bias.double(), -(mean @ stored), rtol=1e-4, atol=1e-5)


def test_int8_cell_bases_are_within_half_a_step_of_each_kept_cells_principal_axes():
    fused, train_faces = _fitted()
    h = fused.histograms
    summed = (h(train_faces) + h(torch.flip(train_faces, dims=[-1]))).double().numpy()
    cells, start = [], 0
    for per_row in fused.cells_per_row:
        grid = summed[:, start : start + per_row * per_row * 59].reshape(-1, per_row, per_row, 59)
        start += per_row * per_row * 59
        cells.append(grid[:, :, : (per_row + 1) // 2].reshape(len(summed), -1, 59))
    exact = _cell_pca(np.concatenate(cells, axis=1), 5)
    step = fused.cell_basis_scale.double().numpy()
    stored = fused.cell_basis_int8.double().numpy() * step
    signs = np.sign((exact * stored).sum(axis=1, keepdims=True))  # an axis's sign is arbitrary
    assert (np.abs(stored - signs * exact) <= step / 2 * (1 + 1e-4) + 1e-7).all()
    assert (np.abs(fused.cell_basis_int8.numpy()).max(axis=1) == 127).all()  # full range


def test_without_flip_test_the_network_part_is_the_backbone_alone():
    fused, _ = _fitted(flip=False)
    faces, _ = _faces(4, 32, seed=3)
    net = torch.nn.functional.normalize(fused.backbone(torch.nn.functional.avg_pool2d(faces, 2)))
    torch.testing.assert_close(fused(faces)[:, :6], net.detach())


def test_refusals():
    histograms = LtpHistograms(input_size=32, scales_px=(32,), cell_px=8)
    with pytest.raises(ValueError, match="ltp_weight"):
        LtpFusedEmbedding(_Pixels(), histograms, 4, ltp_weight=-1.0)
    big = _Pixels()
    big.input_size = 64
    with pytest.raises(ValueError, match="exceeds"):
        LtpFusedEmbedding(big, histograms, 4)
    fused = LtpFusedEmbedding(_Pixels(), histograms, 4)
    with pytest.raises(ValueError, match="labels"):
        fused.fit_texture(torch.zeros(8, 1, 32, 32), np.zeros(7))
    with pytest.raises(ValueError, match="cell_components"):
        LtpFusedEmbedding(_Pixels(), histograms, 4, cell_components=60)
    with pytest.raises(ValueError, match="embedding_dim"):
        build_model("iresnet_tiny_ltp", embedding_dim=256, input_size=96, in_channels=1)


@pytest.mark.parametrize(
    ("name", "flip_test"), [("iresnet_tiny_ltp", True), ("iresnet_tiny_ltp_noflip", False)]
)
def test_export_is_one_onnx_file_that_reloads_through_the_registry(tmp_path, name, flip_test):
    from partialfc.deploy import Embedder, PreprocessingSpec, export_backbone

    torch.manual_seed(0)
    kwargs = {"embedding_dim": 256 + 16, "input_size": 96, "in_channels": 1}
    model = build_model(name, **kwargs)
    assert model.flip_test is flip_test
    faces, labels = _faces(40, 96, seed=4)
    model.eval().fit_texture(faces, labels)
    spec = PreprocessingSpec(
        name,
        kwargs,
        272,
        (96, 96),
        1,
        "GREY",
        (0.5,),
        (0.5,),
    )
    result = export_backbone(model, spec, tmp_path)  # raises when ORT and torch disagree
    assert result.max_abs_diff < 1e-4
    import onnx

    proto = onnx.load(str(result.onnx_path))
    int8 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    # stored as int8, not float: the bases of the 464 kept cells (the left halves of the
    # 14 × 14 and 6 × 6 grids of 2 radii and 2 codes), 20 dimensions each, and 16 components
    assert sorted(tuple(t.dims) for t in int8) == [(464, 59, 20), (464 * 20, 16)]
    grey = np.random.default_rng(5).integers(0, 256, (3, 96, 96)).astype(np.uint8)
    by_onnx = Embedder.load(tmp_path, backend="onnx").embed_raw(grey)
    by_torch = Embedder.load(tmp_path, backend="torch").embed_raw(grey)
    np.testing.assert_allclose(by_onnx, by_torch, atol=1e-4)
