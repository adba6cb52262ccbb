"""Verification .bin files: round trip, Python-2 style pickles, and refusal of code."""

from __future__ import annotations

import os
import pickle
import struct

import numpy as np
import pytest

from partialfc.data.decode import encode_image
from partialfc.data.verification_bin import (
    UnsafePickleError,
    decode_images,
    load_verification_bin,
    write_verification_bin,
)


def pngs(n: int) -> tuple[list[np.ndarray], list[bytes]]:
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(n)]
    return arrays, [encode_image(a, ".png") for a in arrays]


def test_roundtrip(tmp_path):
    arrays, blobs = pngs(4)
    write_verification_bin(tmp_path / "v.bin", blobs, [True, False])
    bins, issame = load_verification_bin(tmp_path / "v.bin")
    assert bins == blobs and issame.tolist() == [True, False]
    np.testing.assert_array_equal(decode_images(bins), np.stack(arrays))


def test_python2_style_pickle(tmp_path):
    """Protocol 2 with BINSTRING opcodes (how Python 2 pickled str), loaded with bytes."""
    _, blobs = pngs(2)
    body = b"".join(b"T" + struct.pack("<I", len(b)) + b for b in blobs)
    data = b"\x80\x02]q\x00(" + body + b"e]q\x01(\x88e\x86q\x02."
    (tmp_path / "py2.bin").write_bytes(data)
    bins, issame = load_verification_bin(tmp_path / "py2.bin")
    assert bins == blobs and issame.tolist() == [True]


def test_numpy_bool_flags_are_accepted(tmp_path):
    _, blobs = pngs(2)
    with open(tmp_path / "np.bin", "wb") as f:
        pickle.dump((blobs, np.array([False])), f, protocol=2)
    assert load_verification_bin(tmp_path / "np.bin")[1].tolist() == [False]


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.bin", "wb") as f:
        pickle.dump(([_Exploit(marker), b"x"], [True]), f, protocol=2)
    with pytest.raises(UnsafePickleError, match=r"evil.bin: refused to load.*(posix|os)\.system"):
        load_verification_bin(tmp_path / "evil.bin")
    assert not marker.exists()


def test_malformed_structure_names_the_file(tmp_path):
    with open(tmp_path / "odd.bin", "wb") as f:
        pickle.dump(([b"a", b"b", b"c"], [True]), f, protocol=2)
    with pytest.raises(ValueError, match=r"odd.bin: 3 images for 1 pairs"):
        load_verification_bin(tmp_path / "odd.bin")
    (tmp_path / "junk.bin").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match=r"junk.bin: not a readable verification pickle"):
        load_verification_bin(tmp_path / "junk.bin")
