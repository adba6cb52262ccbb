"""Image bytes <-> RGB uint8 arrays, and arrays -> C×H×W uint8 tensors.

Colour order: everything inside partialfc is RGB. OpenCV decodes to BGR by default, so
:func:`decode_image` asks it for RGB (``IMREAD_COLOR_RGB``) or converts once, here.
InsightFace ``.rec``/``.bin`` files hold
ordinary JPEG/PNG bytes (written by ``cv2.imencode`` from BGR arrays, which yields a standard,
correctly coloured JPEG), so decoding them with this function gives the true RGB image.
"""

from __future__ import annotations

import io
import os
import struct

import cv2
import numpy as np
import torch

# OpenCV >= 4.10 can decode straight to RGB (no extra pass); older versions convert after.
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", 0)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".tif", ".tiff", ".webp")

# Largest image decoded, in pixels (width x height), checked from the header before decoding:
# a few hundred bytes of PNG can claim 30000 x 30000 pixels (2.7 GB decoded). 8192 x 8192 is
# far above any face crop or photo. Override per call (``max_pixels=``), per process with the
# environment variable below, or with ``partialfc pack --max-image-pixels``.
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_PIXELS_ENV = "PARTIALFC_MAX_IMAGE_PIXELS"

# JPEG start-of-frame markers (they carry the image size); C4, C8 and CC are other segments
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def max_image_pixels() -> int:
    """The pixel limit in force: ``$PARTIALFC_MAX_IMAGE_PIXELS`` if set, else the default."""
    value = os.environ.get(MAX_PIXELS_ENV)
    if value is None:
        return MAX_IMAGE_PIXELS
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ValueError(f"{MAX_PIXELS_ENV}={value!r}: expected a whole number of pixels >= 1")
    return limit


def _jpeg_size(data) -> tuple[int, int] | None:
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length field
            pos += 2
            continue
        if marker in _JPEG_SOF:
            if pos + 9 > n:
                return None
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return width, height
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    return None


def image_size(data) -> tuple[int, int] | None:
    """(width, height) read from the header of encoded image bytes, without decoding; None
    when the header is not recognised (the decoder then gets to refuse the bytes). Raises
    ValueError for a header above Pillow's own decompression-bomb limit."""
    head = bytes(data[:26])
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:3] == b"\xff\xd8\xff":
        return _jpeg_size(data)
    from PIL import Image  # other formats: Pillow parses the header lazily

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            return im.size
    except Image.DecompressionBombError as err:  # Pillow's own limit, 2 x 89 M pixels
        raise ValueError(str(err)) from None
    except Exception:  # noqa: BLE001 - unknown formats are left to the decoder
        return None


def check_image_size(data, source: str = "<bytes>", max_pixels: int | None = None) -> None:
    """Raise ValueError naming ``source`` when the header claims more than ``max_pixels``
    (default :func:`max_image_pixels`) pixels."""
    limit = max_image_pixels() if max_pixels is None else int(max_pixels)
    try:
        size = image_size(data)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    if size is not None and size[0] * size[1] > limit:
        width, height = size
        raise ValueError(
            f"{source}: image header claims {width} x {height} = {width * height} pixels, above "
            f"the limit of {limit} (set the environment variable {MAX_PIXELS_ENV} to allow more)"
        )


def decode_image(
    data: bytes, source: str = "<bytes>", grayscale: bool = False, max_pixels: int | None = None
) -> np.ndarray:
    """Decode JPEG/PNG/... bytes to uint8 RGB (H, W, 3), or (H, W) when ``grayscale``.

    Raises ValueError naming ``source`` when the bytes are not a decodable image, or when the
    header claims more than ``max_pixels`` pixels (default :func:`max_image_pixels`); the size
    is checked before anything is decoded or allocated.
    """
    check_image_size(data, source, max_pixels)
    buf = np.frombuffer(data, dtype=np.uint8)
    flag = cv2.IMREAD_GRAYSCALE if grayscale else _IMREAD_RGB or cv2.IMREAD_COLOR
    try:
        image = cv2.imdecode(buf, flag) if buf.size else None
    except cv2.error as err:
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else "OpenCV error"
        raise ValueError(f"{source}: not a decodable image ({len(data)} bytes): {detail}") from None
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
