"""The one-network fused model: its cosine is the weighted sum of the two parts' cosines
recomputed independently (mirrored images, per-block cell PCA by numpy, PCA + WCCN), the int8
projection stays within half a step of the fitted one, and the export is one ONNX file that
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


def _fitted(weight: float = 3.0, flip: bool = True) -> tuple[LtpFusedEmbedding, torch.Tensor]:
    torch.manual_seed(0)
    histograms = LtpHistograms(input_size=32, scales_px=(32, 16), radii_px=(1, 2), cell_px=8)
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


def test_cosine_is_the_weighted_sum_of_the_network_and_descriptor_cosines():
    fused, train_faces = _fitted(weight=3.0)
    faces, _ = _faces(8, 32, seed=2)
    out = fused(faces).detach().numpy().astype(np.float64)
    # independent: the network on the area-halved face and its mirror ...
    small = torch.nn.functional.avg_pool2d(faces, 2)
    net = fused.backbone(small) + fused.backbone(torch.flip(small, dims=[-1]))
    # ... and the descriptor: mirrored images, each block's cell PCA, then LbpWccnEmbedder
    h = fused.histograms

    def flip_summed(x):
        return (h(x) + h(torch.flip(x, dims=[-1]))).double().numpy()

    train, test = flip_summed(train_faces), flip_summed(faces)
    blocks = [c * c for c in h.cells_per_row() for _ in range(2)]
    train_parts, test_parts, start = [], [], 0
    for cells in blocks:
        columns = slice(start * 59, (start + cells) * 59)
        start += cells
        rows = train[:, columns].reshape(-1, 59)
        mean = rows.mean(axis=0)
        basis = np.linalg.svd(rows - mean, full_matrices=False)[2][:5].T
        for parts, x in ((train_parts, train), (test_parts, test)):
            parts.append(
                ((x[:, columns].reshape(len(x), cells, 59) - mean) @ basis).reshape(len(x), -1)
            )
    assert start * 59 == h.output_dim
    reference = LbpWccnEmbedder(num_components=12, regularization=0.3)
    reference.fit_descriptors(np.concatenate(train_parts, 1), np.repeat(np.arange(20), 4))
    texture = reference.project(np.concatenate(test_parts, 1))

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


def test_cell_features_are_the_reduced_histograms_of_the_face_plus_its_mirror_image():
    fused, _ = _fitted()
    # any basis, not only fitted ones (whose axes are each symmetric or antisymmetric under
    # the bin mirror: random axes mix both)
    generator = torch.Generator().manual_seed(4)
    fused.cell_basis.copy_(torch.randn(fused.cell_basis.shape, generator=generator))
    fused.cell_mean.copy_(torch.rand(fused.cell_mean.shape, generator=generator))
    faces, _ = _faces(8, 32, seed=3)
    h = fused.histograms
    # independent: histograms of the mirrored images (not a permutation), reduced per cell
    summed = (h(faces) + h(torch.flip(faces, dims=[-1]))).double().numpy()
    expected, start = [], 0
    for block, cells in enumerate(fused.cell_blocks):
        rows = summed[:, start * 59 : (start + cells) * 59].reshape(len(faces), cells, 59)
        start += cells
        mean = fused.cell_mean[block].double().numpy()
        basis = fused.cell_basis[block].double().numpy()
        expected.append(((rows - mean) @ basis).reshape(len(faces), -1))
    expected = np.concatenate(expected, axis=1)
    got = fused.cell_features(faces).double().numpy()
    assert np.abs(expected).max() > 1.0  # not a comparison of zeros
    np.testing.assert_allclose(got, expected, atol=1e-4)


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
    # stored as int8, not float: 464 cells a code, 16 dimensions each, 16 components
    assert [tuple(t.dims) for t in int8] == [(2 * 464 * 16, 16)]
    grey = np.random.default_rng(5).integers(0, 256, (3, 96, 96)).astype(np.uint8)
    by_onnx = Embedder.load(tmp_path, backend="onnx").embed_raw(grey)
    by_torch = Embedder.load(tmp_path, backend="torch").embed_raw(grey)
    np.testing.assert_allclose(by_onnx, by_torch, atol=1e-4)
