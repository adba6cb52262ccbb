"""RecordIO: hand-built files (framing written here with struct, independently of the writer),
sets with and without the InsightFace header record, and the errors for bad files."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from partialfc.data.decode import encode_image
from partialfc.data.recordio import (
    MAGIC,
    IRHeader,
    RecordIODataset,
    RecordIOError,
    RecordIOReader,
    RecordIOWriter,
    build_index,
    frame_record,
    pack_record,
    unpack_record,
)


def hand_record(payload: bytes, cflag: int = 0) -> bytes:
    """magic, (cflag << 29 | length), payload, zero padding to 4 bytes."""
    pad = b"\0" * ((4 - len(payload) % 4) % 4)
    return struct.pack("<II", MAGIC, (cflag << 29) | len(payload)) + payload + pad


def hand_payload(label, key: int, data: bytes = b"") -> bytes:
    if np.ndim(label) == 0:
        return struct.pack("<IfQQ", 0, float(label), key, 0) + data
    vec = np.asarray(label, "<f4")
    return struct.pack("<IfQQ", vec.size, 0.0, key, 0) + vec.tobytes() + data


def write_hand_set(tmp_path, records: list[tuple[int, bytes]], name="hand"):
    rec, idx, offset = b"", [], 0
    for key, payload in records:
        framed = hand_record(payload)
        idx.append(f"{key}\t{offset}\n")
        rec += framed
        offset += len(framed)
    (tmp_path / f"{name}.rec").write_bytes(rec)
    (tmp_path / f"{name}.idx").write_text("".join(idx))
    return tmp_path / f"{name}.rec"


def images(n: int, size: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def test_hand_built_set_with_insightface_header(tmp_path):
    imgs = images(5)
    labels = [0, 0, 1, 1, 1]
    # keys 1..5 images, 6..7 identity records, 0 the header (6, 8)
    records = [(0, hand_payload([6.0, 8.0], 0))]
    records += [
        (k + 1, hand_payload(labels[k], k + 1, encode_image(imgs[k], ".png"))) for k in range(5)
    ]
    records += [(6, hand_payload([1.0, 3.0], 6)), (7, hand_payload([3.0, 6.0], 7))]
    ds = RecordIODataset(write_hand_set(tmp_path, records))
    assert ds.layout.has_header and len(ds) == 5
    np.testing.assert_array_equal(ds.layout.identity_ranges, [[1, 3], [3, 6]])
    np.testing.assert_array_equal(ds.labels, labels)
    for i in range(5):
        image, label = ds[i]
        assert image.shape == (3, 12, 12) and label == labels[i]
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), imgs[i])  # RGB kept


def test_hand_built_set_without_header_and_vector_labels(tmp_path):
    imgs = images(3)
    records = [
        (k, hand_payload([float(k), 9.0], k, encode_image(imgs[k], ".png"))) for k in range(3)
    ]
    ds = RecordIODataset(write_hand_set(tmp_path, records))
    assert not ds.layout.has_header
    assert [ds[i][1] for i in range(3)] == [0, 1, 2]  # first element of the label vector
    np.testing.assert_array_equal(ds.labels, [0, 1, 2])


def test_jpeg_records_decode_to_rgb(tmp_path):
    red = np.zeros((16, 16, 3), np.uint8)
    red[..., 0] = 220  # pure red in RGB
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, encode_image(red, ".jpg")))])
    image = RecordIODataset(rec)[0][0].float()
    assert image[0].mean() > 200 and image[2].mean() < 20


def test_writer_matches_hand_framing_and_splits_embedded_magic(tmp_path):
    payload = hand_payload(1, 4, b"abcd")
    assert frame_record(payload) == hand_record(payload)
    magic = struct.pack("<I", MAGIC)
    tricky = hand_payload(1, 4, b"abcd" + magic + b"wxyz" + magic + b"q")
    framed = frame_record(tricky)
    head = len(tricky) - 13  # bytes before the first embedded magic (aligned at 28)
    assert head == 28
    expected = hand_record(tricky[:28], 1)
    expected += hand_record(b"wxyz", 2) + hand_record(b"q", 3)
    assert framed == expected
    with RecordIOWriter(tmp_path / "w.rec") as writer:
        writer.write(4, tricky)
        writer.write(5, payload)
    reader = RecordIOReader(tmp_path / "w.rec")
    assert reader.read(4) == tricky and reader.read(5) == payload
    # an unaligned magic stays inside the data
    odd = hand_payload(1, 4, b"ab" + magic)
    assert frame_record(odd) == hand_record(odd)


def test_pack_unpack_record_roundtrip():
    header, data = unpack_record(pack_record(IRHeader(0, 7.0, 3, 1), b"xyz"))
    assert (header.flag, header.label, header.id, header.id2, data) == (0, 7.0, 3, 1, b"xyz")
    header, data = unpack_record(pack_record(IRHeader(0, np.array([1.5, 2.5]), 3), b"z"))
    assert header.flag == 2 and data == b"z"
    np.testing.assert_array_equal(header.label, [1.5, 2.5])


def test_truncated_record_names_file_offset_and_id(tmp_path):
    imgs = images(2)
    records = [(k, hand_payload(k, k, encode_image(imgs[k], ".png"))) for k in range(2)]
    rec = write_hand_set(tmp_path, records)
    second = int((tmp_path / "hand.idx").read_text().splitlines()[1].split()[1])
    rec.write_bytes(rec.read_bytes()[:-20])
    ds = RecordIODataset(rec)
    with pytest.raises(
        RecordIOError, match=rf"hand.rec: record id 1 at offset {second}: truncated"
    ):
        ds[1]
    assert ds[0][1] == 0


def test_corrupt_record_raises_or_is_skipped_and_counted(tmp_path):
    imgs = images(3)
    records = [(k, hand_payload(k, k, encode_image(imgs[k], ".png"))) for k in range(3)]
    rec = write_hand_set(tmp_path, records)
    offset = int((tmp_path / "hand.idx").read_text().splitlines()[1].split()[1])
    raw = bytearray(rec.read_bytes())
    raw[offset + 8 + 24 : offset + 8 + 40] = b"\0" * 16  # clobber the PNG signature
    rec.write_bytes(bytes(raw))
    with pytest.raises(RecordIOError, match=rf"hand.rec: record id 1 at offset {offset}"):
        RecordIODataset(rec)[1]
    skipping = RecordIODataset(rec, on_error="skip")
    image, label = skipping[1]
    assert label == 2 and skipping.skipped == [1]
    bad = skipping.verify()
    assert [key for key, _ in bad] == [1]


def test_bad_magic_is_reported(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"x" * 8)), (1, hand_payload(1, 1))])
    (tmp_path / "hand.idx").write_text("0\t0\n1\t4\n")
    with pytest.raises(RecordIOError, match="do not match"):
        RecordIOReader(rec)


def test_missing_idx_and_rebuild(tmp_path):
    records = [(k, hand_payload(k, k, b"data")) for k in range(3)]
    rec = write_hand_set(tmp_path, records)
    original = (tmp_path / "hand.idx").read_text()
    (tmp_path / "hand.idx").unlink()
    with pytest.raises(FileNotFoundError, match=r"hand.idx: index file not found"):
        RecordIODataset(rec)
    build_index(rec)
    assert (tmp_path / "hand.idx").read_text() == original


def test_idx_pointing_past_the_rec_is_refused(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data"))])
    (tmp_path / "hand.idx").write_text("0\t0\n1\t4096\n")
    with pytest.raises(RecordIOError, match=r"record id 1 points to offset 4096"):
        RecordIOReader(rec)


def test_writer_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with RecordIOWriter(tmp_path / "x.rec") as writer:
            writer.write(0, b"abc")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_dataloader_workers_and_channels_last_collate(tmp_path):
    import torch
    from torch.utils.data import DataLoader, default_collate

    from partialfc.data.transforms import collate_images

    torch.set_num_threads(1)
    imgs = images(8, size=10)
    records = [(k, hand_payload(k % 3, k, encode_image(imgs[k], ".png"))) for k in range(8)]
    ds = RecordIODataset(write_hand_set(tmp_path, records), return_index=True)
    ds[0]  # map the file in this process first: workers must map their own
    batches = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_images))
    assert len(batches) == 2
    images_cl, labels, index = batches[1]
    assert images_cl.shape == (4, 3, 10, 10)
    assert images_cl.is_contiguous(memory_format=torch.channels_last)
    reference = default_collate([ds[i] for i in range(4, 8)])
    assert torch.equal(images_cl, reference[0]) and reference[0].is_contiguous()
    assert labels.tolist() == [1, 2, 0, 1] and index.tolist() == [4, 5, 6, 7]
    np.testing.assert_array_equal(images_cl[0].permute(1, 2, 0).numpy(), imgs[4])


def test_malformed_idx_line_is_reported(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data"))])
    (tmp_path / "hand.idx").write_text("0\t0\n1\tabc\n")
    with pytest.raises(RecordIOError, match=r"hand.idx: line 2: expected 'key<TAB>offset'"):
        RecordIOReader(rec)
    (tmp_path / "hand.idx").write_text("0\t0\n0\t0\n")
    with pytest.raises(RecordIOError, match=r"hand.idx: record id 0 appears twice"):
        RecordIOReader(rec)


def test_dataset_pickles_for_spawned_workers(tmp_path):
    import pickle

    imgs = images(2)
    records = [(k, hand_payload(k, k, encode_image(imgs[k], ".png"))) for k in range(2)]
    ds = RecordIODataset(write_hand_set(tmp_path, records))
    first = ds[1][0]
    clone = pickle.loads(pickle.dumps(ds))  # the memory map is not pickled; it is re-made
    assert clone.reader._map is None
    assert np.array_equal(clone[1][0].numpy(), first.numpy()) and clone[1][1] == 1


# ---------------------------------------------------------------- damaged and hostile sets


def header_set(tmp_path, labels=(0, 0, 1, 1, 2, 2, 3), name="hs"):
    """InsightFace layout: images 1..N (label = identity), identity records, header at 0."""
    imgs = images(len(labels))
    n, k = len(labels), max(labels) + 1
    records = [(0, hand_payload([n + 1.0, n + 1.0 + k], 0))]
    records += [
        (i + 1, hand_payload(labels[i], i + 1, encode_image(imgs[i], ".png"))) for i in range(n)
    ]
    starts = [1 + labels.index(c) for c in range(k)]
    ends = starts[1:] + [n + 1]
    records += [(n + 1 + c, hand_payload([starts[c], ends[c]], n + 1 + c)) for c in range(k)]
    return write_hand_set(tmp_path, records, name)


def record_offset(rec, key: int) -> int:
    lines = rec.with_suffix(".idx").read_text().splitlines()
    return next(int(off) for k, off in (ln.split() for ln in lines) if int(k) == key)


def flip_label_bit(rec, key: int, bit: int) -> None:
    """Flip one bit of the float32 label in the IRHeader of record ``key``."""
    raw = bytearray(rec.read_bytes())
    where = record_offset(rec, key) + 8 + 4  # lrec header, then IRHeader flag
    value = struct.unpack_from("<I", raw, where)[0] ^ (1 << bit)
    struct.pack_into("<I", raw, where, value)
    rec.write_bytes(bytes(raw))


def test_truncated_idx_is_refused(tmp_path):
    for name, rec in [("hs", header_set(tmp_path)), ("plain", plain_set(tmp_path))]:
        idx = rec.with_suffix(".idx")
        lines = idx.read_text().splitlines(keepends=True)
        idx.write_text("".join(lines[:-2]))
        with pytest.raises(
            RecordIOError,
            match=rf"{name}.idx: the last indexed record \(id \d+ at offset \d+\) ends at byte "
            rf"\d+, but .*{name}.rec has {rec.stat().st_size} bytes: the index is truncated",
        ):
            RecordIODataset(rec)


def test_idx_missing_middle_records_is_reported_by_verify(tmp_path):
    """Without a header record nothing else says how many records there are: opening probes
    only the first and last records, so the set opens without the two dropped records, and
    verify() names the record before the gap and the bytes no entry covers. (With a header
    record, the identity ranges already refuse such an index when the set is opened.)"""
    rec = plain_set(tmp_path, labels=(0, 1, 1, 1, 2, 3))  # what remains is still 4 classes
    assert RecordIODataset(rec).verify() == []  # intact: no gaps, no damaged records
    idx = rec.with_suffix(".idx")
    lines = idx.read_text().splitlines(keepends=True)
    before, first_gone, kept = int(lines[1].split()[0]), int(lines[2].split()[1]), lines[4]
    idx.write_text("".join(lines[:2] + lines[4:]))  # drop the 3rd and 4th entries
    gap = int(kept.split()[1]) - first_gone
    dataset = RecordIODataset(rec)
    assert len(dataset) == 6 - 2
    problems = dataset.verify()
    assert [key for key, _ in problems] == [before]
    assert re.search(
        rf"{rec.name}: record id {before} at offset {record_offset(rec, before)} ends at byte "
        rf"{first_gone}, but the next indexed record starts at {first_gone + gap}: {gap} bytes "
        rf"are in no index entry \(.*{idx.name} misses records; rebuild it with "
        r"partialfc\.data\.recordio\.build_index\(rec_path\)\)$",
        problems[0][1],
    )


def plain_set(tmp_path, labels=(0, 1, 2, 3), name="plain"):
    imgs = images(len(labels))
    records = [
        (i, hand_payload(label, i, encode_image(imgs[i], ".png"))) for i, label in enumerate(labels)
    ]
    return write_hand_set(tmp_path, records, name)


@pytest.mark.parametrize("layout", ["header", "plain"])
def test_bit_flipped_labels_are_damaged_records(tmp_path, layout):
    """2.0 -> 2**33 (an exponent bit) and 3.0 -> -3.0 (the sign bit): a wrong label is refused
    by __getitem__, listed by verify(), skipped with on_error="skip" and refused by unpack."""
    from partialfc.data.pack import unpack_records

    if layout == "header":
        rec, keys, positions = header_set(tmp_path), (5, 7), (4, 6)  # labels 2 and 3
        substitutes, skipped = [2, 0], [5, 7]  # the next readable record, wrapping round
        why = r"disagrees with the header record's identity ranges, which put this record in"
    else:
        rec, keys, positions = plain_set(tmp_path), (2, 3), (2, 3)
        substitutes, skipped = [0, 0], [2, 3, 3]
        why = r"is not a class id \(a whole number in \[0, 4\) for a set of 4 images\)"
    flip_label_bit(rec, keys[0], 28)
    flip_label_bit(rec, keys[1], 31)
    ds = RecordIODataset(rec)
    for key, position, shown in zip(keys, positions, ("8589934592", "-3"), strict=True):
        where = rf"{rec.name}: record id {key} at offset {record_offset(rec, key)}"
        with pytest.raises(RecordIOError, match=rf"{where}: label {shown} {why}"):
            ds[position]
    assert [key for key, _ in ds.verify()] == list(keys)
    skipping = RecordIODataset(rec, on_error="skip")
    assert [skipping[p][1] for p in positions] == substitutes
    assert skipping.skipped == skipped
    with pytest.raises(RecordIOError, match=rf"record id {keys[0]} .*label 8589934592"):
        unpack_records(rec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([rec.name, f"{rec.stem}.idx"])


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1.5])
def test_non_finite_or_fractional_labels_are_damaged_records(tmp_path, value):
    rec = plain_set(tmp_path, labels=(0, 1, value))
    shown = f"{value:.10g}"
    with pytest.raises(RecordIOError, match=rf"record id 2 at offset \d+: label {shown} is not"):
        RecordIODataset(rec)[2]
    skipping = RecordIODataset(rec, on_error="skip")
    assert skipping[2][1] == 0 and skipping.skipped == [2]
    with pytest.raises(RecordIOError, match=rf"record id 2 .*label {shown} is not a class id"):
        _ = RecordIODataset(rec).labels
    header = header_set(tmp_path, name="h")
    raw = bytearray(header.read_bytes())
    struct.pack_into("<f", raw, record_offset(header, 3) + 12, value)
    header.write_bytes(bytes(raw))
    skipping = RecordIODataset(header, on_error="skip")
    assert skipping[2][1] == 1 and skipping.skipped == [3]  # key 3 = image 2, replaced by image 3


def test_identity_record_with_a_wrong_flag_is_named(tmp_path):
    rec = header_set(tmp_path)  # identity records are keys 8..11
    raw = bytearray(rec.read_bytes())
    struct.pack_into("<I", raw, record_offset(rec, 9) + 8, 0)  # flag 2 -> 0
    rec.write_bytes(bytes(raw))
    with pytest.raises(
        RecordIOError,
        match=r"hs.rec: identity record id 9: flag 0, expected a \(start, end\) label vector",
    ):
        RecordIODataset(rec)


@pytest.mark.parametrize(
    "key, values, message",
    [
        (0, (8.0, float("inf")), r"header record \(id 0\): key range \(8, inf\) is not two whole"),
        (0, (8.0, 4e9), r"header record \(id 0\): identity records 8..3999999999 do not fit the"),
        (
            0,
            (2.0**40, 2.0**40 + 4),
            r"header record \(id 0\): identity records 1099511627776\.\.\d+ do not fit the 12",
        ),
        (
            9,
            (3.0, 6.0),
            r"identity record id 10: key range \(5, 7\) should start at 6 \(the end "
            r"of identity record id 9\)",
        ),
        (8, (2.0, 3.0), r"identity record id 8: key range \(2, 3\) should start at 1 \(the first"),
        (9, (5.0, 3.0), r"identity record id 9: key range \(5, 3\) should start at 3 .*reversed"),
        (10, (5.0, float("nan")), r"identity record id 10: key range \(5, nan\) is not two"),
        (
            11,
            (7.0, 9.0),
            r"header record \(id 0\): identity records start at key 8, but the "
            r"identity ranges end at key 9 \(identity record id 11\)",
        ),
    ],
)
def test_corrupted_header_or_identity_ranges_are_refused(tmp_path, key, values, message):
    rec = header_set(tmp_path)  # header (8, 12); identities [1,3) [3,5) [5,7) [7,8)
    raw = bytearray(rec.read_bytes())
    struct.pack_into("<2f", raw, record_offset(rec, key) + 8 + 24, *values)
    rec.write_bytes(bytes(raw))
    with pytest.raises(RecordIOError, match=rf"hs.rec: {message}"):
        RecordIODataset(rec)


def test_intact_header_set_reads_back(tmp_path):
    ds = RecordIODataset(header_set(tmp_path))
    np.testing.assert_array_equal(ds.layout.identity_ranges, [[1, 3], [3, 5], [5, 7], [7, 8]])
    assert [ds[i][1] for i in range(len(ds))] == [0, 0, 1, 1, 2, 2, 3] and ds.verify() == []


# ---------------------------------------------------------------- framing and writing details


class _Sized:
    """Stands in for a payload of ``n`` bytes without allocating it (only ``len`` is used
    before the size check)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_records_of_2_to_the_29_bytes_are_refused():
    # the length field has 29 bits: 2**29 - 1 is the largest payload it can state
    with pytest.raises(
        ValueError, match=r"^record of 536870912 bytes exceeds the 2\^29-byte RecordIO limit$"
    ):
        frame_record(_Sized(1 << 29))


