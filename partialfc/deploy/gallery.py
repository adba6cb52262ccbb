"""A persistent 1:N gallery of identity templates, searched exactly with faiss.

A template is the mean of an identity's *unnormalised* embeddings, then L2-normalised: the norm
grows with image quality (Ranjan et al., arXiv 1703.09507; MagFace, Meng et al., CVPR 2021), so
the sum is a quality-weighted average. The gallery keeps each identity's running sum and count,
so enrolling more images later gives the same template as enrolling them all at once. Search is
exact inner product on the normalised templates (``faiss.IndexIDMap(IndexFlatIP)``), i.e. cosine
similarity.

File format (one ``.npz``, written atomically, read with ``allow_pickle=False``)::

    meta    uint8 bytes of JSON: {"format": "partialfc.gallery", "version": 2, "dim": d,
            "model": str | null, "names": [...], "next_id": int, "sha256": hex}
    ids     int64 (n,)      stable faiss ids, one per identity, in the order of "names"
    sums    float64 (n, d)  sum of the identity's raw embeddings
    counts  int64 (n,)      number of embeddings summed

``sha256`` covers every other field of ``meta`` and the three arrays. A file that fails to
parse, whose digest differs, or whose contents are inconsistent (duplicate names or ids, a
``next_id`` that would hand out an id already in use, counts below 1, non-finite sums) is
refused with :class:`GalleryFileError` naming the file. Version 1 files, whose digest covered
only the arrays, are still read (with the same consistency checks) and are written back as
version 2.

Updating a file in place (open, enroll or remove, save) goes through :meth:`Gallery.updating`,
which holds the file's advisory lock (:func:`partialfc.locking.file_lock`) from before the
read until after the atomic rename, so concurrent updaters never lose each other's changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from partialfc.atomic import atomic_write_bytes
from partialfc.backbone.embedding import l2_normalize
from partialfc.locking import file_lock

GALLERY_FORMAT = "partialfc.gallery"
GALLERY_VERSION = 2
_READABLE_VERSIONS = (1, 2)


class GalleryFileError(ValueError):
    """A gallery file is missing, truncated, corrupted or of another format."""


@dataclass(frozen=True)
class SearchResult:
    """Top-k matches per query (k clamped to the gallery size), best first."""

    identities: list[list[str | None]]
    scores: np.ndarray  # (m, k) float32 cosine, -inf where no match


def _digest(ids: np.ndarray, sums: np.ndarray, counts: np.ndarray, meta: dict | None) -> str:
    """sha256 of the arrays and (version 2) every ``meta`` field but the digest itself."""
    h = hashlib.sha256()
    if meta is not None:
        fields = {k: v for k, v in meta.items() if k != "sha256"}
        h.update(json.dumps(fields, sort_keys=True, ensure_ascii=True).encode())
    for a in (ids, sums, counts):
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Gallery:
    """Identity templates keyed by name, searchable by cosine similarity.

    Args:
        dim: embedding dimension.
        model: optional model identifier recorded in the file (e.g. the export directory), so
            that queries from another model can be noticed by the caller.
    """

    def __init__(self, dim: int, model: str | None = None):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = int(dim)
        self.model = model
        self._names: dict[str, int] = {}  # name -> faiss id
        self._sums: dict[str, np.ndarray] = {}  # name -> float64 (d,) running sum
        self._counts: dict[str, int] = {}
        self._next_id = 0
        self._index = faiss.IndexIDMap(faiss.IndexFlatIP(self.dim))

    # ------------------------------------------------------------------ contents
    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, identity: str) -> bool:
        return identity in self._names

    @property
    def identities(self) -> list[str]:
        return list(self._names)

    def count(self, identity: str) -> int:
        """Number of embeddings enrolled for ``identity``."""
        return self._counts[self._require(identity)]

    def template(self, identity: str) -> np.ndarray:
        """The normalised template ``(d,)`` of ``identity``."""
        return l2_normalize(self._sums[self._require(identity)])

    def _require(self, identity: str) -> str:
        if identity not in self._names:
            raise KeyError(f"identity {identity!r} is not enrolled")
        return identity

    # ------------------------------------------------------------------ updates
    def enroll(self, identity: str, raw_embeddings: np.ndarray) -> None:
        """Add ``(n, d)`` unnormalised embeddings of ``identity`` (new or existing)."""
        if not isinstance(identity, str) or not identity:
            raise ValueError(f"identity must be a non-empty string, got {identity!r}")
        e = np.asarray(raw_embeddings, dtype=np.float64)
        if e.ndim == 1:
            e = e[None]
        if e.ndim != 2 or e.shape[1] != self.dim or e.shape[0] == 0:
            raise ValueError(
                f"embeddings for {identity!r} must be (n >= 1, {self.dim}), got {e.shape}"
            )
        if not np.isfinite(e).all():
            raise ValueError(f"embeddings for {identity!r} contain NaN or inf")
        if identity in self._names:
            self._index.remove_ids(np.array([self._names[identity]], dtype=np.int64))
            self._sums[identity] = self._sums[identity] + e.sum(0)
            self._counts[identity] += e.shape[0]
        else:
            self._names[identity] = self._next_id
            self._next_id += 1
            self._sums[identity] = e.sum(0)
            self._counts[identity] = e.shape[0]
        self._add_to_index(identity)

    def _add_to_index(self, identity: str) -> None:
        vec = l2_normalize(self._sums[identity])[None]
        self._index.add_with_ids(vec, np.array([self._names[identity]], dtype=np.int64))

    def remove(self, identity: str) -> None:
        faiss_id = self._names.pop(self._require(identity))
        del self._sums[identity], self._counts[identity]
        removed = self._index.remove_ids(np.array([faiss_id], dtype=np.int64))
        assert removed == 1, f"index out of sync for {identity!r}"

    # ------------------------------------------------------------------ search
    def search(self, queries: np.ndarray, k: int = 5) -> SearchResult:
        """Top-``k`` identities by cosine for each row of ``queries`` ``(m, d)``; at most
        ``len(self)`` per query (``k`` is clamped to the gallery size)."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be (m, {self.dim}), got {q.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        bad = np.flatnonzero(~np.isfinite(q).all(axis=1))
        if bad.size:
            raise ValueError(f"query rows {bad[:10].tolist()} contain NaN or inf")
        k = min(int(k), len(self))
        if k == 0:
            return SearchResult([[] for _ in range(len(q))], np.zeros((len(q), 0), np.float32))
        scores, ids = self._index.search(np.ascontiguousarray(l2_normalize(q)), k)
        by_id = {v: n for n, v in self._names.items()}
        names = [[by_id.get(int(i)) if i >= 0 else None for i in row] for row in ids]
        scores = np.where(ids >= 0, scores, -np.inf).astype(np.float32)
        return SearchResult(names, scores)

    # ------------------------------------------------------------------ persistence
    def _arrays(self):
        names = list(self._names)
        ids = np.array([self._names[n] for n in names], dtype=np.int64)
        sums = np.zeros((len(names), self.dim), dtype=np.float64)
        for row, n in enumerate(names):
            sums[row] = self._sums[n]
        counts = np.array([self._counts[n] for n in names], dtype=np.int64)
        return names, ids, sums, counts

    def save(self, path: str | os.PathLike) -> None:
        """Write the gallery to ``path`` atomically (temp file + ``os.replace``)."""
        names, ids, sums, counts = self._arrays()
        meta = {
            "format": GALLERY_FORMAT,
            "version": GALLERY_VERSION,
            "dim": self.dim,
            "model": self.model,
            "names": names,
            "next_id": self._next_id,
        }
        meta["sha256"] = _digest(ids, sums, counts, meta)
        buffer = io.BytesIO()
        meta_bytes = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(buffer, meta=meta_bytes, ids=ids, sums=sums, counts=counts)
        atomic_write_bytes(Path(path), buffer.getvalue())

    @classmethod
    def open(cls, path: str | os.PathLike) -> Gallery:
        """Read a gallery written by :meth:`save`; refuses damaged or foreign files."""
        path = Path(path)
        if not path.is_file():
            raise GalleryFileError(f"{path}: gallery file not found")
        _check_array_sizes(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in ("meta", "ids", "sums", "counts")}
            meta = json.loads(arrays["meta"].tobytes().decode())
        except Exception as err:  # noqa: BLE001 - zip, zlib, JSON and key errors alike
            raise GalleryFileError(f"{path}: not a readable gallery file ({err})") from None
        if not isinstance(meta, dict) or meta.get("format") != GALLERY_FORMAT:
            raise GalleryFileError(f"{path}: not a {GALLERY_FORMAT} file")
        version = meta.get("version")
        if version not in _READABLE_VERSIONS:
            raise GalleryFileError(
                f"{path}: {GALLERY_FORMAT} version {version!r}; this partialfc reads versions "
                f"{', '.join(map(str, _READABLE_VERSIONS))}"
            )
        ids, sums, counts = arrays["ids"], arrays["sums"], arrays["counts"]
        if _digest(ids, sums, counts, meta if version >= 2 else None) != meta.get("sha256"):
            raise GalleryFileError(f"{path}: checksum mismatch: the file is corrupted")
        _check_contents(path, meta, ids, sums, counts)
        names, dim = meta["names"], meta["dim"]
        gallery = cls(dim, meta.get("model"))
        gallery._next_id = meta["next_id"]
        for name, faiss_id, total, c in zip(names, ids, sums, counts, strict=True):
            gallery._names[name] = int(faiss_id)
            gallery._sums[name] = total.copy()
            gallery._counts[name] = int(c)
        if names:
            gallery._index.add_with_ids(l2_normalize(sums), ids)
        return gallery

    @classmethod
    @contextmanager
    def updating(
        cls,
        path: str | os.PathLike,
        dim: int,
        model: str | None = None,
        lock_timeout: float | None = None,
    ) -> Iterator[Gallery]:
        """Lock ``path``, open it (or start an empty gallery of ``dim`` when it does not exist),
        yield it for changes, save it and release the lock. An exception inside the block
        leaves the file as it was. Another process updating the same file waits (a line on
        standard error says so) up to ``lock_timeout`` seconds (None: as long as it takes)."""
        path = Path(path)
        with file_lock(path, timeout=lock_timeout):
            gallery = cls.open(path) if path.exists() else cls(dim, model)
            if gallery.dim != dim:
                raise GalleryFileError(f"{path}: gallery dim {gallery.dim} != model's {dim}")
            yield gallery
            gallery.save(path)


