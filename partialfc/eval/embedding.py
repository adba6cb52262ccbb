"""Calling an embedding function for evaluation: the flip test, resizing, shift averaging.

The batching and flip loop is :func:`partialfc.backbone.embedding.embed_in_batches`.

An *embed function* maps ``uint8`` images ``(N, H, W)`` or ``(N, H, W, C)`` to an ``(N, d)``
array. ``partialfc.backbone.embedder.Embedder.embed`` is one; so is any Python callable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from partialfc.backbone.embedding import (
    call_embed_fn,
    embed_in_batches,
    l2_normalize,
)

from .progress import progress_bar

EmbedFn = Callable[[np.ndarray], np.ndarray]


def embed_images(
    embed_fn: EmbedFn,
    images: np.ndarray,
    flip: bool = False,
    batch_size: int = 256,
    normalize: bool = True,
) -> np.ndarray:
    """Embeddings ``(N, d)`` float32, L2-normalised unless ``normalize=False``.

    With ``flip=True`` (the flip test) each embedding is ``normalize(e(x) + e(flip(x)))``,
    i.e. the two raw embeddings are summed before normalising. ``normalize=False`` keeps the
    raw norm (a quality signal) for template pooling. A progress bar shows on a terminal
    (:mod:`partialfc.eval.progress`).
    """
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {images.dtype}")
    count = len(images) * (2 if flip else 1) if images.ndim else 0
    with progress_bar(count, "embedding", "img") as bar:

        def counted(batch: np.ndarray) -> np.ndarray:  # mirror images count too
            embeddings = embed_fn(batch)
            bar.update(len(batch))
            return embeddings

        out = embed_in_batches(counted, images, flip=flip, batch_size=batch_size)
    return l2_normalize(out) if normalize else out


def resize_images(images: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """Resize ``(N, H, W[, C])`` uint8 images to ``size_hw`` (area filter when shrinking,
    bilinear when enlarging); returned unchanged when they already have that size. The aspect
    ratio is not preserved: use it for already-cropped faces/characters."""
    import cv2

    h, w = int(size_hw[0]), int(size_hw[1])
    if images.shape[1:3] == (h, w):
        return images
    shrink = images.shape[1] * images.shape[2] > h * w
    interpolation = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    out = [cv2.resize(im, (w, h), interpolation=interpolation) for im in images]
    return np.stack(out).reshape(len(images), h, w, *images.shape[3:])


def with_input_size(embed_fn: EmbedFn, size_hw: tuple[int, int]) -> EmbedFn:
    """An embed function that first resizes its images to the model's input size."""

    def resized_embed_fn(images: np.ndarray) -> np.ndarray:
        return embed_fn(resize_images(np.asarray(images), size_hw))

    return resized_embed_fn


def shift_image_batch(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``(N, H, W[, C])`` images moved ``dy`` rows down and ``dx`` columns right; the pixels
    moved in are 0 (paper, for ink = 255 drawings; black for photos)."""
    if images.ndim not in (3, 4):
        raise ValueError(f"images must be (N, H, W) or (N, H, W, C), got shape {images.shape}")
    h, w = images.shape[1:3]
    if abs(dy) >= h or abs(dx) >= w:
        raise ValueError(f"shift ({dy}, {dx}) pixels does not fit {h}x{w} images")
    out = np.zeros_like(images)
    out[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = images[
        :, max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def with_shift_averaging(embed_fn: EmbedFn, shift_px: int) -> EmbedFn:
    """Test-time augmentation: the mean of the L2-normalised embeddings of the image and of
    its four copies moved ``shift_px`` pixels up, down, left and right.

    Each copy is one more forward pass (5× the embedding cost); ``shift_px=0`` returns
    ``embed_fn`` unchanged. The protocol is unchanged: every image is still embedded on its own.
    """
    shift_px = int(shift_px)
    if shift_px < 0:
        raise ValueError(f"shift_px must be >= 0 pixels, got {shift_px}")
    if shift_px == 0:
        return embed_fn
    offsets = ((0, 0), (-shift_px, 0), (shift_px, 0), (0, -shift_px), (0, shift_px))

    def shift_averaged_embed_fn(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images)
        total = None
        for dy, dx in offsets:
            copy = images if (dy, dx) == (0, 0) else shift_image_batch(images, dy, dx)
            e = l2_normalize(call_embed_fn(embed_fn, copy))
            total = e if total is None else total + e
        return total / len(offsets)

    return shift_averaged_embed_fn


def ensemble_embed_fn(embed_fns: list[EmbedFn]) -> EmbedFn:
    """Several models as one: the L2-normalised embeddings of the ``M`` models concatenated and
    divided by ``sqrt(M)``, so the result has unit norm and the cosine of two images is the mean
    of the models' cosines (score-level fusion by the mean; Kittler et al., "On combining
    classifiers", IEEE TPAMI 1998, sum rule). One model is returned unchanged.
    """
    if not embed_fns:
        raise ValueError("an ensemble needs at least one model")
    if len(embed_fns) == 1:
        return embed_fns[0]
    scale = 1.0 / np.sqrt(len(embed_fns))

    def ensemble(images: np.ndarray) -> np.ndarray:
        parts = [l2_normalize(call_embed_fn(fn, images)) * scale for fn in embed_fns]
        return np.concatenate(parts, axis=1).astype(np.float32, copy=False)

    return ensemble
