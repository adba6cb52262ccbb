"""A hand-crafted face descriptor learned without gradients: multi-scale uniform LBP histograms,
projected by PCA and whitened within classes.

* **Uniform LBP** (Ojala, Pietikäinen & Mäenpää, "Multiresolution gray-scale and rotation
  invariant texture classification with local binary patterns", TPAMI 2002, Sec. 2): each pixel
  gets the 8-bit code ``Σ_p [g_p ≥ g_c] · 2^p`` of its 8 neighbours ``g_p`` at radius ``r``
  against the centre ``g_c``; the 58 codes with at most two 0/1 transitions around the circle
  keep a bin each, every other code shares bin 58 (59 bins). The neighbours here are the 8
  pixels of the square of half-side ``r`` (corners at ``r·√2``, not interpolated onto a circle).
* **Local ternary patterns** (Tan & Triggs, "Enhanced local texture feature sets for face
  recognition under difficult lighting conditions", IEEE TIP 2010, Sec. III-A), with
  ``LbpGrid.ternary_threshold`` ``t > 0``: neighbour ``p`` is +1 where ``g_p ≥ g_c + t``, −1
  where ``g_p ≤ g_c − t`` and 0 in between; the code is split into an upper binary code (the +1
  bits) and a lower one (the −1 bits), each histogrammed as a uniform LBP code (2 × 59 bins a
  cell). Small grey-level noise around ``g_c`` then no longer flips bits.
* **Face description** (Ahonen, Hadid & Pietikäinen, "Face description with local binary
  patterns", TPAMI 2006, Sec. 3): histograms of the codes over a grid of cells, concatenated; here
  over overlapping cells, at several image scales and radii (the multi-scale, high-dimensional
  LBP of Chen, Cao, Wen & Sun, "Blessing of dimensionality", CVPR 2013, Sec. 3), each cell's
  histogram normalised to sum 1 and square-rooted (the Hellinger map, so that the cosine of two
  descriptors is the Bhattacharyya coefficient of their histograms, averaged over cells).
* **Learned projection**: PCA of the training descriptors to ``num_components`` dimensions, then
  within-class covariance normalisation (WCCN, Hatch, Kajarekar & Stolcke, ICSLP 2006;
  :class:`partialfc.models.whitening.WithinClassWhitening`) learned on the training identities.

:class:`LbpWccnEmbedder` maps ``(N, H, W)`` uint8 grey faces to ``(N, num_components)``
embeddings compared by cosine, like a backbone's; :func:`fuse_embeddings` joins them to a
network's embeddings so that the cosine becomes a weighted sum of the two cosines. The embedder
is a model learned without gradients, not an ``nn.Module`` (hence not in
:data:`partialfc.models.MODELS`): like :class:`partialfc.models.whitening.WithinClassWhitening`,
which it uses, it is fitted in closed
form on a few thousand images (about a minute), and is meant to be fused with a trained network
where the training set is small.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

NUM_LBP_BINS = 59  # 58 uniform 8-bit patterns + one bin for all the others
# neighbour offsets (dy, dx) in units of the radius, bit p of the code = neighbour p
_NEIGHBOURS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))


def _uniform_bin_table() -> np.ndarray:
    """``(256,)`` bin of every 8-bit code: uniform codes (≤ 2 circular transitions) get bins
    0..57 in increasing code order, the rest bin 58."""
    table = np.full(256, NUM_LBP_BINS - 1, dtype=np.int64)
    next_bin = 0
    for code in range(256):
        bits = [(code >> i) & 1 for i in range(8)]
        if sum(bits[i] != bits[(i + 1) % 8] for i in range(8)) <= 2:
            table[code] = next_bin
            next_bin += 1
    return table


UNIFORM_BIN = _uniform_bin_table()


def lbp_codes(images: np.ndarray, radius_px: int) -> np.ndarray:
    """Raw 8-bit LBP codes ``(N, H − 2r, W − 2r)`` (int64) of the interior pixels of ``(N, H, W)``
    grey images: bit ``p`` is ``[g_p ≥ g_c]`` for neighbour ``p`` of ``_NEIGHBOURS`` scaled by
    ``radius_px``."""
    x = np.asarray(images, dtype=np.float32)
    return _neighbour_codes(x, x, int(radius_px))


def ltp_codes(
    images: np.ndarray, radius_px: int, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Upper and lower 8-bit codes ``(N, H − 2r, W − 2r)`` (int64) of the local ternary pattern
    of the interior pixels of ``(N, H, W)`` grey images: bit ``p`` of the upper code is
    ``[g_p ≥ g_c + t]``, of the lower code ``[g_p ≤ g_c − t]`` (``t`` = ``threshold`` in grey
    levels, > 0), neighbours as in :func:`lbp_codes`."""
    if not np.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"threshold must be a finite number of grey levels > 0, got {threshold}")
    x = np.asarray(images, dtype=np.float32)
    # g_p ≥ g_c + t  ⇔  g_p − t ≥ g_c, and g_p ≤ g_c − t  ⇔  (−g_p) − t ≥ (−g_c)
    upper = _neighbour_codes(x - np.float32(threshold), x, int(radius_px))
    lower = _neighbour_codes(-x - np.float32(threshold), -x, int(radius_px))
    return upper, lower


