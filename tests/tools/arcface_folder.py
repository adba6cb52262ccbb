"""A small synthetic arcface_torch dataset folder: ``train.rec`` / ``train.idx`` in InsightFace's
layout (header record, identity ranges), ``property``, and ``lfw.bin`` / ``cfp_fp.bin``
verification sets, all of 112×112 RGB images of a few random "identities"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from partialfc.data.decode import encode_image
from partialfc.data.pack import pack_images
from partialfc.data.verification_bin import write_verification_bin

SIZE = 112


def _identity_images(
    rng, prototypes: np.ndarray, identity: int, count: int, noise: float = 40.0
) -> np.ndarray:
    """``count`` noisy copies of one identity's prototype (uint8, (count, H, W, 3))."""
    noise = rng.normal(0.0, noise, (count, *prototypes.shape[1:]))
    return np.clip(prototypes[identity][None] + noise, 0, 255).astype(np.uint8)


def write_arcface_folder(
    root: Path,
    num_classes: int = 6,
    per_class: int = 6,
    pairs: int = 40,
    seed: int = 0,
    pair_noise: float = 40.0,
) -> Path:
    """Write the folder under ``root`` and return it; ``pair_noise`` (the pixel noise of the
    verification images) sets how hard the pairs are."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    prototypes = rng.integers(0, 256, (num_classes, SIZE, SIZE, 3)).astype(np.float64)
    source = root / "images"
    source.mkdir()
    paths, labels = [], []
    for identity in range(num_classes):
        for i, image in enumerate(_identity_images(rng, prototypes, identity, per_class)):
            path = source / f"{identity}_{i}.png"
            path.write_bytes(encode_image(image, ".png"))
            paths.append(str(path))
            labels.append(identity)
    pack_images(paths, labels, root / "train.rec", progress=False)
    (root / "property").write_text(f"{num_classes},{SIZE},{SIZE}")
    for name in ("lfw", "cfp_fp"):
        blobs, issame = [], []
        for k in range(pairs):
            genuine = k % 2 == 0
            a = int(rng.integers(num_classes))
            b = a if genuine else int((a + 1 + rng.integers(num_classes - 1)) % num_classes)
            first = _identity_images(rng, prototypes, a, 1, pair_noise)[0]
            second = _identity_images(rng, prototypes, b, 1, pair_noise)[0]
            blobs += [encode_image(first, ".png"), encode_image(second, ".png")]
            issame.append(genuine)
        write_verification_bin(root / f"{name}.bin", blobs, issame)
    return root