def test_framing_skips_unaligned_magics_and_splits_every_aligned_one():
    magic = struct.pack("<I", MAGIC)
    # unaligned magic at 1 (kept), aligned magics at 8 and 16, unaligned at 22, aligned at 28
    payload = b"a" + magic + b"bcd" + magic + b"efgh" + magic + b"ij" + magic + b"kl" + magic
    assert [i for i in range(len(payload)) if payload.startswith(magic, i)] == [1, 8, 16, 22, 28]
    expected = hand_record(payload[:8], 1) + hand_record(payload[12:16], 2)
    expected += hand_record(payload[20:28], 2) + hand_record(b"", 3)
    assert frame_record(payload) == expected


def test_framing_splits_a_magic_in_the_last_aligned_word():
    magic = struct.pack("<I", MAGIC)
    payload = b"abcdefgh" + magic  # 12 bytes, magic at 8
    assert frame_record(payload) == hand_record(b"abcdefgh", 1) + hand_record(b"", 3)


def test_pack_record_layout_by_hand():
    # no data by default; a vector label writes flag = its length and a scalar label of 0.0
    assert pack_record(IRHeader(0, 7.0, 3, 1)) == struct.pack("<IfQQ", 0, 7.0, 3, 1)
    packed = pack_record(IRHeader(0, np.array([1.5, 2.5]), 3, 1), b"z")
    assert packed == struct.pack("<IfQQ", 2, 0.0, 3, 1) + struct.pack("<2f", 1.5, 2.5) + b"z"


