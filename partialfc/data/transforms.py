"""Augmentations on uint8 image tensors (C, H, W), meant to run in DataLoader workers (the
batch normalisation on the training device is :func:`partialfc.backbone.pixels.normalize_batch`).

Randomness comes from torch's global generator (``torch.rand``), so a caller can make each
sample's augmentation reproducible by seeding around the call (``torch.random.fork_rng``).
Outputs stay uint8: workers ship 4x fewer bytes than float images.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(()))


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return x.round_().clamp_(0, 255).to(torch.uint8)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[torch.Tensor], torch.Tensor]]):
        self.transforms = list(transforms)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            image = transform(image)
        return image


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (default 0.5)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.flip(-1) if float(torch.rand(())) < self.p else image


class RandomCrop:
    """Zero-pad by ``padding`` pixels on each side, then crop ``size`` x ``size`` at a uniformly
    random position (default padding 0: crops must be smaller than the image)."""

    def __init__(self, size: int, padding: int = 0):
        self.size = int(size)
        self.padding = int(padding)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if self.padding:
            image = F.pad(image, (self.padding,) * 4)
        h, w = image.shape[-2:]
        if h < self.size or w < self.size:
            raise ValueError(f"RandomCrop({self.size}) on an image of {h}x{w} (after padding)")
        top = int(torch.randint(h - self.size + 1, ()))
        left = int(torch.randint(w - self.size + 1, ()))
        return image[..., top : top + self.size, left : left + self.size].contiguous()


class ColorJitter:
    """Random brightness, contrast and saturation factors, each uniform in [1 - a, 1 + a].

    ``brightness`` scales pixels; ``contrast`` blends with the image's mean grey level;
    ``saturation`` blends with the per-pixel grey (Rec. 601 luma; RGB only). ``contrast`` and
    ``saturation`` default to ``brightness``. Applied in that fixed order.
    """

    def __init__(
        self,
        brightness: float = 0.2,
        contrast: float | None = None,
        saturation: float | None = None,
    ):
        self.brightness = float(brightness)
        self.contrast = self.brightness if contrast is None else float(contrast)
        self.saturation = self.brightness if saturation is None else float(saturation)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        x = image.float()
        if self.brightness:
            x = x * _uniform(1 - self.brightness, 1 + self.brightness)
        if self.contrast:
            f = _uniform(1 - self.contrast, 1 + self.contrast)
            x = _grey(x).mean() + (x - _grey(x).mean()) * f
        if self.saturation and x.shape[0] == 3:
            f = _uniform(1 - self.saturation, 1 + self.saturation)
            g = _grey(x)
            x = g + (x - g) * f
        return _to_uint8(x)


def _grey(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] != 3:
        return x.mean(0, keepdim=True)
    return (0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2]).unsqueeze(0)


class RandomAffine:
    """Random rotation (uniform in ±``max_rotation_deg``), shift (±``max_shift_frac`` of the
    side) and isotropic scale (1 ± ``max_scale_delta``) about the centre; bilinear, zero border."""

    def __init__(
        self,
        max_rotation_deg: float = 0.0,
        max_shift_frac: float = 0.0,
        max_scale_delta: float = 0.0,
    ):
        self.max_rotation_deg = float(max_rotation_deg)
        self.max_shift_frac = float(max_shift_frac)
        self.max_scale_delta = float(max_scale_delta)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        angle = math.radians(_uniform(-self.max_rotation_deg, self.max_rotation_deg))
        scale = _uniform(1 - self.max_scale_delta, 1 + self.max_scale_delta)
        tx = _uniform(-self.max_shift_frac, self.max_shift_frac) * 2  # grid units span 2
        ty = _uniform(-self.max_shift_frac, self.max_shift_frac) * 2
        cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
        # grid maps output coords to input coords: inverse of rotate-scale-then-shift
        theta = torch.tensor(
            [[cos, -sin, -(cos * tx - sin * ty)], [sin, cos, -(sin * tx + cos * ty)]],
            dtype=torch.float32,
        )
        x = image.float().unsqueeze(0)
        grid = F.affine_grid(theta.unsqueeze(0), list(x.shape), align_corners=False)
        out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return _to_uint8(out.squeeze(0))


class RandomErasing:
    """With probability ``p`` (default 0.5), replace one random rectangle of the image by
    uniform random pixels: random erasing (Zhong, Zheng, Kang, Li & Yang, "Random Erasing Data
    Augmentation", AAAI 2020, Alg. 1).

    The rectangle's area is a fraction uniform in [``min_area``, ``max_area``] (default
    [0.02, 0.4]) of the image and its aspect ratio h/w is log-uniform in [``min_aspect``,
    1/``min_aspect``] (default 0.3, i.e. [0.3, 3.33]; the paper draws it uniformly); draws
    whose rectangle does not fit are repeated, up to 10 times, after which the image is left
    unchanged. Every channel of the rectangle gets its own random values in [0, 255].
    """

    def __init__(
        self,
        p: float = 0.5,
        min_area: float = 0.02,
        max_area: float = 0.4,
        min_aspect: float = 0.3,
    ):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomErasing: p must be in [0, 1], got {p}")
        if not 0.0 < min_area <= max_area < 1.0:
            raise ValueError(
                f"RandomErasing: need 0 < min_area <= max_area < 1, got {min_area}, {max_area}"
            )
        if not 0.0 < min_aspect <= 1.0:
            raise ValueError(f"RandomErasing: min_aspect must be in (0, 1], got {min_aspect}")
        self.p = float(p)
        self.min_area = float(min_area)
        self.max_area = float(max_area)
        self.log_aspect = math.log(min_aspect)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if float(torch.rand(())) >= self.p:
            return image
        c, h, w = image.shape
        for _ in range(10):
            area = _uniform(self.min_area, self.max_area) * h * w
            aspect = math.exp(_uniform(self.log_aspect, -self.log_aspect))
            eh = int(round(math.sqrt(area * aspect)))
            ew = int(round(math.sqrt(area / aspect)))
            if 0 < eh < h and 0 < ew < w:
                top = int(torch.randint(h - eh + 1, ()))
                left = int(torch.randint(w - ew + 1, ()))
                out = image.clone()
                out[:, top : top + eh, left : left + ew] = torch.randint(
                    0, 256, (c, eh, ew), dtype=torch.uint8
                )
                return out
        return image


def collate_images(batch: list[tuple]) -> tuple[torch.Tensor, ...]:
    """DataLoader ``collate_fn`` for ``(image, label[, index])`` samples that keeps pixels in
    channels-last memory: images come back as uint8 (B, C, H, W) with
    ``memory_format=torch.channels_last`` (one plain copy per image instead of a transposing
    copy; convolutions accept it directly, call ``.contiguous()`` for NCHW memory); labels and
    indices as int64 tensors."""
    images = [sample[0] for sample in batch]
    hwc = [image.permute(1, 2, 0) for image in images]
    if all(view.is_contiguous() for view in hwc):
        stacked = torch.stack(hwc).permute(0, 3, 1, 2)
    else:
        stacked = torch.stack(images).contiguous(memory_format=torch.channels_last)
    rest = [
        torch.as_tensor([sample[i] for sample in batch], dtype=torch.int64)
        for i in range(1, len(batch[0]))
    ]
    return (stacked, *rest)