def _neighbour_codes(neighbours: np.ndarray, centres: np.ndarray, r: int) -> np.ndarray:
    """Bit ``p`` = ``[neighbours at offset p ≥ centres]`` over the interior at radius ``r``."""
    if neighbours.ndim != 3:
        raise ValueError(f"images must be (N, H, W) grey, got shape {neighbours.shape}")
    if r < 1 or min(neighbours.shape[1:]) <= 2 * r:
        raise ValueError(f"radius_px must be >= 1 and leave an interior, got {r}")
    height, width = neighbours.shape[1:]
    centre = centres[:, r : height - r, r : width - r]
    codes = np.zeros(centre.shape, dtype=np.int64)
    for bit, (dy, dx) in enumerate(_NEIGHBOURS):
        neighbour = neighbours[:, r + dy * r : height - r + dy * r, r + dx * r : width - r + dx * r]
        codes |= (neighbour >= centre).astype(np.int64) << bit
    return codes


@dataclass(frozen=True)
class LbpGrid:
    """Where histograms are taken: each face is resized (area interpolation) to every side in
    ``scales_px``; at each scale and radius in ``radii_px``, uniform-LBP histograms are taken over
    ``cell_px``-square cells every ``stride_px`` pixels (from the top-left corner, cells that fit).

    ``ternary_threshold`` (grey levels): 0 takes LBP codes (:func:`lbp_codes`, 59 bins a cell),
    ``t > 0`` local ternary patterns (:func:`ltp_codes`, upper then lower code, 2 × 59 bins).

    Defaults (for 96×96 aligned crops): sides 96, 64, 48; radii 1 and 2; 12-px cells every 6 px;
    LBP codes (36,934 dimensions).
    """

    scales_px: tuple[int, ...] = (96, 64, 48)
    radii_px: tuple[int, ...] = (1, 2)
    cell_px: int = 12
    stride_px: int = 6
    ternary_threshold: float = 0.0

    def __post_init__(self) -> None:
        if not np.isfinite(self.ternary_threshold) or self.ternary_threshold < 0:
            raise ValueError(
                f"LbpGrid: ternary_threshold must be finite and >= 0 grey levels, "
                f"got {self.ternary_threshold}"
            )
        values = (*self.scales_px, *self.radii_px, self.cell_px, self.stride_px)
        if not self.scales_px or not self.radii_px or min(values) < 1:
            raise ValueError(f"LbpGrid needs positive sides, radii, cell and stride, got {self}")
        for scale in self.scales_px:
            if self.cell_px > scale - 2 * max(self.radii_px):
                raise ValueError(f"LbpGrid: a {self.cell_px}-px cell does not fit at side {scale}")


