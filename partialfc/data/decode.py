"""Image bytes <-> RGB uint8 arrays, and arrays -> C×H×W uint8 tensors.

Colour order: everything inside partialfc is RGB. OpenCV decodes to BGR by default, so
:func:`decode_image` asks it for RGB (``IMREAD_COLOR_RGB``) or converts once, here.
InsightFace ``.rec``/``.bin`` files hold
ordinary JPEG/PNG bytes (written by ``cv2.imencode`` from BGR arrays, which yields a standard,
correctly coloured JPEG), so decoding them with this function gives the true RGB image.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

# OpenCV >= 4.10 can decode straight to RGB (no extra pass); older versions convert after.
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", 0)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".tif", ".tiff", ".webp")


def decode_image(data: bytes, source: str = "<bytes>", grayscale: bool = False) -> np.ndarray:
    """Decode JPEG/PNG/... bytes to uint8 RGB (H, W, 3), or (H, W) when ``grayscale``.

    Raises ValueError naming ``source`` when the bytes are not a decodable image.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    flag = cv2.IMREAD_GRAYSCALE if grayscale else _IMREAD_RGB or cv2.IMREAD_COLOR
    image = cv2.imdecode(buf, flag) if buf.size else None
    if image is None:
        raise ValueError(f"{source}: not a decodable image ({len(data)} bytes)")
    if grayscale or _IMREAD_RGB:
        return image
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def encode_image(image: np.ndarray, ext: str = ".jpg", quality: int = 95) -> bytes:
    """Encode an RGB (H, W, 3) or grey (H, W) uint8 array to bytes (``ext`` ".jpg" or ".png")."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"encode_image expects uint8, got {image.dtype}")
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)] if ext.lower() in (".jpg", ".jpeg") else []
    ok, buf = cv2.imencode(ext, image, params)
    if not ok:
        raise ValueError(f"cannot encode image of shape {image.shape} as {ext}")
    return buf.tobytes()


def image_extension(data: bytes) -> str:
    """File extension matching the magic bytes of an encoded image (".jpg", ".png", ...)."""
    if data[:3] == b"\xff\xd8\xff":
        return ".jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return ".png"
    if data[:2] == b"BM":
        return ".bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return ".bin"


def to_chw_tensor(image: np.ndarray, copy: bool = True) -> torch.Tensor:
    """uint8 (H, W) or (H, W, C) array -> uint8 tensor of shape (C, H, W).

    ``copy=True``: a contiguous tensor that owns its memory. ``copy=False``: a permuted view of
    ``image`` (channels-last strides), for freshly decoded buffers: the one transposing copy
    then happens when the DataLoader stacks the batch (``torch.stack`` writes a contiguous
    NCHW batch), which is about a third cheaper per image at 112x112 than copying here.
    """
    chw = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)  # numpy views: cheap
    return torch.from_numpy(np.ascontiguousarray(chw) if copy else chw)
