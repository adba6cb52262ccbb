"""Image headers: sizes read without decoding, and the pixel limit checked before decoding."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from partialfc.data import decode
from partialfc.data.decode import (
    MAX_IMAGE_PIXELS,
    check_image_size,
    decode_image,
    encode_image,
    image_size,
)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG (valid CRCs) whose IHDR claims ``width x height`` RGB pixels, with a
    few bytes of image data: under 100 bytes on disk."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + (png_chunk(b"IEND", b""))
    )


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real JPEG whose start-of-frame header is rewritten to claim ``width x height``."""
    data = bytearray(encode_image(np.zeros((8, 8, 3), np.uint8), ".jpg"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def test_default_limit_is_8192_squared():
    assert MAX_IMAGE_PIXELS == 8192 * 8192 == 67_108_864


@pytest.mark.parametrize("side", [60000, 30000, 8193])
@pytest.mark.parametrize("make", [png_claiming, jpeg_claiming])
def test_huge_header_is_refused_before_decoding(monkeypatch, side, make):
    data = make(side, side)
    assert len(data) < 1000 and image_size(data) == (side, side)

    def must_not_decode(*args):
        raise AssertionError("the decoder ran on an image above the limit")

    monkeypatch.setattr(decode.cv2, "imdecode", must_not_decode)
    with pytest.raises(
        ValueError,
        match=rf"^huge.img: image header claims {side} x {side} = {side * side} pixels, above "
        rf"the limit of 67108864 \(set the environment variable PARTIALFC_MAX_IMAGE_PIXELS",
    ):
        decode_image(data, "huge.img")


def test_limit_is_configurable_per_call_and_by_environment(monkeypatch):
    image = np.random.default_rng(0).integers(0, 256, (50, 100, 3), dtype=np.uint8)
    data = encode_image(image, ".png")
    np.testing.assert_array_equal(decode_image(data, "ok.png", max_pixels=5000), image)
    with pytest.raises(ValueError, match=r"ok.png: .* 100 x 50 = 5000 pixels, above .* 4999"):
        decode_image(data, "ok.png", max_pixels=4999)
    monkeypatch.setenv("PARTIALFC_MAX_IMAGE_PIXELS", "4999")
    with pytest.raises(ValueError, match=r"ok.png: .*above the limit of 4999"):
        decode_image(data, "ok.png")
    assert decode_image(data, "ok.png", max_pixels=10**9).shape == (50, 100, 3)  # per call wins
    monkeypatch.setenv("PARTIALFC_MAX_IMAGE_PIXELS", "lots")
    with pytest.raises(ValueError, match=r"PARTIALFC_MAX_IMAGE_PIXELS='lots': expected a whole"):
        decode_image(data, "ok.png")


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".webp", ".tiff"])
def test_image_size_reads_headers(ext):
    data = encode_image(np.zeros((21, 34, 3), np.uint8), ext)
    assert image_size(data) == (34, 21)
    check_image_size(data, "x", max_pixels=34 * 21)
    with pytest.raises(ValueError, match=r"x: image header claims 34 x 21 = 714 pixels"):
        check_image_size(data, "x", max_pixels=34 * 21 - 1)


def test_opencv_errors_name_the_source():
    """With the limit raised past OpenCV's own (2**30 pixels), OpenCV raises cv2.error: it
    must come out as a ValueError naming the image, like any undecodable bytes."""
    with pytest.raises(ValueError, match=r"^big.png: not a decodable image \(\d+ bytes\)"):
        decode_image(png_claiming(60000, 60000), "big.png", max_pixels=10**10)
    assert image_size(b"not an image") is None