_NPY_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _check_array_sizes(path: Path) -> None:
    """Refuse a gallery whose array headers claim more bytes than the file holds.

    ``numpy.load`` reserves the size an ``.npy`` header claims before it reads the data, so a
    few edited header bytes would make it allocate gigabytes. :meth:`Gallery.save` writes
    uncompressed (stored) members; each must lie inside the file, and its header's
    ``shape × itemsize`` must be exactly the bytes that follow the header.
    """
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                    raise GalleryFileError(
                        f"{path}: member {info.filename!r} is compressed; galleries are stored "
                        "uncompressed"
                    )
                if info.header_offset + info.compress_size > size:
                    raise GalleryFileError(
                        f"{path}: member {info.filename!r} claims {info.compress_size} bytes "
                        f"beyond the end of the {size}-byte file"
                    )
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = _NPY_HEADER_READERS.get(version)
                    if read_header is None:
                        raise GalleryFileError(
                            f"{path}: array {info.filename!r} has .npy version {version}"
                        )
                    shape, _, dtype = read_header(member)
                    header = member.tell()
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if header + claimed != info.file_size:
                    raise GalleryFileError(
                        f"{path}: array {info.filename!r} claims shape {tuple(shape)} of "
                        f"{dtype} ({claimed} bytes), but the member holds "
                        f"{info.file_size - header} bytes after its header"
                    )
    except GalleryFileError:
        raise
    except Exception as err:  # noqa: BLE001 - zip and .npy header errors alike
        raise GalleryFileError(f"{path}: not a readable gallery file ({err})") from None