def test_build_index_to_another_path_and_errors_name_the_offset(tmp_path):
    records = [(k, hand_payload(k, k, b"data")) for k in range(3)]
    rec = write_hand_set(tmp_path, records)
    original = (tmp_path / "hand.idx").read_text()
    assert build_index(rec, tmp_path / "other.idx") == tmp_path / "other.idx"
    assert (tmp_path / "other.idx").read_text() == original
    # a record whose payload is shorter than an IRHeader, at offset 8 + 24 = 32
    (tmp_path / "short.rec").write_bytes(hand_record(hand_payload(0, 0)) + hand_record(b"tiny"))
    with pytest.raises(
        RecordIOError,
        match=r"short.rec: offset 32: payload of 4 bytes is shorter than IRHeader$",
    ):
        build_index(tmp_path / "short.rec")
    # a bad magic found by the scan is named by its offset
    (tmp_path / "bad.rec").write_bytes(hand_record(hand_payload(0, 0)) + b"\0" * 8)
    with pytest.raises(RecordIOError, match=r"bad.rec: record id #32 at offset 32: bad magic"):
        build_index(tmp_path / "bad.rec")


def test_writer_close_failure_keeps_errno_and_names_the_file(tmp_path):
    import errno

    class FullDisk:
        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    writer = RecordIOWriter(tmp_path / "x.rec")
    writer.write(0, b"abc")
    writer._rec.close()
    writer._rec = FullDisk()
    with pytest.raises(OSError) as err:
        writer.close()
    assert err.value.errno == errno.ENOSPC
    assert err.value.strerror == f"{tmp_path / 'x.rec'}: cannot write: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_writer_counts_uses_its_idx_path_and_refuses_duplicates(tmp_path):
    payloads = [hand_payload(k, k, b"data") for k in range(3)]
    with RecordIOWriter(tmp_path / "w.rec", tmp_path / "elsewhere.idx") as writer:
        for k, payload in enumerate(payloads):
            writer.write(k, payload)
        assert writer.count == 3
        with pytest.raises(ValueError, match=r"^.*w\.rec: duplicate record id 1$"):
            writer.write(1, payloads[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.idx", "w.rec"]
    reader = RecordIOReader(tmp_path / "w.rec", tmp_path / "elsewhere.idx")
    assert [reader.read(k) for k in range(3)] == payloads


def test_writer_write_failure_keeps_errno_and_names_the_file(tmp_path):
    import errno

    class FullDisk:
        def tell(self):
            return 0

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    writer = RecordIOWriter(tmp_path / "x.rec")
    writer._rec.close()
    writer._rec = FullDisk()
    with pytest.raises(OSError) as err:
        writer.write(0, b"abc")
    assert err.value.errno == errno.ENOSPC
    assert err.value.strerror == f"{tmp_path / 'x.rec'}: cannot write: No space left on device"
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_record_index_offset_by_key():
    from partialfc.data.recordio import RecordIndex

    index = RecordIndex(np.array([5, 3, 9]), np.array([0, 40, 80]), 120)  # not contiguous
    assert [index.offset(k) for k in (3, 5, 9)] == [40, 0, 80]
    assert [index.offset(k) for k in (0, 4, 10)] == [-1, -1, -1]
    contiguous = RecordIndex(np.array([4, 3]), np.array([40, 0]), 80)
    assert [contiguous.offset(k) for k in (2, 3, 4, 5)] == [-1, 0, 40, -1]


def test_plain_set_label_equal_to_the_image_count_is_refused(tmp_path):
    rec = plain_set(tmp_path, labels=(0, 1, 2, 4))
    with pytest.raises(
        RecordIOError, match=r"record id 3 at offset \d+: label 4 is not a class id .*\[0, 4\)"
    ):
        RecordIODataset(rec)[3]


def test_one_element_label_vectors_and_short_records_in_a_data_set(tmp_path):
    imgs = images(2)
    records = [(k, hand_payload([float(k)], k, encode_image(imgs[k], ".png"))) for k in range(2)]
    records.append((2, b"tiny"))
    rec = write_hand_set(tmp_path, records)
    ds = RecordIODataset(rec)
    assert [ds[i][1] for i in range(2)] == [0, 1]
    np.testing.assert_array_equal(ds[1][0].permute(1, 2, 0).numpy(), imgs[1])
    where = rf"hand.rec: record id 2 at offset {record_offset(rec, 2)}"
    with pytest.raises(
        RecordIOError, match=rf"{where}: payload of 4 bytes is shorter than IRHeader$"
    ):
        ds[2]
    ((key, message),) = ds.verify()
    assert key == 2 and message.endswith(
        f"record id 2 at offset {record_offset(rec, 2)}: payload of 4 bytes is shorter than "
        "IRHeader"
    )


@pytest.mark.parametrize(
    "key, values, message",
    [
        # 2**53 is exactly representable in float32 but no longer a safe key
        (0, (8.0, 2.0**53), r"header record \(id 0\): key range \(8, 9\.0072e\+15\) is not two"),
        (9, (3.5, 5.0), r"identity record id 9: key range \(3\.5, 5\) is not two whole numbers"),
        (9, (-3.0, 5.0), r"identity record id 9: key range \(-3, 5\) is not two whole numbers"),
        (8, (0.0, 3.0), r"identity record id 8: key range \(0, 3\) should start at 1 \(the first"),
    ],
)
def test_key_ranges_must_be_safe_whole_numbers(tmp_path, key, values, message):
    rec = header_set(tmp_path)  # header (8, 12); identities [1,3) [3,5) [5,7) [7,8)
    raw = bytearray(rec.read_bytes())
    struct.pack_into("<2f", raw, record_offset(rec, key) + 8 + 24, *values)
    rec.write_bytes(bytes(raw))
    with pytest.raises(RecordIOError, match=rf"hs.rec: {message}"):
        RecordIODataset(rec)


def test_key_range_vectors_may_carry_more_than_two_values(tmp_path):
    imgs = images(3)
    records = [(0, hand_payload([4.0, 6.0, 99.0], 0))]
    records += [(k, hand_payload(k // 3, k, encode_image(imgs[k - 1], ".png"))) for k in (1, 2, 3)]
    records += [(4, hand_payload([1.0, 3.0, 7.0], 4)), (5, hand_payload([3.0, 4.0, 7.0], 5))]
    ds = RecordIODataset(write_hand_set(tmp_path, records))
    np.testing.assert_array_equal(ds.layout.identity_ranges, [[1, 3], [3, 4]])
    assert [ds[i][1] for i in range(3)] == [0, 0, 1]


# ---------------------------------------------------------------- index files, layouts, options


def test_read_index_blank_lines_signs_and_dtypes(tmp_path):
    from partialfc.data.recordio import read_index

    idx = tmp_path / "a.idx"
    idx.write_text("0\t0\n1\t40\n2\t80\n")  # the bulk parser
    keys, offsets = read_index(idx)
    assert keys.dtype == np.int64 and offsets.dtype == np.int64
    assert keys.tolist() == [0, 1, 2] and offsets.tolist() == [0, 40, 80]
    # blank lines and a last line without newline go through the line-by-line parser, which
    # skips blank lines (all of them, not only up to the first) and accepts signed numbers
    idx.write_text("7\t0\n\n  \n-3\t-4\n\n5\t80")
    keys, offsets = read_index(idx)
    assert keys.dtype == np.int64 and offsets.dtype == np.int64
    assert keys.tolist() == [7, -3, 5] and offsets.tolist() == [0, -4, 80]
    idx.write_text("\n\n")
    keys, offsets = read_index(idx)
    assert keys.dtype == np.int64 and offsets.dtype == np.int64 and keys.size == offsets.size == 0
    for text, lineno in [("0\t0\n1\t4\t7\n", 2), ("5\n", 1), ("0\t0\nX1\t4\n", 2)]:
        idx.write_text(text)
        with pytest.raises(RecordIOError, match=rf"a\.idx: line {lineno}: expected 'key<TAB>"):
            read_index(idx)


def test_record_index_lookups_for_gapped_and_negative_keys():
    from partialfc.data.recordio import RecordIndex

    # each of these looks contiguous to a wrong test of first/last/second key and the count
    for keys in ([-1, 0, 3], [0, 5, 7], [0, 2, 4]):
        offsets = [0, 40, 80]
        index = RecordIndex(np.array(keys), np.array(offsets), 120)
        assert [index.offset(k) for k in keys] == offsets
        assert [k in index for k in keys] == [True] * 3
        assert index.position(1) == -1 and index.position(6) == -1 and 1 not in index
    contiguous = RecordIndex(np.array([3, 4]), np.array([0, 40]), 80)
    assert [contiguous.position(k) for k in (2, 3, 4, 5)] == [-1, 0, 1, -1]


def test_reader_without_index_and_missing_files_are_named(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data"))])
    (tmp_path / "hand.idx").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"hand\.idx: index file not found for .*hand\.rec; pass idx_path=, or rebuild it "
        r"with partialfc\.data\.recordio\.build_index\(rec_path\)$",
    ):
        RecordIOReader(rec)
    reader = RecordIOReader(rec, require_index=False)
    assert reader.keys.dtype == np.int64 and reader.keys.size == 0
    assert reader.index.offsets.dtype == np.int64 and 0 not in reader.index
    with pytest.raises(RecordIOError, match=r"hand\.idx: no record id 0$"):
        reader.payload(0)
    assert [payload for _, payload in reader.scan()] == [hand_payload(0, 0, b"data")]
    with pytest.raises(FileNotFoundError, match=r"nothing\.rec: RecordIO file not found$"):
        RecordIOReader(tmp_path / "nothing.rec")


def test_empty_rec_reads_as_truncated_and_closes(tmp_path):
    (tmp_path / "empty.rec").write_bytes(b"")
    reader = RecordIOReader(tmp_path / "empty.rec", require_index=False)
    assert list(reader.scan()) == []
    with pytest.raises(
        RecordIOError, match=r"empty\.rec: record id \? at offset 0: truncated \(file ends inside"
    ):
        reader.read_at(0)  # no key given: "?"
    reader.close()  # mapped nothing: closing must not fail
    assert reader._view is None


def test_close_unmaps_the_file(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data"))])
    reader = RecordIOReader(rec)
    assert reader.read(0) == hand_payload(0, 0, b"data")
    mapping = reader._map
    reader.close()
    assert mapping.closed and reader._map is None


def test_index_offsets_at_the_end_and_an_empty_last_record(tmp_path):
    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data")), (1, b"")])
    reader = RecordIOReader(rec)  # the empty record starts 8 bytes before the end
    assert reader.read(1) == b"" and reader.read(0) == hand_payload(0, 0, b"data")
    size = rec.stat().st_size
    (tmp_path / "hand.idx").write_text(f"0\t0\n1\t{size}\n")
    with pytest.raises(
        RecordIOError,
        match=rf"hand\.idx: record id 1 points to offset {size}, beyond the end of .*hand\.rec "
        rf"\({size} bytes\): \.idx and \.rec do not match$",
    ):
        RecordIOReader(rec)
    (tmp_path / "hand.idx").write_text("0\t0\n1\t4\n")
    with pytest.raises(
        RecordIOError,
        match=r"hand\.rec: offset 4 \(record id 1 in .*hand\.idx\) does not start a record: "
        r"\.idx and \.rec do not match$",
    ):
        RecordIOReader(rec)


def test_truncated_idx_message_says_how_to_rebuild(tmp_path):
    rec = plain_set(tmp_path)
    idx = rec.with_suffix(".idx")
    idx.write_text("".join(idx.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(
        RecordIOError,
        match=r"the index is truncated or belongs to another file \(rebuild it with "
        r"partialfc\.data\.recordio\.build_index\(rec_path\)\)$",
    ):
        RecordIOReader(rec)


def test_scan_joins_parts_and_a_trailing_empty_part(tmp_path):
    magic = struct.pack("<I", MAGIC)
    two_parts = hand_payload(0, 7, b"abcd" + magic)  # 32 bytes, magic at 28: parts of 28 and 0
    assert frame_record(two_parts) == hand_record(two_parts[:28], 1) + hand_record(b"", 3)
    with RecordIOWriter(tmp_path / "w.rec") as writer:
        writer.write(7, two_parts)
        writer.write(8, hand_payload(0, 8, b"xyz"))
    reader = RecordIOReader(tmp_path / "w.rec", require_index=False)
    assert [payload for _, payload in reader.scan()] == [two_parts, hand_payload(0, 8, b"xyz")]
    assert RecordIOReader(tmp_path / "w.rec").read(7) == two_parts


def test_record_starting_with_a_continuation_part_is_refused(tmp_path):
    (tmp_path / "c.rec").write_bytes(hand_record(hand_payload(0, 0), 2))
    reader = RecordIOReader(tmp_path / "c.rec", require_index=False)
    with pytest.raises(
        RecordIOError, match=r"c\.rec: record id #0 at offset 0: unexpected continuation flag 2$"
    ):
        list(reader.scan())


def test_plain_sets_starting_at_key_one_or_zero(tmp_path):
    imgs = images(3)
    for first in (1, 0):  # no key 0 at all, or a key 0 that is an image: no header record
        records = [
            (k + first, hand_payload(k, k + first, encode_image(imgs[k], ".png"))) for k in range(3)
        ]
        ds = RecordIODataset(write_hand_set(tmp_path, records, f"p{first}"))
        assert ds.layout.has_header is False and ds.layout.identity_ranges is None
        assert ds.keys.tolist() == [first, first + 1, first + 2]
        assert ds.labels.tolist() == [0, 1, 2] and [ds[i][1] for i in range(3)] == [0, 1, 2]


def header_records(imgs, labels, ranges, header=None):
    """Header record, images 1..N, one identity record per range: (key, payload) pairs."""
    n = len(labels)
    header = header if header is not None else [n + 1.0, n + 1.0 + len(ranges)]
    records = [(0, hand_payload(header, 0))]
    records += [
        (i + 1, hand_payload(labels[i], i + 1, encode_image(imgs[i], ".png"))) for i in range(n)
    ]
    records += [(n + 1 + c, hand_payload(list(r), n + 1 + c)) for c, r in enumerate(ranges)]
    return records


def test_header_sets_with_an_empty_identity_or_no_images(tmp_path):
    imgs = images(4)
    # identity 1 has no images: its range is empty, which is allowed
    records = header_records(imgs, [0, 0, 2, 2], [(1, 3), (3, 3), (3, 5)])
    ds = RecordIODataset(write_hand_set(tmp_path, records, "gap"))
    assert ds.layout.identity_ranges.tolist() == [[1, 3], [3, 3], [3, 5]]
    assert ds.labels.tolist() == [0, 0, 2, 2] and [ds[i][1] for i in range(4)] == [0, 0, 2, 2]
    # no images and no identities at all: header (1, 1)
    empty = RecordIODataset(write_hand_set(tmp_path, [(0, hand_payload([1.0, 1.0], 0))], "e"))
    assert len(empty) == 0 and empty.layout.has_header is True
    assert empty.layout.identity_ranges.shape == (0, 2) and empty.labels.size == 0
    # images but no identity records: the ranges end at key 1, not at the first identity key
    records = header_records(imgs, [0, 0, 1, 1], [], header=[5.0, 5.0])
    with pytest.raises(
        RecordIOError,
        match=r"n\.rec: header record \(id 0\): identity records start at key 5, but the "
        r"identity ranges end at key 1 \(identity record id 4\)$",
    ):
        RecordIODataset(write_hand_set(tmp_path, records, "n"))


def test_header_and_identity_records_that_are_not_key_ranges_are_named(tmp_path):
    imgs = images(2)
    records = header_records(imgs, [0, 1], [(1, 2), (2, 3)])
    records[0] = (0, hand_payload([4.0], 0))  # flag 1: one value, no range
    with pytest.raises(
        RecordIOError,
        match=r"f\.rec: header record \(id 0\): flag 1, expected a \(start, end\) label vector$",
    ):
        RecordIODataset(write_hand_set(tmp_path, records, "f"))
    records[0] = (0, b"tiny")
    with pytest.raises(
        RecordIOError, match=r"t\.rec: record id 0: payload of 4 bytes is shorter than IRHeader$"
    ):
        RecordIODataset(write_hand_set(tmp_path, records, "t"))
    records = header_records(imgs, [0, 1], [(1, 2), (2, 3)])
    records[-1] = (4, b"tiny")
    with pytest.raises(
        RecordIOError,
        match=r"i\.rec: identity record id 4: payload of 4 bytes is shorter than IRHeader$",
    ):
        RecordIODataset(write_hand_set(tmp_path, records, "i"))


def test_missing_image_record_is_named(tmp_path):
    rec = header_set(tmp_path)  # header (8, 12): images 1..7, identities 8..11
    idx = rec.with_suffix(".idx")
    idx.write_text(idx.read_text().replace("\n3\t", "\n99\t"))  # image key 3 -> 99
    with pytest.raises(RecordIOError, match=r"hs\.idx: image record id 3 is missing$"):
        RecordIODataset(rec)


def test_dataset_options_idx_path_transform_grayscale_and_zero_copy(tmp_path):
    imgs = images(2)
    records = [(k, hand_payload(k, k, encode_image(imgs[k], ".png"))) for k in range(2)]
    rec = write_hand_set(tmp_path, records)
    (tmp_path / "hand.idx").rename(tmp_path / "other.idx")
    ds = RecordIODataset(rec, idx_path=tmp_path / "other.idx")
    image = ds[1][0]
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), imgs[1])
    assert image.stride() == (1, 12 * 3, 3)  # a view of the decoded HWC buffer, not a copy
    flipped = RecordIODataset(rec, tmp_path / "other.idx", transform=lambda t: t.flip(-1))
    np.testing.assert_array_equal(flipped[1][0].numpy(), image.flip(-1).numpy())
    gray = RecordIODataset(rec, tmp_path / "other.idx", grayscale=True)[1][0]
    assert gray.shape == (1, 12, 12)
    luma = imgs[1].astype(np.float64) @ [0.299, 0.587, 0.114]  # ITU-R BT.601
    assert np.abs(gray[0].numpy() - luma).max() <= 1.0
    with pytest.raises(ValueError, match=r"^on_error must be 'raise' or 'skip', got 'ignore'$"):
        RecordIODataset(rec, tmp_path / "other.idx", on_error="ignore")


def test_skip_with_no_readable_record_names_the_file(tmp_path):
    rec = plain_set(tmp_path, labels=(7, 8))  # both labels outside [0, 2)
    ds = RecordIODataset(rec, on_error="skip")
    with pytest.raises(RecordIOError, match=r"plain\.rec: no readable record$"):
        ds[1]
    assert ds.skipped == [1, 0]


def test_label_vector_longer_than_the_payload_is_named():
    payload = struct.pack("<IfQQ", 5, 0.0, 3, 0) + struct.pack("<2f", 1.0, 2.0)  # 2 of 5 floats
    with pytest.raises(RecordIOError, match=r"^src: label vector of 5 floats exceeds the payload$"):
        unpack_record(payload, "src")
    whole = struct.pack("<IfQQ", 5, 0.0, 3, 0) + struct.pack("<5f", 1, 2, 3, 4, 5) + b"xy"
    header, data = unpack_record(whole, "src")
    assert header.flag == 5 and header.label.tolist() == [1, 2, 3, 4, 5] and data == b"xy"


def three_records_with_a_zeroed_header(tmp_path, zeroed_bytes: int):
    """Records 0, 1, 2 with the first ``zeroed_bytes`` of record 1's header set to zero."""
    records = [(k, hand_payload(k, k, b"data")) for k in range(3)]
    rec = write_hand_set(tmp_path, records)
    offset = record_offset(rec, 1)
    raw = bytearray(rec.read_bytes())
    raw[offset : offset + zeroed_bytes] = b"\0" * zeroed_bytes
    rec.write_bytes(bytes(raw))
    return records, rec, offset


def test_damaged_magic_inside_the_file_is_reported_on_read(tmp_path):
    records, rec, offset = three_records_with_a_zeroed_header(tmp_path, 4)
    reader = RecordIOReader(rec)  # only the first and last records are probed when opening
    assert reader.read(2) == records[2][1]
    with pytest.raises(
        RecordIOError,
        match=rf"hand\.rec: record id 1 at offset {offset}: bad magic 0x00000000 \(expected "
        r"0xced7230a\)$",
    ):
        reader.read(1)


def test_index_probe_uses_the_lowest_offset_not_the_lowest_key(tmp_path):
    rec = write_hand_set(tmp_path, [(5, hand_payload(0, 5, b"data")), (3, hand_payload(1, 3))])
    second = record_offset(rec, 3)
    # key 3 (the lowest key) is right; key 5 (the lowest offset) points into its own header
    (tmp_path / "hand.idx").write_text(f"5\t4\n3\t{second}\n")
    with pytest.raises(
        RecordIOError, match=r"hand\.rec: offset 4 \(record id 5 in .*hand\.idx\) does not start"
    ):
        RecordIOReader(rec)


def test_split_record_after_another_record_reads_back(tmp_path):
    magic = struct.pack("<I", MAGIC)
    split = hand_payload(0, 2, b"x" * 100 + magic + b"y" * 50)  # magic at 124: two parts
    with RecordIOWriter(tmp_path / "w.rec") as writer:
        writer.write(1, hand_payload(0, 1))
        writer.write(2, split)
    reader = RecordIOReader(tmp_path / "w.rec")
    assert reader.index.offsets.tolist() == [0, 32]
    assert reader.read(2) == split and reader.read(1) == hand_payload(0, 1)
    assert [payload for _, payload in reader.scan()] == [hand_payload(0, 1), split]


def test_coverage_gaps_follow_split_records_and_unaligned_lengths(tmp_path):
    """Records of 5 and 3 payload bytes (padded to 8 and 4) and a record split in three parts
    at two aligned magics: every indexed record ends where the next starts, so no gap. The
    first part of a split record carries continuation flag 1, its header alone does not give
    the record's end. The split record's id (0) is the offset of another record, so reading
    it by id instead of by offset gives a wrong end."""
    magic = struct.pack("<I", MAGIC)
    split = b"abcd" + magic + b"efghijkl" + magic + b"mn"  # parts of 4, 8 and 2 bytes
    with RecordIOWriter(tmp_path / "w.rec") as writer:
        writer.write(1, b"12345")
        writer.write(0, split)
        writer.write(3, b"xyz")
    reader = RecordIOReader(tmp_path / "w.rec")
    assert reader.index.offsets.tolist() == [16, 0, 16 + 12 + 16 + 12]  # ids 0, 1, 3
    assert reader.read(0) == split
    assert reader.coverage_gaps() == []
    # dropping the split record from the index leaves its 40 bytes uncovered
    (tmp_path / "w.idx").write_text("1\t0\n3\t56\n")
    gaps = RecordIOReader(tmp_path / "w.rec").coverage_gaps()
    assert [key for key, _ in gaps] == [1]
    assert "ends at byte 16, but the next indexed record starts at 56: 40 bytes" in gaps[0][1]


def test_coverage_gaps_leave_damaged_records_to_the_read(tmp_path):
    """A record whose header is zeroed (no magic, length 0) has no known end: it is reported
    once, by reading it in verify(), not also as a gap."""
    _, rec, _ = three_records_with_a_zeroed_header(tmp_path, 8)
    assert RecordIOReader(rec).coverage_gaps() == []


def test_coverage_gaps_report_an_entry_inside_another_record(tmp_path):
    """An index entry that points at a record header stored inside another record's payload
    (framed by hand, so the embedded magic is not split) makes the outer record end past the
    start of the next indexed one."""
    inner = hand_record(b"in")  # 12 bytes
    outer = hand_payload(0, 0, b"pad!" + inner)  # 24-byte IRHeader, then 4 + 12 bytes
    rec = tmp_path / "o.rec"
    rec.write_bytes(hand_record(outer) + hand_record(hand_payload(2, 2)))
    inner_at = 8 + 24 + 4
    (tmp_path / "o.idx").write_text(f"0\t0\n1\t{inner_at}\n2\t48\n")
    gaps = RecordIOReader(rec).coverage_gaps()
    assert gaps == [
        (
            0,
            f"{rec}: record id 0 at offset 0 ends at byte 48, past the start of the next "
            f"indexed record at {inner_at}: .idx and .rec do not match",
        )
    ]


@pytest.mark.parametrize(
    "text",
    [
        "0\t0\t1\t40\n",  # two entries on one line: the bulk parse sees two rows
        "0\t0\t1\t40",  # the same without the final newline
        "0\n0",  # one entry over two lines
        "0\n0\n ",  # the same, ending in a blank line without newline
        "0\t0\t0\n1\t40\t1\n",  # three fields per line: the bulk parse sees three rows
    ],
)
def test_read_index_refuses_entries_not_one_per_line(tmp_path, text):
    from partialfc.data.recordio import read_index

    idx = tmp_path / "a.idx"
    idx.write_text(text)
    with pytest.raises(RecordIOError, match=r"a\.idx: line 1: expected 'key<TAB>offset'$"):
        read_index(idx)


def test_record_index_spans_and_contiguous_base():
    from partialfc.data.recordio import RecordIndex

    index = RecordIndex(np.array([4, 2, 3]), np.array([80, 0, 40]), 200)
    assert index.keys.tolist() == [2, 3, 4]
    assert index.spans.dtype == np.int64 and index.spans.tolist() == [40, 40, 120]
    assert index.base == 2  # contiguous keys: looked up by subtraction
    assert RecordIndex(np.array([7]), np.array([0]), 16).base == 7
    assert RecordIndex(np.array([2, 4]), np.array([0, 40]), 80).base is None
    assert RecordIndex(np.array([2, 3, 5]), np.array([0, 40, 80]), 120).base is None


def test_reader_maps_the_file_as_process_1_after_pickling_and_closing(tmp_path, monkeypatch):
    """In a container the main process can be PID 1: "not mapped yet" must not look like a
    mapping made by process 1."""
    import pickle

    import partialfc.data.recordio as recordio

    rec = write_hand_set(tmp_path, [(0, hand_payload(0, 0, b"data"))])
    pickled = pickle.dumps(RecordIOReader(rec))
    monkeypatch.setattr(recordio.os, "getpid", lambda: 1)
    assert RecordIOReader(rec).read(0) == hand_payload(0, 0, b"data")
    assert pickle.loads(pickled).read(0) == hand_payload(0, 0, b"data")
    reader = RecordIOReader(rec)
    reader.close()
    assert reader.read(0) == hand_payload(0, 0, b"data")
