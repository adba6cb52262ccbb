"""MXNet RecordIO (``.rec`` + ``.idx``), read and written without mxnet.

Framing (dmlc-core): each record starts with the magic ``0xced7230a`` (little-endian uint32)
and a word ``lrec``: upper 3 bits ``cflag``, lower 29 bits payload length. The payload is
zero-padded to a multiple of 4 bytes. ``cflag`` 0 is a whole record; a payload that contains
the magic at a 4-aligned position is split there into parts with cflag 1 (first), 2 (middle),
3 (last), the magic itself being dropped and re-inserted between parts on reading.

``.idx``: text lines ``key\\toffset`` giving the byte offset of each record.

Payload = IRHeader ``<IfQQ`` (flag uint32, label float32, id uint64, id2 uint64) + data; when
``flag > 0`` a vector of ``flag`` float32 labels follows the header (the scalar label is 0).

InsightFace training sets (MS1MV2/3, Glint360K, WebFace) add a header record, key 0, with
``flag = 2`` and ``label = (first_identity_key, end_key)``: images are keys
``1 .. first_identity_key-1`` (label = class id, as float), and keys ``first_identity_key ..
end_key-1`` are one record per identity whose label is the image key range ``(start, end)``.
Sets without that header record (plain im2rec output) use every key in the ``.idx`` as an image.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from partialfc.atomic import AtomicFile, atomic_write_bytes
from partialfc.data.datasets import LabelledDataset, Transform
from partialfc.data.decode import decode_image, to_chw_tensor

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_LREC = struct.Struct("<II")
_IRHEADER = struct.Struct("<IfQQ")
_FLAG_LABEL = struct.Struct("<If")
_LENGTH_MASK = (1 << 29) - 1


class RecordIOError(ValueError):
    """A malformed ``.rec``/``.idx``; the message names the file, byte offset and record id."""


@dataclass
class IRHeader:
    """Image record header. ``label`` is a float, or a float32 vector when ``flag > 0``."""

    flag: int
    label: float | np.ndarray
    id: int
    id2: int = 0


def pack_record(header: IRHeader, data: bytes = b"") -> bytes:
    """IRHeader (+ label vector) + data -> record payload (``mx.recordio.pack`` layout)."""
    label = header.label
    if np.ndim(label) == 0:
        head = _IRHEADER.pack(int(header.flag), float(label), int(header.id), int(header.id2))
        return head + data
    vector = np.asarray(label, dtype="<f4").ravel()
    head = _IRHEADER.pack(vector.size, 0.0, int(header.id), int(header.id2))
    return head + vector.tobytes() + data


def unpack_record(payload: bytes, source: str = "") -> tuple[IRHeader, bytes]:
    """Record payload -> (IRHeader, data); inverse of :func:`pack_record`. ``source`` prefixes
    error messages."""
    prefix = f"{source}: " if source else ""
    if len(payload) < _IRHEADER.size:
        raise RecordIOError(f"{prefix}payload of {len(payload)} bytes is shorter than IRHeader")
    flag, label, id_, id2 = _IRHEADER.unpack_from(payload)
    start = _IRHEADER.size
    if flag > 0:
        end = start + 4 * flag
        if end > len(payload):
            raise RecordIOError(f"{prefix}label vector of {flag} floats exceeds the payload")
        label = np.frombuffer(payload, dtype="<f4", count=flag, offset=start).copy()
        start = end
    return IRHeader(flag, label, id_, id2), payload[start:]


def frame_record(payload: bytes) -> bytes:
    """Payload -> framed bytes (magic, lrec, data, padding), splitting at embedded magics."""
    if len(payload) >= 1 << 29:
        raise ValueError(f"record of {len(payload)} bytes exceeds the 2^29-byte RecordIO limit")
    parts = []
    start = 0
    aligned_end = len(payload) & ~3  # dmlc checks only whole aligned words
    pos = payload.find(_MAGIC_BYTES)
    while pos != -1 and pos + 4 <= aligned_end:
        if pos % 4 == 0:
            cflag = 1 if start == 0 else 2
            parts.append(_LREC.pack(MAGIC, (cflag << 29) | (pos - start)) + payload[start:pos])
            start = pos + 4
            pos = payload.find(_MAGIC_BYTES, start)
        else:
            pos = payload.find(_MAGIC_BYTES, pos + 1)
    cflag = 0 if start == 0 else 3
    parts.append(_LREC.pack(MAGIC, (cflag << 29) | (len(payload) - start)) + payload[start:])
    parts.append(b"\0" * (-len(payload) % 4))
    return b"".join(parts)


def read_index(idx_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``.idx`` file -> (keys, offsets), int64 arrays in file order.

    Parsed in bulk (millions of lines per second); a malformed line is reported by number.
    """
    idx_path = Path(idx_path)
    text = idx_path.read_text()
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        table = np.fromstring(text, dtype=np.int64, sep=" ").reshape(-1, 2)
    except ValueError:
        table = None
    if table is None or len(table) != lines:  # malformed or blank lines: parse line by line
        rows = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not all(f.lstrip("-").isdigit() for f in fields):
                message = f"{idx_path}: line {lineno}: expected 'key<TAB>offset'"
                raise RecordIOError(message)
            rows.append((int(fields[0]), int(fields[1])))
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    return table[:, 0].copy(), table[:, 1].copy()


