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


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_real_shaped_files_load(tmp_path, protocol):
    """bytes + a list of bools, and bytes + a numpy bool array (as numpy-era files have)."""
    _, blobs = pngs(6)
    flags = [True, False, True]
    with open(tmp_path / "list.bin", "wb") as f:
        pickle.dump((blobs, flags), f, protocol=protocol)
    with open(tmp_path / "np.bin", "wb") as f:
        pickle.dump((blobs, np.array(flags)), f, protocol=protocol)
    with open(tmp_path / "scalars.bin", "wb") as f:
        pickle.dump((blobs, [np.bool_(x) for x in flags]), f, protocol=protocol)
    for name in ("list.bin", "np.bin", "scalars.bin"):
        bins, issame = load_verification_bin(tmp_path / name)
        assert bins == blobs and issame.dtype == bool and issame.tolist() == flags, name


def op_str(text: bytes) -> bytes:
    """Python 2 ``str`` as BINSTRING (read back as bytes)."""
    return b"T" + struct.pack("<I", len(text)) + text


def test_python2_numpy_bool_array(tmp_path):
    """A Python 2 numpy pickle: module numpy.core, every string a BINSTRING, ints for flags."""
    _, blobs = pngs(4)
    images = b"](" + b"".join(op_str(b) for b in blobs) + b"e"
    dtype = (
        b"cnumpy\ndtype\n" + op_str(b"b1") + b"K\x00K\x01\x87R"
        b"(K\x03" + op_str(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    )
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + op_str(b"b")
        + b"\x87R(K\x01K\x02\x85" + dtype + b"\x89" + op_str(b"\x01\x00") + b"tb"
    )  # fmt: skip
    (tmp_path / "py2np.bin").write_bytes(b"\x80\x02" + images + array + b"\x86.")
    bins, issame = load_verification_bin(tmp_path / "py2np.bin")
    assert bins == blobs and issame.tolist() == [True, False]


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


# ---------------------------------------------------------------- hostile files


class _Reduce:
    """Pickles as ``func(*args)`` (optionally followed by a BUILD of ``state``)."""

    def __init__(self, func, args, state=None):
        self.reduced = (func, args) if state is None else (func, args, state)

    def __reduce__(self):
        return self.reduced