def lbp_histograms(
    images: np.ndarray, grid: LbpGrid = LbpGrid(), batch_size: int = 64
) -> np.ndarray:
    """``(N, D)`` float32 descriptor of ``(N, H, W)`` grey images: for every scale, radius, code
    (one for LBP, upper then lower for LTP) and cell of ``grid`` (in that order), the square root
    of the cell's normalised 59-bin uniform-pattern histogram (each cell's block has unit L2
    norm); ``batch_size`` images at a time."""
    import cv2
    import torch
    import torch.nn.functional as F

    x = np.asarray(images)
    if x.ndim != 3 or x.shape[0] == 0:
        raise ValueError(f"images must be a non-empty (N, H, W) grey stack, got shape {x.shape}")
    if len(x) > batch_size:  # the one-hot maps take 59 floats per pixel
        return np.concatenate(
            [
                lbp_histograms(x[i : i + batch_size], grid, batch_size)
                for i in range(0, len(x), batch_size)
            ]
        )
    x = x.astype(np.float32)
    parts = []
    # one buffer for every one-hot map of the batch (the first, largest, sets its size): a fresh
    # 59-floats-per-pixel allocation per scale, radius and code pages in slowly
    largest = max(grid.scales_px) - 2 * min(grid.radii_px)
    buffer = torch.empty(len(x) * NUM_LBP_BINS * largest * largest)
    for side in grid.scales_px:
        if x.shape[1:] == (side, side):
            scaled = x
        else:
            scaled = np.stack(
                [cv2.resize(im, (side, side), interpolation=cv2.INTER_AREA) for im in x]
            )
        for radius in grid.radii_px:
            if grid.ternary_threshold > 0:
                codes = ltp_codes(scaled, radius, grid.ternary_threshold)
            else:
                codes = (lbp_codes(scaled, radius),)
            for code in codes:
                bins = torch.from_numpy(UNIFORM_BIN[code]).unsqueeze(1)
                shape = (len(x), NUM_LBP_BINS, *bins.shape[2:])
                one_hot = buffer[: math.prod(shape)].view(shape).zero_()
                one_hot.scatter_(1, bins, 1.0)
                hist = F.avg_pool2d(one_hot, grid.cell_px, grid.stride_px)  # (N, 59, gy, gx)
                parts.append(hist.permute(0, 2, 3, 1).reshape(len(x), -1).sqrt().numpy())
    return np.concatenate(parts, axis=1)


def _unit_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows divided by their L2 norm (rows of zeros stay zero), float32."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def fuse_embeddings(model: np.ndarray, lbp: np.ndarray, lbp_weight: float) -> np.ndarray:
    """``[ê_model, √w · ê_lbp]`` (``ê`` = the row L2-normalised): the cosine of two fused
    embeddings is ``(cos_model + w · cos_lbp) / (1 + w)``, a weighted sum of the two scores
    (score-level fusion). ``lbp_weight`` (``w``) must be finite and >= 0."""
    if not np.isfinite(lbp_weight) or lbp_weight < 0:
        raise ValueError(f"lbp_weight must be finite and >= 0, got {lbp_weight}")
    if len(model) != len(lbp):
        raise ValueError(f"{len(model)} model embeddings but {len(lbp)} LBP embeddings")
    parts = [_unit_rows(model), np.sqrt(lbp_weight) * _unit_rows(lbp)]
    return np.concatenate(parts, axis=1).astype(np.float32)


