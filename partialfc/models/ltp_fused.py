"""One network from a trained backbone and an in-graph texture descriptor, fused by score.

``LtpFusedEmbedding(x) = [ê_net(x), √w · ê_ltp(x)]`` (``ê`` = L2-normalised), so that the cosine of
two outputs is ``(cos_net + w · cos_ltp) / (1 + w)``, the score-level fusion of
:func:`partialfc.models.lbp.fuse_embeddings`, with both parts inside one graph:

* ``e_net(x) = f(x) + f(mirror(x))``: the backbone ``f`` on the input area-resampled to its own
  side, with the flip test when ``flip_test``;
* ``e_ltp(x) = (c(h(x) + h(mirror(x))) − μ) W``: :class:`partialfc.models.ltp_layer.LtpHistograms`
  ``h`` (the mirror's histograms are a permutation of ``h(x)``: one pass), ``c`` each cell's
  flip-summed histogram reduced to ``cell_components`` by the cell's own principal-component
  basis, then PCA and within-class whitening (WCCN, Hatch et al., ICSLP 2006), all learned in
  closed form on training faces (:meth:`LtpFusedEmbedding.fit_texture`).

The flip-summed histograms ``H = h(x) + h(mirror(x))`` of two cells that mirror each other
(column ``j`` and ``n − 1 − j`` of an ``n``-cell row) are bin permutations of each other,
``H_{n−1−j} = Π H_j``, so with each cell's basis fitted on the same faces the reduced numbers
of one are those of the other (up to each axis's sign): only the cells of the left half-grid
are kept (and a middle column, weighted ``1/√2``: it stands for one cell of the grid, the
others for two), which halves ``W`` and leaves the fused cosine that of the whole grid. ``W``
and the cell bases are stored as int8 with one float scale per column (symmetric,
``max |·| / 127``), with ``−μ W`` (of the stored ``W``) as a bias.

The descriptor is the multi-scale LTP face description of Tan & Triggs (IEEE TIP 2010) with the
high-dimensional-LBP projection of Chen et al. ("Blessing of dimensionality", CVPR 2013).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from partialfc.models.common import as_hw
from partialfc.models.lbp import NUM_LBP_BINS
from partialfc.models.ltp_layer import LtpHistograms, area_resize_matrix, mirror_bin_table

# registry names whose graph already embeds the mirror image (flip test inside the network)
FLIP_TEST_IN_GRAPH = ("iresnet_tiny_ltp", "iresnet_tiny_ltp_noflip")


class LtpFusedEmbedding(nn.Module):
    """``(N, 1, H, H)`` normalised grey faces → ``(N, d_net + num_components)`` fused embedding.

    ``backbone``: a trained model with ``input_size`` ≤ ``histograms.input_size`` (its input is
    area-resampled inside the graph); ``num_components``: the descriptor's PCA dimensions;
    ``ltp_weight``: ``w`` ≥ 0; ``flip_test``: add the backbone's embedding of the mirror image;
    ``cell_components``: dimensions kept of each cell's 59 bins a code (0 = all, no reduction).
    The texture part is zero until :meth:`fit_texture` (or a loaded state dict) sets it.

    Defaults: 1,000 components, ``w`` = 3, flip test on, 20 dimensions a cell and code.
    """

    def __init__(
        self,
        backbone: nn.Module,
        histograms: LtpHistograms,
        num_components: int = 1000,
        ltp_weight: float = 3.0,
        flip_test: bool = True,
        cell_components: int = 20,
    ):
        super().__init__()
        if not math.isfinite(ltp_weight) or ltp_weight < 0:
            raise ValueError(f"ltp_weight must be finite and >= 0, got {ltp_weight}")
        if int(num_components) < 1:
            raise ValueError(f"num_components must be >= 1, got {num_components}")
        if not 0 <= int(cell_components) <= NUM_LBP_BINS:
            raise ValueError(f"cell_components must be in 0..59, got {cell_components}")
        net_side = _side(getattr(backbone, "input_size", histograms.input_size))
        if net_side > histograms.input_size:
            raise ValueError(
                f"the backbone's input ({net_side} px) exceeds the descriptor's "
                f"({histograms.input_size} px)"
            )
        self.backbone, self.histograms = backbone, histograms
        self.flip_test = bool(flip_test)
        self.net_side = net_side
        self.num_components = int(num_components)
        self.embedding_dim = int(backbone.embedding_dim) + self.num_components
        self.input_size = (histograms.input_size, histograms.input_size)
        self.in_channels = 1
        if net_side != histograms.input_size:
            resize = torch.tensor(
                area_resize_matrix(histograms.input_size, net_side), dtype=torch.float32
            )
            self.register_buffer("net_resize", resize, persistent=False)
        self.cell_components = int(cell_components) or NUM_LBP_BINS
        # cells a row of each (side, radius, code) block of h, and the columns kept of each row
        self.cells_per_row = [c for c in histograms.cells_per_row() for _code in range(2)]
        self.kept_columns = [(c + 1) // 2 for c in self.cells_per_row]
        kept = sum(c * k for c, k in zip(self.cells_per_row, self.kept_columns, strict=True))
        self.kept_cells = kept
        # each kept cell's own basis (59 bins to cell_components), int8 with a scale a column
        self.register_buffer(
            "cell_basis_int8",
            torch.zeros(kept, NUM_LBP_BINS, self.cell_components, dtype=torch.int8),
        )
        self.register_buffer("cell_basis_scale", torch.zeros(kept, 1, self.cell_components))
        # int32: half the bytes of int64 in an export
        mirror = histograms.mirror_permutation().int()
        self.register_buffer("mirror", mirror, persistent=False)
        mirror_bin = torch.from_numpy(mirror_bin_table())
        self.register_buffer("mirror_bin", mirror_bin, persistent=False)
        dim = kept * self.cell_components
        self.register_buffer("ltp_weight", torch.tensor(float(ltp_weight)))
        self.register_buffer("projection_int8", torch.zeros(dim, num_components, dtype=torch.int8))
        self.register_buffer("projection_scale", torch.zeros(num_components))
        self.register_buffer("bias", torch.zeros(num_components))

    def _kept_cells(self, h: torch.Tensor) -> torch.Tensor:
        """``(N, kept_cells, 59)``: the histograms in ``h`` of the kept cells (the left
        ``⌈n / 2⌉`` columns of each block's rows), in the order of the stored bases."""
        cells, start = [], 0
        for per_row, keep in zip(self.cells_per_row, self.kept_columns, strict=True):
            size = per_row * per_row * NUM_LBP_BINS
            grid = h[:, start : start + size].reshape(-1, per_row, per_row, NUM_LBP_BINS)
            start += size
            cells.append(grid[:, :, :keep].flatten(1, 2))
        return torch.cat(cells, dim=1)

    def _middle_column_weights(self) -> torch.Tensor:
        """``(kept_cells,)``: ``1/√2`` for the cells of a middle column, 1 elsewhere."""
        weights = []
        for per_row, keep in zip(self.cells_per_row, self.kept_columns, strict=True):
            row = torch.ones(keep)
            if per_row % 2:
                row[-1] = 0.5**0.5
            weights.append(row.repeat(per_row))
        return torch.cat(weights)

    def cell_basis(self) -> torch.Tensor:
        """``(kept_cells, 59, cell_components)``: the stored cell bases as floats."""
        return self.cell_basis_int8.float() * self.cell_basis_scale

    def cell_features(self, images: torch.Tensor) -> torch.Tensor:
        """``c(h(x) + h(mirror(x)))`` of the kept cells: each cell's flip-summed histograms in
        its own basis, ``(N, kept_cells · cell_components)``.

        The mirror image's histograms at a cell are the reflected cell's with bins permuted, so
        ``H_j B_j = h_j B_j + h_{n−1−j} B_j[π]`` (``π`` the mirrored bins): every cell of a row
        is reduced by a basis of the whole grid (``B_j`` on the left, ``B_j[π]`` at the
        reflected cell, a constant of the graph), and the two halves' numbers are added."""
        h = self.histograms(images)
        basis = self.cell_basis().to(images.dtype)
        components = self.cell_components
        parts, start, first = [], 0, 0
        for per_row, keep in zip(self.cells_per_row, self.kept_columns, strict=True):
            size = per_row * per_row * NUM_LBP_BINS
            cells = h[:, start : start + size].reshape(-1, per_row * per_row, NUM_LBP_BINS)
            start += size
            kept = basis[first : first + per_row * keep].reshape(
                per_row, keep, NUM_LBP_BINS, components
            )
            first += per_row * keep
            grid_basis = self._grid_basis(kept, per_row).reshape(-1, NUM_LBP_BINS, components)
            reduced = (cells.transpose(0, 1) @ grid_basis).reshape(per_row, per_row, -1, components)
            both = reduced[:, :keep] + reduced[:, per_row - keep :].flip(1)  # (rows, keep, N, c)
            parts.append(both.reshape(per_row * keep, -1, components))
        return torch.cat(parts, dim=0).transpose(0, 1).flatten(1)

    def _grid_basis(self, kept: torch.Tensor, per_row: int) -> torch.Tensor:
        """``(rows, per_row, 59, c)``: the kept columns' bases ``kept`` ``(rows, keep, 59, c)``
        on the left, their bin-mirrored bases at the reflected columns; a middle column (odd
        ``per_row``) is counted from both halves, so it holds the mean of the two."""
        mirrored = kept[:, :, self.mirror_bin]
        if per_row % 2 == 0:
            return torch.cat([kept, mirrored.flip(1)], dim=1)
        middle = (kept[:, -1:] + mirrored[:, -1:]) / 2
        return torch.cat([kept[:, :-1], middle, mirrored[:, :-1].flip(1)], dim=1)

    def texture(self, images: torch.Tensor) -> torch.Tensor:
        """``e_ltp``: the whitened descriptor (unnormalised)."""
        projection = self.projection_int8.to(images.dtype) * self.projection_scale
        return self.cell_features(images) @ projection + self.bias

    def network(self, images: torch.Tensor) -> torch.Tensor:
        """``e_net``: the backbone's embedding (plus its mirror's with the flip test)."""
        if self.net_side != self.histograms.input_size:
            images = self.net_resize @ images @ self.net_resize.T
        embedding = self.backbone(images)
        if self.flip_test:
            embedding = embedding + self.backbone(torch.flip(images, dims=[-1]))
        return embedding

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        parts = [
            F.normalize(self.network(images), dim=1),
            self.ltp_weight.sqrt() * F.normalize(self.texture(images), dim=1),
        ]
        return torch.cat(parts, dim=1)

    @torch.no_grad()
    def fit_texture(
        self,
        images: torch.Tensor,
        labels: np.ndarray,
        regularization: float = 0.3,
        batch_size: int = 128,
    ) -> LtpFusedEmbedding:
        """Learn the cell bases, ``μ`` and ``W`` from ``(N, 1, H, H)`` normalised training faces
        and their identity labels: per kept cell, the top principal axes of its flip-summed
        histograms over the faces; then PCA to ``num_components`` and WCCN with ridge
        ``regularization`` (:meth:`partialfc.models.lbp.LbpWccnEmbedder.fit_descriptors`) of
        the reduced numbers, computed with the stored (int8) bases. Default ridge 0.3."""
        from partialfc.models.lbp import LbpWccnEmbedder

        labels = np.asarray(labels)
        if labels.shape != (len(images),):
            raise ValueError(f"labels must be ({len(images)},), got shape {labels.shape}")
        chunks = []
        for start in range(0, len(images), batch_size):
            h = self.histograms(images[start : start + batch_size].float())
            # flip-summed histograms of the kept cells, float32: 0.1 MB a face
            chunks.append(self._kept_cells(h + h[:, self.mirror.long()]))
        summed = torch.cat(chunks)  # (N, kept, 59)
        # each cell's scatter about its mean, in float64 a batch at a time (no float64 copy of
        # every face's histograms)
        mean = summed.mean(dim=0, dtype=torch.float64)
        scatter = sum(
            torch.einsum("nki,nkj->kij", centred, centred)
            for centred in (chunk.double() - mean for chunk in summed.split(batch_size))
        )
        _, axes = torch.linalg.eigh(scatter)  # ascending eigenvalues, per cell
        basis = axes.flip(2)[:, :, : self.cell_components]
        # a middle column (odd rows) stands for one cell of the whole grid, the others for two:
        # weighted 1/√2 against them, so that PCA and WCCN see the whole grid's descriptor
        basis = basis * self._middle_column_weights().to(basis.dtype).view(-1, 1, 1)
        stored, scale = _symmetric_int8(basis, dim=1)
        self.cell_basis_int8.copy_(stored.to(torch.int8))
        self.cell_basis_scale.copy_(scale.float())
        stored_basis = self.cell_basis().double()
        features = torch.cat(
            [
                (chunk.double().transpose(0, 1) @ stored_basis).transpose(0, 1).flatten(1)
                for chunk in summed.split(batch_size)
            ]
        )
        fitted = LbpWccnEmbedder(num_components=self.num_components, regularization=regularization)
        fitted.fit_descriptors(features.numpy(), labels)
        projection = torch.from_numpy(fitted.projection).double()
        stored, scale = _symmetric_int8(projection, dim=0)
        # the bias from the stored W, so that the rounding errors cancel on the mean face
        bias = -(torch.from_numpy(fitted.mean).double() @ (stored * scale))
        self.projection_int8.copy_(stored.to(torch.int8))
        self.projection_scale.copy_(scale.squeeze(0).float())
        self.bias.copy_(bias.float())
        return self


def iresnet_tiny_ltp(
    embedding_dim: int = 1256,
    input_size: int | tuple[int, int] = 96,
    in_channels: int = 1,
    dropout: float = 0.0,
) -> LtpFusedEmbedding:
    """:class:`LtpFusedEmbedding` of a grey ``iresnet_tiny`` (256-d, 64-px input, flip test)
    and the default :class:`LtpHistograms` of the ``input_size`` crop, with ``embedding_dim −
    256`` components (the registry's common signature, so an export reloads from its
    safetensors; the descriptor is unfitted until its state dict is loaded). Default 1,000
    components at 96 px."""
    from partialfc.models.iresnet import iresnet_tiny

    side = _side(input_size)
    if in_channels != 1:
        raise ValueError(f"iresnet_tiny_ltp takes grey faces (in_channels=1), got {in_channels}")
    if embedding_dim <= 256:
        raise ValueError(f"embedding_dim must exceed the network's 256, got {embedding_dim}")
    backbone = iresnet_tiny(embedding_dim=256, input_size=64, in_channels=1, dropout=dropout)
    histograms = LtpHistograms(input_size=side, scales_px=(side, side // 2))
    return LtpFusedEmbedding(backbone, histograms, embedding_dim - 256)


def iresnet_tiny_ltp_noflip(
    embedding_dim: int = 1256,
    input_size: int | tuple[int, int] = 96,
    in_channels: int = 1,
    dropout: float = 0.0,
) -> LtpFusedEmbedding:
    """:func:`iresnet_tiny_ltp` without the network's flip test (the descriptor still sums the
    face's and its mirror's histograms, which costs no second pass)."""
    model = iresnet_tiny_ltp(embedding_dim, input_size, in_channels, dropout)
    model.flip_test = False
    return model


def _symmetric_int8(values: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` with ``values ≈ q · scale``: ``q`` the rounded integers in −127..127 (still
    floating point) and ``scale = max |values| / 127`` along ``dim`` (kept as a size-1 axis)."""
    scale = values.abs().amax(dim=dim, keepdim=True).clamp_min(1e-30) / 127.0
    return torch.round(values / scale), scale


def _side(size) -> int:
    """The side of a square input size given as an int or an ``(H, W)`` pair."""
    height, width = as_hw(size)
    if height != width:
        raise ValueError(f"square inputs only, got {height}x{width}")
    return height