def dump(tmp_path, name: str, obj, protocol: int = 2):
    with open(tmp_path / name, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return tmp_path / name


def _reconstruct():
    from numpy._core.multiarray import _reconstruct

    return _reconstruct


def test_negative_offset_ndarray_is_refused(tmp_path):
    """``numpy.ndarray(shape, dtype, buffer, offset)`` would read memory outside the buffer."""
    evil = _Reduce(np.ndarray, ((4096,), np.dtype(bool), b"\x01" * 8, -4096))
    path = dump(tmp_path, "negoff.bin", ([b"a", b"b"], evil))
    with pytest.raises(UnsafePickleError, match=r"negoff.bin: refused.*numpy.ndarray construction"):
        load_verification_bin(path)


def test_uint8_array_images_are_refused(tmp_path):
    path = dump(tmp_path, "u8.bin", ([np.zeros(4, np.uint8), b"b"], [True]))
    with pytest.raises(UnsafePickleError, match=r"u8.bin: refused.*dtype 'u1'.*only bool"):
        load_verification_bin(path)


@pytest.mark.parametrize("protocol", [2, 4])
def test_huge_shape_ndarray_is_refused_without_allocating(tmp_path, protocol):
    import tracemalloc

    huge = _Reduce(_reconstruct(), (np.ndarray, (2_300_000_000,), b"b"))
    claims = _Reduce(  # a real-looking array whose state claims 2.3 G elements for 2 bytes
        _reconstruct(),
        (np.ndarray, (0,), b"b"),
        (1, (2_300_000_000,), np.dtype(bool), False, b"\x01\x00"),
    )
    cases = [
        (huge, r"_reconstruct is only accepted as \(ndarray, \(0,\), 'b'\)"),
        (claims, r"shape \(2300000000,\) does not match 2 data bytes"),
    ]
    for i, (flags, message) in enumerate(cases):
        path = dump(tmp_path, f"huge{i}.bin", ([b"a", b"b"], flags), protocol)
        tracemalloc.start()
        try:
            with pytest.raises(UnsafePickleError, match=rf"huge{i}.bin: refused.*{message}"):
                load_verification_bin(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, f"case {i}: {peak} bytes allocated"


def test_small_files_claiming_gigabytes_allocate_nothing_large(tmp_path):
    """A 77-byte file whose BINBYTES8 claims 2.3 GB, and a 9-byte pickle whose LONG_BINPUT
    index makes the standard unpickler size its memo table at 16 GB."""
    import tracemalloc

    claim = b"\x80\x04\x8e" + struct.pack("<Q", 2_300_000_000)
    claim += b"x" * (77 - len(claim))
    (tmp_path / "claim.bin").write_bytes(claim)
    (tmp_path / "memo.bin").write_bytes(b"\x80\x02Nr\xff\xff\xff\x7f.")
    assert (tmp_path / "claim.bin").stat().st_size == 77
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"claim.bin: not a readable.*claims 2300000000 bytes"):
            load_verification_bin(tmp_path / "claim.bin")
        with pytest.raises(ValueError, match=r"memo.bin: expected a pickled \(images, issame\)"):
            load_verification_bin(tmp_path / "memo.bin")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"


def test_memo_reuse_cannot_multiply_data(tmp_path):
    """One stored string handed to ``_codecs.encode`` many times through the memo."""
    body = b"\x80\x02](c_codecs\nencode\nq\x00X" + struct.pack("<I", 1000) + b"a" * 1000
    body += b"q\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03R"
    body += b"h\x00h\x03R" * 50 + b"e]\x86."
    (tmp_path / "amplify.bin").write_bytes(body)
    with pytest.raises(UnsafePickleError, match=r"amplify.bin: refused.*more data than the file"):
        load_verification_bin(tmp_path / "amplify.bin")


@pytest.mark.parametrize("protocol", [2, 4])
def test_code_references_are_refused_in_every_protocol(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = dump(tmp_path, "evil.bin", ([_Exploit(marker), b"x"], [True]), protocol)
    with pytest.raises(UnsafePickleError, match=r"evil.bin: refused to load.*(posix|os)\.system"):
        load_verification_bin(path)
    assert not marker.exists()


def test_object_building_opcodes_are_refused(tmp_path):
    """NEWOBJ / INST / dicts never occur in a verification file."""
    path = dump(tmp_path, "obj.bin", ([b"a", b"b"], {"flags": [True]}))
    with pytest.raises(UnsafePickleError, match=r"obj.bin: refused.*opcode EMPTY_DICT at byte"):
        load_verification_bin(path)


def test_deeply_nested_lists_are_refused(tmp_path):
    depth = 200_000
    nested = b"]" * depth + b"a" * (depth - 1)
    (tmp_path / "deep.bin").write_bytes(b"\x80\x02" + nested + b"]\x88a\x86.")
    with pytest.raises(ValueError, match=r"deep.bin: image 0 is list, expected bytes"):
        load_verification_bin(tmp_path / "deep.bin")
    (tmp_path / "deep2.bin").write_bytes(b"\x80\x02" + nested + b".")
    with pytest.raises(ValueError, match=r"deep2.bin: expected a pickled \(images, issame\)"):
        load_verification_bin(tmp_path / "deep2.bin")


def test_truncated_and_empty_files_name_the_file(tmp_path):
    _, blobs = pngs(2)
    whole = pickle.dumps((blobs, [True]), protocol=4)
    (tmp_path / "cut.bin").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut.bin: not a readable verification pickle"):
        load_verification_bin(tmp_path / "cut.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.bin: not a readable.*empty"):
        load_verification_bin(tmp_path / "empty.bin")
