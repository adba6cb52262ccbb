"""RecordIO: hand-built files (framing written here with struct, independently of the writer),
sets with and without the InsightFace header record, and the errors for bad files."""

from __future__ import annotations

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