def _check_contents(path: Path, meta: dict, ids, sums, counts) -> None:
    """Consistency of a gallery file's fields (GalleryFileError naming the file and field)."""

    def fail(message: str):
        raise GalleryFileError(f"{path}: {message}")

    dim, names, next_id, model = (meta.get(k) for k in ("dim", "names", "next_id", "model"))
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        fail(f"dim {dim!r} is not a positive integer")
    if model is not None and not isinstance(model, str):
        fail(f"model {model!r} is not a string")
    if not isinstance(names, list) or not all(isinstance(x, str) and x for x in names):
        fail("names is not a list of non-empty strings")
    n = len(names)
    if len(set(names)) != n:
        fail("names contains duplicates")
    if ids.dtype != np.int64 or counts.dtype != np.int64 or sums.dtype != np.float64:
        fail(f"array types {ids.dtype}/{sums.dtype}/{counts.dtype}, expected int64/float64/int64")
    if ids.shape != (n,) or sums.shape != (n, dim) or counts.shape != (n,):
        fail(f"array shapes disagree with {n} identities of dim {dim}")
    if (ids < 0).any() or len(np.unique(ids)) != n:
        fail("ids are not distinct non-negative integers")
    largest = int(ids.max()) if n else -1
    if not isinstance(next_id, int) or isinstance(next_id, bool) or next_id <= largest:
        fail(f"next_id {next_id!r} is not above every id in use (largest {largest})")
    if (counts < 1).any():
        fail(f"identity {names[int(np.argmin(counts))]!r} has count < 1")
    finite = np.isfinite(sums).all(axis=1)
    if not finite.all():
        fail(f"identity {names[int(np.argmin(finite))]!r} has NaN or inf in its sum")