class LbpWccnEmbedder:
    """``uint8 (N, H, W) → (N, num_components)``: ``Pᵀ Cᵀ (h(x) + h(mirror(x)) − μ)`` with ``h`` =
    :func:`lbp_histograms`, ``C`` the first ``num_components`` principal axes and ``μ`` the mean of
    the training descriptors, ``P`` their within-class whitening (WCCN with ridge
    ``regularization``, in units of the mean eigenvalue). Compare embeddings by cosine.

    Defaults: :class:`LbpGrid` defaults, 1,600 components, ridge 0.3, mirror averaging on.
    """

    def __init__(
        self,
        grid: LbpGrid = LbpGrid(),
        num_components: int = 1600,
        regularization: float = 0.3,
        flip: bool = True,
    ):
        from partialfc.models.whitening import WithinClassWhitening

        if int(num_components) < 1:
            raise ValueError(f"num_components must be >= 1, got {num_components}")
        WithinClassWhitening(regularization)  # validates the ridge now
        self.grid = grid
        self.num_components = int(num_components)
        self.regularization = float(regularization)
        self.flip = bool(flip)
        self.mean: np.ndarray | None = None  # (D,) float32
        self.projection: np.ndarray | None = None  # (D, num_components) float32: C P

    def descriptor(self, images: np.ndarray) -> np.ndarray:
        """``h(x)``, plus ``h(mirror(x))`` when :attr:`flip` (before the learned projection)."""
        h = lbp_histograms(images, self.grid)
        if self.flip:
            h = h + lbp_histograms(np.ascontiguousarray(np.asarray(images)[:, :, ::-1]), self.grid)
        return h

    def fit(self, images: np.ndarray, labels: np.ndarray) -> LbpWccnEmbedder:
        """Learn ``μ``, ``C`` and ``P`` from training faces and their identity labels
        (:meth:`fit_descriptors` of their :meth:`descriptor`)."""
        labels = np.asarray(labels)
        if labels.shape != (len(images),):
            raise ValueError(f"labels must be ({len(images)},), got shape {labels.shape}")
        return self.fit_descriptors(self.descriptor(images), labels)

    def fit_descriptors(self, descriptors: np.ndarray, labels: np.ndarray) -> LbpWccnEmbedder:
        """:meth:`fit` from precomputed ``(N, D)`` descriptors (e.g. to try several component
        counts or ridges on one set): exact PCA through the ``N × N`` Gram matrix, then WCCN;
        needs more descriptors than components and one identity with two of them."""
        from partialfc.models.whitening import WithinClassWhitening

        h = np.asarray(descriptors, dtype=np.float64)
        labels = np.asarray(labels)
        if h.ndim != 2 or labels.shape != (len(h),):
            raise ValueError(
                f"descriptors must be (N, D) with labels (N,), got {h.shape} and {labels.shape}"
            )
        if self.num_components >= len(h):
            raise ValueError(
                f"num_components ({self.num_components}) must be below the number of training "
                f"images ({len(h)})"
            )
        mean = h.mean(axis=0)
        centred = h - mean if h is descriptors else np.subtract(h, mean, out=h)  # no 2nd copy
        eigenvalues, vectors = np.linalg.eigh(centred @ centred.T)  # ascending
        top = np.argsort(eigenvalues)[::-1][: self.num_components]
        if eigenvalues[top[-1]] <= 1e-9 * eigenvalues[top[0]]:
            raise ValueError(
                f"the training descriptors span fewer than {self.num_components} dimensions"
            )
        axes = centred.T @ (vectors[:, top] / np.sqrt(eigenvalues[top]))  # (D, k), orthonormal
        whitening = WithinClassWhitening(self.regularization).fit(centred @ axes, labels)
        self.mean = mean.astype(np.float32)
        self.projection = (axes @ whitening.projection).astype(np.float32)
        return self

    def project(self, descriptors: np.ndarray) -> np.ndarray:
        """The embedding of precomputed :meth:`descriptor` output: ``(h − μ) C P``."""
        self._check_fitted()
        return (np.asarray(descriptors, dtype=np.float32) - self.mean) @ self.projection

    def _check_fitted(self) -> None:
        if self.projection is None or self.mean is None:
            raise RuntimeError("LbpWccnEmbedder is not fitted: call fit(images, labels) first")

    def __call__(self, images: np.ndarray) -> np.ndarray:
        self._check_fitted()  # before the costly descriptor
        return self.project(self.descriptor(images))

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | Path) -> Path:
        """Write the fitted embedder to ``path`` (``.npz``, plain arrays; temp file + rename)."""
        self._check_fitted()
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        try:
            self._write(tmp)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # nothing half-written is left behind
        return path

    def _write(self, tmp: Path) -> None:
        grid = asdict(self.grid)
        np.savez(
            tmp,
            mean=self.mean,
            projection=self.projection,
            scales_px=np.asarray(grid["scales_px"]),
            radii_px=np.asarray(grid["radii_px"]),
            cell_stride_px=np.asarray([self.grid.cell_px, self.grid.stride_px]),
            ternary_threshold=np.float64(self.grid.ternary_threshold),
            regularization=np.float64(self.regularization),
            flip=np.bool_(self.flip),
        )

    @classmethod
    def load(cls, path: str | Path) -> LbpWccnEmbedder:
        """Read an embedder written by :meth:`save` (no pickled objects are read)."""
        keys = ("mean", "projection", "scales_px", "radii_px", "cell_stride_px", "regularization")
        keys += ("flip",)
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = [k for k in keys if k not in data.files]
                if missing:
                    raise ValueError(f"missing arrays {missing}")
                arrays = {k: data[k] for k in keys}
                # absent from files written before LTP codes existed: those are LBP (0)
                threshold = float(data["ternary_threshold"]) if "ternary_threshold" in data else 0.0
            cell, stride = (int(v) for v in arrays["cell_stride_px"])
            grid = LbpGrid(
                tuple(int(v) for v in arrays["scales_px"]),
                tuple(int(v) for v in arrays["radii_px"]),
                cell,
                stride,
                threshold,
            )
            mean, projection = arrays["mean"], arrays["projection"]
            if mean.ndim != 1 or projection.ndim != 2 or projection.shape[0] != mean.shape[0]:
                raise ValueError(f"mean {mean.shape} and projection {projection.shape} disagree")
            expected = lbp_histograms(np.zeros((1, 8, 8), np.uint8), grid).shape[1]
            if mean.shape[0] != expected:
                raise ValueError(
                    f"its grid gives {expected}-dimensional descriptors, not {mean.shape[0]}"
                )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a saved LbpWccnEmbedder ({err})") from None
        embedder = cls(
            grid, projection.shape[1], float(arrays["regularization"]), bool(arrays["flip"])
        )
        embedder.mean = mean.astype(np.float32)
        embedder.projection = projection.astype(np.float32)
        return embedder
