"""Multi-scale local-ternary-pattern histograms as a fixed network layer (exportable to ONNX).

The texture descriptor of :mod:`partialfc.models.lbp`, computed inside a network's graph from
the network's own normalised input, so that a model and its hand-crafted descriptor ship as one
ONNX file:

* every face is resampled to each side of ``scales_px`` by a fixed area-averaging matrix (the
  box filter of ``cv2.INTER_AREA`` when shrinking);
* at each radius ``r`` of ``radii_px``, the 8 neighbours of the square of half-side ``r`` are
  compared with the centre (local ternary patterns, Tan & Triggs, IEEE TIP 2010, Sec. III-A):
  the upper code has bit ``p`` where ``g_p − g_c ≥ t``, the lower where ``g_p − g_c ≤ −t``
  (``t`` = ``threshold_grey``, grey levels 0–255; the comparison is made against ``t − 7/16``,
  which is the same on integer grey levels and, as no difference of resampled grey levels at
  the supported ratios lies within ``1/200`` of it, keeps float rounding from flipping bits);
* each code is binned as a uniform pattern (58 uniform codes + one bin for the rest, Ojala et
  al., TPAMI 2002) and histogrammed over ``cell_px`` cells centred on the interior (Ahonen et
  al., TPAMI 2006), every ``cell_px`` pixels or, with ``overlap``, every ``cell_px / 2`` (the
  counts of half-cells summed over 2 × 2 windows), each histogram normalised by the cell's
  pixel count and square-rooted (Hellinger map).

Output ``(N, D)``, ordered scale, radius, code (upper, lower), cell (row-major), bin.
Because the cells are centred and the neighbour ring is symmetric, the histograms of a mirrored
face are a permutation of the face's (:meth:`LtpHistograms.mirror_permutation`), so a linear
projection of the flip-averaged histograms costs no second pass.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from partialfc.models.lbp import _NEIGHBOURS, NUM_LBP_BINS, UNIFORM_BIN


def area_resize_matrix(source_px: int, target_px: int) -> np.ndarray:
    """``(target, source)`` float64 rows of box-filter weights: output pixel ``i`` averages the
    source interval ``[i·s/t, (i+1)·s/t)`` weighted by overlap (``cv2.INTER_AREA`` when
    shrinking); the identity when the sides are equal."""
    if target_px < 1 or target_px > source_px:
        raise ValueError(f"area resizing needs 1 <= target <= source, got {target_px}, {source_px}")
    ratio = source_px / target_px
    matrix = np.zeros((target_px, source_px))
    for i in range(target_px):
        lo, hi = i * ratio, (i + 1) * ratio
        for j in range(int(np.floor(lo)), int(np.ceil(hi))):
            matrix[i, j] = min(hi, j + 1) - max(lo, j)
    return matrix / ratio


def mirror_bin_table() -> np.ndarray:
    """``(59,)``: the uniform bin of a code's mirror image (neighbour ``(dy, dx)`` becomes
    ``(dy, −dx)``)."""
    mirror_bit = [_NEIGHBOURS.index((dy, -dx)) for dy, dx in _NEIGHBOURS]
    table = np.full(NUM_LBP_BINS, -1, dtype=np.int64)
    for code in range(256):
        mirrored = sum(((code >> p) & 1) << mirror_bit[p] for p in range(8))
        source, target = UNIFORM_BIN[code], UNIFORM_BIN[mirrored]
        if table[source] not in (-1, target):  # pragma: no cover - a property of the ring
            raise AssertionError("uniform bins are not closed under mirroring")
        table[source] = target
    return table


class LtpHistograms(nn.Module):
    """``(N, 1, H, H)`` normalised grey images → ``(N, D)`` square-rooted LTP cell histograms.

    ``input_size``: side of the input; ``scales_px``: sides the face is resampled to (each
    ≤ ``input_size``); ``radii_px``: neighbour radii; ``cell_px``: side of the cells (even, so
    that the centred grid is mirror-symmetric); ``threshold_grey``: the ternary band ``t`` > 0;
    ``overlap``: cells every ``cell_px / 2`` pixels instead of every ``cell_px``;
    ``mean``/``std``: the input normalisation ``x = (g / 255 − mean) / std``.

    Defaults: 96-px input, sides 96 and 48, radii 1 and 2, 12-px cells every 6 px, ``t`` = 8,
    mean = std = 0.5 (54,752 dimensions; 13,688 without overlap). No parameters; every constant
    is a buffer.
    """

    def __init__(
        self,
        input_size: int = 96,
        scales_px: tuple[int, ...] = (96, 48),
        radii_px: tuple[int, ...] = (1, 2),
        cell_px: int = 12,
        threshold_grey: float = 8.0,
        overlap: bool = True,
        mean: float = 0.5,
        std: float = 0.5,
    ):
        super().__init__()
        if not np.isfinite(threshold_grey) or threshold_grey <= 0:
            raise ValueError(f"threshold_grey must be finite and > 0, got {threshold_grey}")
        if cell_px < 2 or cell_px % (4 if overlap else 2):
            raise ValueError(
                f"cell_px must be even (a multiple of 4 with overlap: a symmetric grid of "
                f"half-cells) and >= 2, got {cell_px}"
            )
        if not scales_px or not radii_px or min(radii_px) < 1:
            raise ValueError(f"need sides and radii >= 1, got {scales_px}, {radii_px}")
        self.input_size, self.cell_px = int(input_size), int(cell_px)
        self.scales_px, self.radii_px = tuple(map(int, scales_px)), tuple(map(int, radii_px))
        self.threshold_grey, self.mean, self.std = float(threshold_grey), float(mean), float(std)
        self.overlap = bool(overlap)
        # histograms are counted over bins of side `step` (half-cells with overlap)
        self.step_px = self.cell_px // 2 if self.overlap else self.cell_px
        self.register_buffer("uniform_bin", torch.tensor(UNIFORM_BIN), persistent=False)
        self.blocks: list[tuple[int, int, int]] = []  # (side, radius, counting bins a row)
        for side in self.scales_px:
            if side > self.input_size:
                raise ValueError(f"side {side} exceeds the input size {self.input_size}")
            if side != self.input_size:
                resize = torch.tensor(
                    area_resize_matrix(self.input_size, side), dtype=torch.float32
                )
                self.register_buffer(f"resize_{side}", resize, persistent=False)
            for radius in self.radii_px:
                interior = side - 2 * radius
                cells = interior // self.step_px
                if cells - self.overlap < 1:
                    raise ValueError(f"a {self.cell_px}-px cell does not fit at side {side}")
                self.blocks.append((side, radius, cells))
                self.register_buffer(
                    f"cell_index_{side}_{radius}",
                    self._cell_index(interior, cells),
                    persistent=False,
                )
        self.output_dim = sum(2 * c * c * NUM_LBP_BINS for c in self.cells_per_row())

    def cells_per_row(self) -> list[int]:
        """Cells a row of each (side, radius) block, in output order."""
        return [bins - self.overlap for _, _, bins in self.blocks]

    def _codes(self, grey: torch.Tensor, radius: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Upper and lower 8-bit codes ``(N, h, w)`` (float) of the interior of ``(N, H, W)``
        grey levels at ``radius`` (slices of the image: cheaper in ONNX Runtime than an
        8-channel convolution)."""
        height, width = grey.shape[-2:]
        r, t = radius, self.threshold_grey - 7.0 / 16.0
        centre = grey[:, r : height - r, r : width - r]
        upper = lower = torch.zeros_like(centre)
        for p, (dy, dx) in enumerate(_NEIGHBOURS):
            rows = slice(r + dy * r, height - r + dy * r)
            cols = slice(r + dx * r, width - r + dx * r)
            diff = grey[:, rows, cols] - centre
            upper = upper + (diff >= t).to(grey.dtype) * float(1 << p)
            lower = lower + (diff <= -t).to(grey.dtype) * float(1 << p)
        return upper, lower

    def _cell_index(self, interior: int, cells: int) -> torch.Tensor:
        """``(interior²,)``: first histogram slot of each interior pixel's counting bin (a
        centred grid of ``step_px`` squares); pixels outside every bin point at a discarded
        extra one."""
        offset = (interior - cells * self.step_px) // 2
        rows = torch.arange(interior) - offset
        inside = (rows >= 0) & (rows < cells * self.step_px)
        cell = torch.where(inside, rows // self.step_px, torch.full_like(rows, -1))
        y, x = cell.view(-1, 1), cell.view(1, -1)
        outside = torch.full_like(y * x, cells * cells)
        index = torch.where((y >= 0) & (x >= 0), y * cells + x, outside)
        return (index * NUM_LBP_BINS).flatten().int()  # int32: half the bytes in an export

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        grey = (images * self.std + self.mean) * 255.0
        n = images.shape[0]
        parts = []
        for side, radius, cells in self.blocks:
            scaled = grey
            if side != self.input_size:
                resize = getattr(self, f"resize_{side}")
                scaled = resize @ grey @ resize.T
            upper, lower = self._codes(scaled[:, 0], radius)
            slots = (cells * cells + 1) * NUM_LBP_BINS
            base = getattr(self, f"cell_index_{side}_{radius}").long()
            codes = torch.stack([upper, lower], dim=1).flatten().long()  # (N · 2 · h · w,)
            # a gather along an axis of the (1, 256) table: onnxruntime's GatherElements, a
            # tight loop, where an index_select (Gather) copies every element on its own
            bins = torch.gather(self.uniform_bin.view(1, -1), 1, codes.view(1, -1)).view(n, -1)
            index = bins + torch.cat([base, base + slots])
            counts = torch.zeros(n, 2 * slots, dtype=grey.dtype, device=grey.device)
            counts = counts.scatter_add(1, index, torch.ones_like(index, dtype=grey.dtype))
            counts = counts.view(n, 2, slots)[:, :, : cells * cells * NUM_LBP_BINS]
            if self.overlap:  # cells = 2 × 2 windows of half-cells, every half-cell
                c = counts.reshape(n, 2, cells, cells, NUM_LBP_BINS)
                counts = c[:, :, :-1, :-1] + c[:, :, 1:, :-1] + c[:, :, :-1, 1:] + c[:, :, 1:, 1:]
            parts.append((counts / float(self.cell_px**2)).sqrt().flatten(1))
        return torch.cat(parts, dim=1)

    def mirror_permutation(self) -> torch.Tensor:
        """``(D,)`` long ``π`` with ``self(mirror(x)) = self(x)[:, π]``: cells reflected left to
        right, bins through the mirrored neighbour ring."""
        mirror_bin = torch.tensor(mirror_bin_table())
        parts, start = [], 0
        for cells in self.cells_per_row():
            for _code in range(2):
                y, x, b = torch.meshgrid(
                    torch.arange(cells),
                    torch.arange(cells),
                    torch.arange(NUM_LBP_BINS),
                    indexing="ij",
                )
                source = (y * cells + (cells - 1 - x)) * NUM_LBP_BINS + mirror_bin[b]
                parts.append(start + source.flatten())
                start += cells * cells * NUM_LBP_BINS
        return torch.cat(parts)
