"""The embedding loop: a backbone over batches of images, in eval mode and without gradients.

Every caller that runs a backbone on images goes through :func:`run_backbone` — the trainer's
evaluation, the :class:`~partialfc.backbone.embedder.Embedder` of deployment and evaluation, the
cleaning tool — so the model's mode, the autocast and the device are handled in one place.
:func:`embed_in_batches` is the one loop that calls an embed function batch by batch with the
flip test (evaluation's ``embed_images`` and ``Embedder.embed_raw`` both use it), and
:func:`l2_normalize` the one NumPy row normalisation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from partialfc.backbone.pixels import normalize_batch


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows divided by their L2 norm (rows of zeros stay zero), float32."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def flip_horizontal(images: np.ndarray) -> np.ndarray:
    """Mirror ``(N, H, W[, C])`` images left–right."""
    if images.ndim not in (3, 4):
        raise ValueError(f"images must be (N, H, W) or (N, H, W, C), got shape {images.shape}")
    return images[:, :, ::-1]


def call_embed_fn(embed_fn: Callable[[np.ndarray], np.ndarray], batch: np.ndarray) -> np.ndarray:
    """``embed_fn(batch)`` as float32, checked to be ``(len(batch), d)``."""
    e = np.asarray(embed_fn(batch), dtype=np.float32)
    if e.ndim != 2 or e.shape[0] != batch.shape[0]:
        raise ValueError(f"embed function returned shape {e.shape} for {batch.shape[0]} images")
    return e


def embed_in_batches(
    embed_fn: Callable[[np.ndarray], np.ndarray],
    images: np.ndarray,
    flip: bool = False,
    batch_size: int = 256,
) -> np.ndarray:
    """Raw float32 ``(N, d)`` embeddings: ``embed_fn`` on ``batch_size`` images at a time.

    With ``flip=True`` (the flip test) row ``i`` is ``e(x_i) + e(mirror(x_i))``, the sum of
    the raw embeddings of the image and of its left–right mirror; normalising it gives the
    flip-test embedding. Defaults: no flip, 256 images per call.
    """
    images = np.asarray(images)
    if images.ndim not in (3, 4) or len(images) == 0:
        raise ValueError(f"images must be a non-empty (N, H, W[, C]) array, got {images.shape}")
    out = []
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size]
        e = call_embed_fn(embed_fn, batch)
        if flip:
            e = e + call_embed_fn(embed_fn, np.ascontiguousarray(flip_horizontal(batch)))
        out.append(e)
    return np.concatenate(out)


def as_nchw(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)`` (C in 1, 3) -> ``(N, C, H, W)``."""
    x = torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
    if x.ndim == 3:
        return x.unsqueeze(1)
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        return x.permute(0, 3, 1, 2)
    return x


def run_backbone(
    backbone: nn.Module,
    batches: Iterable[torch.Tensor],
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None = normalize_batch,
) -> Iterator[torch.Tensor]:
    """Yield ``backbone(preprocess(batch))`` as float32 CPU tensors, one per batch.

    The backbone runs in eval mode under ``no_grad`` (its mode is restored afterwards) and,
    with ``autocast_dtype``, under autocast. ``preprocess`` maps a batch on ``device`` to the
    network input; the default is the training normalisation of uint8 ``(B, C, H, W)``
    batches, None passes ready-made input through.
    """
    device = torch.device(device)
    was_training = backbone.training
    backbone.eval()
    try:
        for batch in batches:
            with torch.no_grad():  # not around the yield: the caller keeps its grad mode
                x = batch.to(device)
                if preprocess is not None:
                    x = preprocess(x)
                with torch.autocast(
                    device.type,
                    dtype=autocast_dtype or torch.float32,
                    enabled=autocast_dtype is not None,
                ):
                    e = backbone(x)
                e = e.float().cpu()
            yield e
    finally:
        backbone.train(was_training)


def embed_array(
    backbone: nn.Module,
    images: np.ndarray,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
) -> np.ndarray:
    """Raw float32 ``(N, d)`` embeddings of uint8 images (any layout :func:`as_nchw` reads)."""
    batches = (
        as_nchw(images[start : start + batch_size]) for start in range(0, len(images), batch_size)
    )
    return torch.cat(list(run_backbone(backbone, batches, device, autocast_dtype))).numpy()