class RecordIndex:
    """Key -> (offset, span) lookup held in numpy arrays (24 bytes per record, shared
    copy-on-write by forked DataLoader workers, unlike a dict of Python ints).

    ``span`` = bytes from the record's offset to the next record in the file (or its end).
    Keys that form a contiguous range (the usual case) are looked up by subtraction.
    """

    def __init__(self, keys: np.ndarray, offsets: np.ndarray, file_size: int):
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.offsets = offsets[order]
        if len(self.keys) and (np.diff(self.keys) == 0).any():
            dup = int(self.keys[np.flatnonzero(np.diff(self.keys) == 0)[0]])
            raise RecordIOError(f"record id {dup} appears twice in the index")
        by_offset = np.sort(offsets)
        following = np.append(by_offset[1:], file_size)
        ends = following[np.searchsorted(by_offset, self.offsets)]
        self.spans = (ends - self.offsets).astype(np.int64)
        n = len(self.keys)
        contiguous = n > 0 and int(self.keys[-1]) - int(self.keys[0]) == n - 1
        self.base = int(self.keys[0]) if contiguous else None

    def __len__(self) -> int:
        return len(self.keys)

    def position(self, key: int) -> int:
        """Row of ``key`` in the arrays, or -1."""
        if self.base is not None:
            i = key - self.base
            return i if 0 <= i < len(self.keys) else -1
        i = int(np.searchsorted(self.keys, key))
        return i if i < len(self.keys) and int(self.keys[i]) == key else -1

    def __contains__(self, key: int) -> bool:
        return self.position(key) >= 0

    def offset(self, key: int) -> int:
        """Byte offset of ``key``, or -1 when absent."""
        i = self.position(key)
        return int(self.offsets[i]) if i >= 0 else -1


