"""InsightFace verification pair files (``lfw.bin``, ``cfp_fp.bin``, ``agedb_30.bin``, ...).

Such a file is a pickle of ``(bins, issame_list)``: ``bins`` holds 2·P encoded images (JPEG or
PNG bytes; pair ``p`` is ``bins[2p], bins[2p+1]``) and ``issame_list`` P booleans. Many were
written by Python 2, so strings are read back with ``encoding="bytes"``.

A pickle can run arbitrary code when loaded, so these files are read with a restricted
unpickler that accepts only the types such files contain (tuples, lists, bytes, bools, and the
numpy array/bool reconstructors); anything else (``os.system``, ``eval``, ...) is refused.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np

from partialfc.data.decode import decode_image

# (module, name) globals a verification .bin may reference; all are inert constructors.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes bytes into protocol-2 pickles
    ("__builtin__", "bytearray"),
    ("builtins", "bytearray"),
}


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle referenced a global outside the allow-list."""


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file, encoding="bytes")
        self.source = source

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self.source}: refused to load: the pickle references {module}.{name}, which a "
            "verification .bin never contains (only lists of image bytes and bools are allowed)"
        )


def _as_bytes(item, source: str, position: int) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, np.ndarray) and item.dtype == np.uint8:
        return item.tobytes()
    raise ValueError(f"{source}: image {position} is {type(item).__name__}, expected bytes")


def load_verification_bin(path: str | os.PathLike) -> tuple[list[bytes], np.ndarray]:
    """Read a verification ``.bin`` -> (2·P encoded images, bool array (P,) same identity).

    Raises UnsafePickleError for pickles that reference anything but the allowed types, and
    ValueError (naming the file) for a malformed structure.
    """
    path = Path(path)
    source = str(path)
    with open(path, "rb") as f:
        try:
            obj = _RestrictedUnpickler(f, source).load()
        except UnsafePickleError:
            raise
        except Exception as err:
            raise ValueError(f"{source}: not a readable verification pickle: {err}") from None
    if not isinstance(obj, (tuple, list)) or len(obj) != 2:
        raise ValueError(f"{source}: expected a pickled (images, issame) pair")
    bins, issame = obj
    bins = [_as_bytes(item, source, i) for i, item in enumerate(bins)]
    issame = np.asarray([bool(x) for x in issame], dtype=bool)
    if len(bins) != 2 * len(issame):
        raise ValueError(f"{source}: {len(bins)} images for {len(issame)} pairs (need 2 per pair)")
    return bins, issame


def write_verification_bin(
    path: str | os.PathLike, images: list[bytes], issame: np.ndarray | list[bool]
) -> None:
    """Write ``(images, issame)`` in the InsightFace layout (protocol 2, atomic replace)."""
    issame = [bool(x) for x in issame]
    if len(images) != 2 * len(issame):
        raise ValueError(f"{len(images)} images for {len(issame)} pairs (need 2 per pair)")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(([bytes(b) for b in images], issame), f, protocol=2)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def decode_images(images: list[bytes], source: str = "<bin>") -> np.ndarray:
    """Decode encoded images to one RGB uint8 array (N, H, W, 3); all must share a size."""
    decoded = [decode_image(b, f"{source}: image {i}") for i, b in enumerate(images)]
    shapes = {d.shape for d in decoded}
    if len(shapes) > 1:
        raise ValueError(f"{source}: images have different sizes {sorted(shapes)[:3]}")
    return np.stack(decoded) if decoded else np.zeros((0, 0, 0, 3), np.uint8)


def loads_restricted(data: bytes, source: str = "<bytes>"):
    """Restricted-unpickle ``data`` (same allow-list as :func:`load_verification_bin`)."""
    return _RestrictedUnpickler(io.BytesIO(data), source).load()