class RecordIOReader:
    """Random access (``read(key)``) and sequential scans (``scan()``) of a ``.rec`` file.

    The file is memory-mapped read-only, lazily once per process, so one reader can be shared
    by DataLoader workers (each maps the file itself after fork/spawn) and payloads reach the
    decoder without a copy (``payload(key)`` returns a memoryview).
    """

    def __init__(
        self,
        rec_path: str | os.PathLike,
        idx_path: str | os.PathLike | None = None,
        require_index: bool = True,
    ):
        self.rec_path = Path(rec_path)
        if not self.rec_path.is_file():
            raise FileNotFoundError(f"{self.rec_path}: RecordIO file not found")
        self.size = self.rec_path.stat().st_size
        self.idx_path = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._pid = -1
        self.index = RecordIndex(np.zeros(0, np.int64), np.zeros(0, np.int64), self.size)
        if self.idx_path.is_file():
            keys, offsets = read_index(self.idx_path)
            try:
                self.index = RecordIndex(keys, offsets, self.size)
            except RecordIOError as err:
                raise RecordIOError(f"{self.idx_path}: {err}") from None
            self._check_index()
        elif require_index:
            raise FileNotFoundError(
                f"{self.idx_path}: index file not found for {self.rec_path}; pass idx_path=, or "
                "rebuild it with partialfc.data.recordio.build_index(rec_path)"
            )

    def _check_index(self) -> None:
        index = self.index
        if not len(index):
            return
        bad = np.flatnonzero((index.offsets < 0) | (index.offsets > self.size - _LREC.size))
        if bad.size:
            key, offset = int(index.keys[bad[0]]), int(index.offsets[bad[0]])
            raise RecordIOError(
                f"{self.idx_path}: record id {key} points to offset {offset}, beyond the end "
                f"of {self.rec_path} ({self.size} bytes): .idx and .rec do not match"
            )
        # a cheap consistency probe: the first and last indexed records must start with a magic
        for i in (int(np.argmin(index.offsets)), int(np.argmax(index.offsets))):
            key, offset = int(index.keys[i]), int(index.offsets[i])
            if bytes(self._slice(4, offset)) != _MAGIC_BYTES:
                raise RecordIOError(
                    f"{self.rec_path}: offset {offset} (record id {key} in {self.idx_path}) does "
                    "not start a record: .idx and .rec do not match"
                )
        # the last indexed record must end where the file ends: a truncated .idx would
        # otherwise silently yield a smaller data set (a damaged last record is reported, or
        # skipped, when it is read)
        last = int(np.argmax(index.offsets))
        key, offset = int(index.keys[last]), int(index.offsets[last])
        try:
            end = self.read_at(offset, key, int(index.spans[last]))[1]
        except RecordIOError:
            return
        if end != self.size:
            raise RecordIOError(
                f"{self.idx_path}: the last indexed record (id {key} at offset {offset}) ends at "
                f"byte {end}, but {self.rec_path} has {self.size} bytes: the index is truncated "
                "or belongs to another file (rebuild it with "
                "partialfc.data.recordio.build_index(rec_path))"
            )

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_map"], state["_view"], state["_pid"] = None, None, -1
        return state

    def _buffer(self) -> memoryview:
        """The whole file, memory-mapped read-only (mapped lazily once per process)."""
        if self._pid != os.getpid():
            if self.size:
                with open(self.rec_path, "rb") as f:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self._view = memoryview(self._map)
            else:
                self._map, self._view = None, memoryview(b"")
            self._pid = os.getpid()
        return self._view

    def _slice(self, n: int, offset: int) -> memoryview:
        """Up to ``n`` bytes at ``offset`` (fewer at the end of the file), without copying."""
        return self._buffer()[offset : offset + n]

    def close(self) -> None:
        if self._map is not None and self._pid == os.getpid():
            try:
                self._view.release()
                self._map.close()
            except BufferError:  # views still alive elsewhere: the GC unmaps later
                pass
        self._map, self._view, self._pid = None, None, -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def keys(self) -> np.ndarray:
        """Indexed record ids, sorted (int64)."""
        return self.index.keys

    def coverage_gaps(self) -> list[tuple[int, str]]:
        """Bytes of the ``.rec`` that no indexed record covers: ``[(record id, message)]``.

        Every indexed record must end where the next one (by offset) starts, and the last at
        the end of the file; a ``.idx`` that misses records in the middle leaves a gap after
        the record before them. Reads the header of every indexed record (one page per
        record), so it runs in :meth:`RecordIODataset.verify`, not when a file is opened,
        which probes only the first and the last record.
        """
        index = self.index
        if not len(index):
            return []
        order = np.argsort(index.offsets, kind="stable")
        keys, offsets = index.keys[order], index.offsets[order]
        ends = np.empty_like(offsets)
        for i, (key, offset) in enumerate(zip(keys.tolist(), offsets.tolist(), strict=True)):
            head = self._slice(_LREC.size, offset)
            magic, lrec = _LREC.unpack(head) if len(head) == _LREC.size else (None, 0)
            length = lrec & _LENGTH_MASK
            if magic == MAGIC and lrec >> 29 == 0:  # a whole record: its header gives the end
                ends[i] = offset + _LREC.size + length + (-length % 4)
                continue
            try:  # split records, or damage that reading the record reports
                ends[i] = self.read_at(offset, key)[1]
            except RecordIOError:
                ends[i] = -1  # damaged: reported by reading it, not as a gap
        following = np.append(offsets[1:], self.size)
        gaps = []
        for i in np.flatnonzero((ends >= 0) & (ends != following)).tolist():
            key, offset, end, nxt = int(keys[i]), int(offsets[i]), int(ends[i]), int(following[i])
            where = f"{self.rec_path}: record id {key} at offset {offset} ends at byte {end}"
            if end < nxt:
                after = (
                    f"the next indexed record starts at {nxt}"
                    if i + 1 < len(keys)
                    else (f"the file ends at {nxt}")
                )
                gaps.append((key, f"{where}, but {after}: {nxt - end} bytes are in no index "
                                  f"entry ({self.idx_path} misses records; rebuild it with "
                                  "partialfc.data.recordio.build_index(rec_path))"))  # fmt: skip
            else:
                gaps.append((key, f"{where}, past the start of the next indexed record at {nxt}: "
                                  f".idx and .rec do not match"))  # fmt: skip
        return gaps

    def read_at(self, offset: int, key: int | str = "?", span: int = 0) -> tuple[bytes, int]:
        """Read the record starting at ``offset`` -> (payload, offset of the next record).

        ``span``: bytes known to belong to the record (from the ``.idx``); read in one call.
        """
        parts = []
        pos = offset
        buffer = self._slice(span, offset) if span > _LREC.size else memoryview(b"")
        while True:
            local = pos - offset
            if local + _LREC.size <= len(buffer):
                head = buffer[local : local + _LREC.size]
            else:
                head = self._slice(_LREC.size, pos)
            where = f"{self.rec_path}: record id {key} at offset {pos}"
            if len(head) < _LREC.size:
                raise RecordIOError(f"{where}: truncated (file ends inside the record header)")
            magic, lrec = _LREC.unpack(head)
            if magic != MAGIC:
                raise RecordIOError(f"{where}: bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
            cflag, length = lrec >> 29, lrec & _LENGTH_MASK
            start = local + _LREC.size
            if start + length <= len(buffer):
                data = buffer[start : start + length]
            else:
                data = self._slice(length, pos + _LREC.size) if length else b""
            if len(data) < length:
                raise RecordIOError(
                    f"{where}: truncated (needs {length} bytes, file has {len(data)} left)"
                )
            if (cflag in (0, 1)) != (not parts):
                raise RecordIOError(f"{where}: unexpected continuation flag {cflag}")
            parts.append(data)
            pos += _LREC.size + length + (-length % 4)
            if cflag in (0, 3):
                return _MAGIC_BYTES.join(parts) if len(parts) > 1 else bytes(parts[0]), pos

    def payload(self, key: int) -> memoryview:
        """Payload of record ``key`` (via the ``.idx``) as a zero-copy view of the file."""
        i = self.index.position(key)
        if i < 0:
            raise RecordIOError(f"{self.idx_path}: no record id {key}")
        offset, span = int(self.index.offsets[i]), int(self.index.spans[i])
        if span > _LREC.size:  # fast path: one whole (cflag 0) record
            buffer = self._slice(span, offset)
            magic, lrec = _LREC.unpack_from(buffer)
            length = lrec & _LENGTH_MASK
            if magic == MAGIC and lrec >> 29 == 0 and _LREC.size + length <= len(buffer):
                return buffer[_LREC.size : _LREC.size + length]
        return memoryview(self.read_at(offset, key, span)[0])

    def read(self, key: int) -> bytes:
        """Payload of record ``key`` (via the ``.idx``)."""
        return bytes(self.payload(key))

    def scan(self) -> Iterator[tuple[int, bytes]]:
        """Sequential pass over the file: yields (offset, payload) for every record."""
        offset = 0
        while offset < self.size:
            payload, following = self.read_at(offset, key=f"#{offset}")
            yield offset, payload
            offset = following


def build_index(rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None) -> Path:
    """Rebuild a ``.idx`` by scanning the ``.rec`` (keys = IRHeader ids). Written atomically."""
    reader = RecordIOReader(rec_path, require_index=False)
    lines = []
    for offset, payload in reader.scan():
        header, _ = unpack_record(payload, f"{reader.rec_path}: offset {offset}")
        lines.append(f"{header.id}\t{offset}\n")
    reader.close()
    idx_path = Path(idx_path) if idx_path else reader.rec_path.with_suffix(".idx")
    atomic_write_bytes(idx_path, "".join(lines).encode())
    return idx_path


class RecordIOWriter:
    """Write records (``write(key, payload)``) to ``.rec`` + ``.idx``.

    Writes go to temporary files in the target folder (:class:`partialfc.atomic.AtomicFile`);
    ``close()`` renames both into place, so a crash or exception never leaves a half-written
    set under the final names. Use as a context manager: leaving the block with an exception
    (a full disk included) removes the temporaries. The target folder must exist.
    """

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None):
        self.rec_path = Path(rec_path)
        self.idx_path = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        self._targets: list[AtomicFile] = []
        try:
            for path in (self.rec_path, self.idx_path):
                self._targets.append(AtomicFile(path))
            self._rec = open(self._targets[0].tmp, "wb")  # noqa: SIM115 - closed in close()
            self._idx = open(self._targets[1].tmp, "w")  # noqa: SIM115
        except BaseException:
            for target in self._targets:
                target.discard()
            raise
        self._keys: set[int] = set()
        self.count = 0

    def write(self, key: int, payload: bytes) -> None:
        if key in self._keys:
            raise ValueError(f"{self.rec_path}: duplicate record id {key}")
        self._keys.add(key)
        try:
            self._idx.write(f"{int(key)}\t{self._rec.tell()}\n")
            self._rec.write(frame_record(payload))
        except OSError as err:
            raise OSError(err.errno, f"{self.rec_path}: cannot write: {err.strerror}") from err
        self.count += 1

    def close(self) -> None:
        """Flush both files and move them into place (on failure nothing is left behind)."""
        if all(target.done for target in self._targets):
            return
        try:
            self._rec.close()
            self._idx.close()
            for target in self._targets:
                target.commit()
        except OSError as err:
            self.abort()
            raise OSError(err.errno, f"{self.rec_path}: cannot write: {err.strerror}") from err
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove the temporary files; the final names are left as they were."""
        for f in (self._rec, self._idx):
            try:
                f.close()
            except OSError:  # a failed flush (full disk) while closing: the file goes anyway
                pass
        for target in self._targets:
            target.discard()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


@dataclass
class RecordLayout:
    """Which keys are images, and the identity ranges when the set has a header record."""

    image_keys: np.ndarray  # int64 (N,)
    identity_ranges: np.ndarray | None  # int64 (K, 2): [start, end) image keys per identity
    has_header: bool


def _key_range(header: IRHeader, where: str) -> tuple[int, int]:
    """The ``(start, end)`` key range in the label vector of a header or identity record."""
    if header.flag < 2:
        raise RecordIOError(f"{where}: flag {header.flag}, expected a (start, end) label vector")
    start, end = (float(v) for v in header.label[:2])
    if not all(np.isfinite(v) and v.is_integer() and 0 <= v < 2**53 for v in (start, end)):
        raise RecordIOError(f"{where}: key range ({start:g}, {end:g}) is not two whole numbers")
    return int(start), int(end)


def read_layout(reader: RecordIOReader) -> RecordLayout:
    """Detect the InsightFace header record (key 0, flag > 0, no image data) and list the
    image keys. The header's identity records must cover the image keys ``1 ..
    first_identity - 1`` in order, without gaps or overlaps; otherwise RecordIOError."""
    if 0 not in reader.index:
        return RecordLayout(reader.keys.copy(), None, False)
    header, data = unpack_record(reader.read(0), f"{reader.rec_path}: record id 0")
    if header.flag == 0 or data:  # a header record carries no image bytes
        return RecordLayout(reader.keys.copy(), None, False)
    where = f"{reader.rec_path}: header record (id 0)"
    first_identity, end = _key_range(header, where)
    n = len(reader.index)
    if not 1 <= first_identity <= end <= n:
        raise RecordIOError(
            f"{where}: identity records {first_identity}..{end - 1} do not fit the {n} records "
            f"of {reader.idx_path}"
        )
    ranges = np.empty((end - first_identity, 2), dtype=np.int64)
    for row, key in enumerate(range(first_identity, end)):
        source = f"{reader.rec_path}: identity record id {key}"
        ranges[row] = _key_range(unpack_record(reader.read(key), source)[0], source)
    # the ranges must tile the image keys 1 .. first_identity - 1 in order
    starts, ends = ranges[:, 0], ranges[:, 1]
    expected = np.concatenate([[1], ends[:-1]])
    bad = np.flatnonzero((starts != expected) | (ends < starts))
    if bad.size:
        row = int(bad[0])
        key = first_identity + row
        after = f"the end of identity record id {key - 1}" if row else "the first image key"
        raise RecordIOError(
            f"{reader.rec_path}: identity record id {key}: key range ({starts[row]}, "
            f"{ends[row]}) should start at {expected[row]} ({after}) and not be reversed"
        )
    if (ends[-1] if len(ends) else 1) != first_identity:
        raise RecordIOError(
            f"{where}: identity records start at key {first_identity}, but the identity "
            f"ranges end at key {ends[-1] if len(ends) else 1} (identity record id {end - 1})"
        )
    image_keys = np.arange(1, first_identity, dtype=np.int64)
    rows = np.searchsorted(reader.index.keys, image_keys)
    found = rows < n
    found[found] = reader.index.keys[rows[found]] == image_keys[found]
    if not found.all():
        missing = int(image_keys[np.flatnonzero(~found)[0]])
        raise RecordIOError(f"{reader.idx_path}: image record id {missing} is missing")
    return RecordLayout(image_keys=image_keys, identity_ranges=ranges, has_header=True)


class RecordIODataset(LabelledDataset):
    """Images from an MXNet RecordIO set (with or without the InsightFace header record).

    Yields (uint8 RGB tensor (3, H, W), int label): the stored JPEG/PNG is decoded with OpenCV
    and converted BGR -> RGB once (see :mod:`partialfc.data.decode`). The label is the
    IRHeader scalar label, or the first element of its label vector. It is checked on every
    read: with a header record it must equal the identity whose key range holds the record;
    without one it must be a whole number in ``[0, N)`` for N images. A record that fails
    (a flipped bit, an inf or NaN label) is a RecordIOError like any other damaged record.

    on_error: "raise" -> RecordIOError naming file, offset and record id; "skip" -> substitute
    the next good record and append the bad key to ``skipped`` (per process). ``verify()``
    scans every record and returns the bad ones.
    """

    def __init__(
        self,
        rec_path: str | os.PathLike,
        idx_path: str | os.PathLike | None = None,
        transform: Transform | None = None,
        on_error: str = "raise",
        grayscale: bool = False,
        return_index: bool = False,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.reader = RecordIOReader(rec_path, idx_path)
        self.layout = read_layout(self.reader)
        self.keys = self.layout.image_keys
        self.transform = transform
        self.on_error = on_error
        self.grayscale = grayscale
        self.return_index = return_index
        self.skipped: list[int] = []
        self._labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def labels(self) -> np.ndarray:
        """int64 label of every image: from the identity ranges when the set has a header
        record, otherwise by reading every record header once (cached)."""
        if self._labels is None:
            ranges = self.layout.identity_ranges
            if ranges is not None:
                labels = np.full(len(self.keys), -1, dtype=np.int64)
                for identity, (start, end) in enumerate(ranges):
                    labels[start - 1 : end - 1] = identity
            else:
                labels = np.empty(len(self.keys), dtype=np.int64)
                for i, key in enumerate(self.keys):
                    labels[i] = self._checked_label(self._read(int(key))[0], int(key), i)
            self._labels = labels
        return self._labels

    def _where(self, key: int) -> str:
        offset = self.reader.index.offset(key)
        return f"{self.reader.rec_path}: record id {key} at offset {offset}"

    def _read(self, key: int) -> tuple[float, bytes]:
        """(stored label, unchecked; encoded image bytes) of record ``key``."""
        payload = self.reader.payload(key)
        if len(payload) >= _IRHEADER.size:  # fast path: scalar label (image records)
            flag, label = _FLAG_LABEL.unpack_from(payload)
            if flag == 0:
                return label, payload[_IRHEADER.size :]
        try:
            header, data = unpack_record(payload)
        except RecordIOError as err:
            raise RecordIOError(f"{self._where(key)}: {err}") from None
        label = header.label if header.flag == 0 else header.label[0]
        return float(label), data

    def _checked_label(self, value: float, key: int, index: int) -> int:
        if self.layout.identity_ranges is not None:
            expected = int(self.labels[index])
            if value == expected:
                return expected
            raise RecordIOError(
                f"{self._where(key)}: label {value:.10g} disagrees with the header record's "
                f"identity ranges, which put this record in identity {expected}"
            )
        if 0 <= value < len(self.keys) and float(value).is_integer():
            return int(value)
        raise RecordIOError(
            f"{self._where(key)}: label {value:.10g} is not a class id (a whole number in "
            f"[0, {len(self.keys)}) for a set of {len(self.keys)} images)"
        )

    def read_record(self, index: int) -> tuple[int, bytes]:
        """(checked label, encoded image bytes) of the ``index``-th image."""
        key = int(self.keys[index])
        value, data = self._read(key)
        return self._checked_label(value, key, index), data

    def _load_item(self, index: int):
        key = int(self.keys[index])
        label, data = self.read_record(index)
        try:
            image = to_chw_tensor(decode_image(data, grayscale=self.grayscale), copy=False)
        except ValueError as err:
            raise RecordIOError(f"{self._where(key)}: {err}") from None
        if self.transform is not None:
            image = self.transform(image)
        return (image, label, index) if self.return_index else (image, label)

    def __getitem__(self, index: int):
        if self.on_error == "raise":
            return self._load_item(index)
        index = int(index)
        for attempt in range(len(self)):
            candidate = (index + attempt) % len(self)
            try:
                return self._load_item(candidate)
            except RecordIOError:
                self.skipped.append(int(self.keys[candidate]))
        raise RecordIOError(f"{self.reader.rec_path}: no readable record")

    def verify(self) -> list[tuple[int, str]]:
        """Read and decode every image record; returns [(record id, error message)] for bad ones,
        after the gaps of an index that misses records (:meth:`RecordIOReader.coverage_gaps`)."""
        bad = self.reader.coverage_gaps()
        for i, key in enumerate(self.keys):
            try:
                self._load_item(i)
            except RecordIOError as err:
                bad.append((int(key), str(err)))
        return bad
