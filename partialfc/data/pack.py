"""Pack images into an MXNet RecordIO set (``.rec`` + ``.idx``) and unpack one into a folder.

Packed layout (InsightFace convention, readable by arcface_torch and by
:class:`partialfc.data.recordio.RecordIODataset`): images sorted by label are keys 1..N
(IRHeader label = class id, id = key); keys N+1..N+K hold one record per identity with label
``(first image key, end key)``; key 0 is the header record with label ``(N+1, N+1+K)``.
Record 0 is written last (readers find it through the ``.idx``), so a skipped image never
leaves a stale header. ``header=False`` writes plain im2rec-style keys 0..N-1 instead.

Identity names (``names=``, the sub-folder names when packing a folder) go to a sidecar
``<stem>.names.json`` beside the ``.rec`` (``{"format": "partialfc.identity_names", "names":
[...], "images": N, "idx_sha256": ...}``); the ``.rec`` and ``.idx`` stay exactly the MXNet
format, and readers that do not know the sidecar ignore it. The SHA-256 of the ``.idx`` ties
the sidecar to its set: a re-packed set with a stale sidecar is refused by
:func:`read_identity_names`. ``unpack`` writes one folder per name.

Image bytes are stored unchanged (each file is decoded once to check it) unless ``resize``
is given, in which case they are re-encoded as ``resize`` x ``resize`` JPEG at ``quality``;
non-square images are padded to a square by default (``fit="crop"``: centre-cropped,
``fit="stretch"``: stretched, see :func:`fit_square`), and the report counts them. Workers
read and check images in parallel; the main process writes in order to temporary files that
are renamed into place only when everything succeeded.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from partialfc.atomic import atomic_write_bytes
from partialfc.data.decode import decode_image, encode_image, image_extension
from partialfc.data.loaders import check_contiguous_labels
from partialfc.data.recordio import IRHeader, RecordIODataset, RecordIOWriter, pack_record


@dataclass
class PackReport:
    rec_path: str
    idx_path: str
    images: int
    classes: int
    skipped: list[str]
    has_header: bool
    non_square: int = 0  # images made square by ``fit`` (with ``resize``)


RESIZE_FITS = ("pad", "crop", "stretch")
NAMES_FORMAT = "partialfc.identity_names"


def identity_names_path(rec_path: str | os.PathLike) -> Path:
    """The identity-names sidecar of a ``.rec``: ``train.rec`` -> ``train.names.json``."""
    return Path(rec_path).with_suffix(".names.json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_identity_names(names, where: str) -> list[str]:
    """Names usable as folder names: distinct, non-empty strings, not ``.``/``..``, without
    path separators, NUL or line breaks (ValueError naming ``where`` and the first bad name)."""
    if not isinstance(names, list):
        raise ValueError(f"{where}: identity names must be a list, got {type(names).__name__}")
    seen: set[str] = set()
    for i, name in enumerate(names):
        bad = (
            not isinstance(name, str)
            or name in ("", ".", "..")
            or any(c in name for c in "/\\\0\n\r")
        )
        if bad:
            raise ValueError(f"{where}: identity {i} has an unusable name {name!r}")
        if name in seen:
            raise ValueError(f"{where}: identity name {name!r} appears twice")
        seen.add(name)
    return names


def write_identity_names(rec_path: str | os.PathLike, names: list[str], images: int) -> Path:
    """Write the names sidecar of a packed set (after its ``.idx``, whose hash it records)."""
    rec_path = Path(rec_path)
    path = identity_names_path(rec_path)
    record = {
        "format": NAMES_FORMAT,
        "version": 1,
        "rec": rec_path.name,
        "images": int(images),
        "idx_sha256": _sha256(rec_path.with_suffix(".idx")),
        "names": check_identity_names(list(names), str(path)),
    }
    atomic_write_bytes(path, (json.dumps(record, ensure_ascii=False, indent=1) + "\n").encode())
    return path


def read_identity_names(
    rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None
) -> list[str] | None:
    """The identity names of a packed set (label ``i`` -> ``names[i]``), or None without a
    sidecar. A sidecar that is malformed or belongs to another ``.idx`` raises ValueError
    naming it."""
    rec_path = Path(rec_path)
    path = identity_names_path(rec_path)
    if not path.is_file():
        return None
    idx_path = Path(idx_path) if idx_path else rec_path.with_suffix(".idx")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("format") != NAMES_FORMAT:
            raise ValueError(f"format is not {NAMES_FORMAT!r}")
        names = check_identity_names(record["names"], str(path))
        recorded = record["idx_sha256"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as err:
        raise ValueError(f"{path}: not an identity-names file: {err}") from None
    if idx_path.is_file() and recorded != _sha256(idx_path):
        raise ValueError(
            f"{path}: written for another version of {rec_path.name} (the SHA-256 of "
            f"{idx_path.name} differs); delete it or pack the set again"
        )
    return names


def fit_square(image: np.ndarray, size: int, fit: str = "pad") -> np.ndarray:
    """``size`` x ``size`` version of ``image``: ``pad`` (centre it on black, keep everything),
    ``crop`` (centred square of the short side) or ``stretch`` (change the aspect ratio)."""
    if fit not in RESIZE_FITS:
        raise ValueError(f"fit must be one of {', '.join(RESIZE_FITS)}, got {fit!r}")
    h, w = image.shape[:2]
    if fit == "crop" and h != w:
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        image = image[top : top + side, left : left + side]
    elif fit == "pad" and h != w:
        side = max(h, w)
        canvas = np.zeros((side, side, *image.shape[2:]), dtype=image.dtype)
        top, left = (side - h) // 2, (side - w) // 2
        canvas[top : top + h, left : left + w] = image
        image = canvas
    if image.shape[:2] != (size, size):
        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
    return image


def _prepare(
    path: str, resize: int | None, quality: int, fit: str = "pad", max_pixels: int | None = None
) -> tuple[bytes | None, str, bool]:
    """Worker: read and check one image -> (bytes to store, error message or "", whether
    ``resize`` had to make it square)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        image = decode_image(data, path, max_pixels=max_pixels)
    except (OSError, ValueError) as err:
        return None, f"{path}: unreadable image ({err})", False
    if not resize:
        return data, "", False
    data = encode_image(fit_square(image, resize, fit), ".jpg", quality)
    return data, "", image.shape[0] != image.shape[1]


def _pool(workers: int):
    """Reader processes: fork where available (no re-import cost), spawn elsewhere."""
    if workers <= 1:
        return None
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn").Pool(workers)


def pack_images(
    paths: list[str],
    labels,
    rec_path: str | os.PathLike,
    workers: int = 1,
    header: bool = True,
    resize: int | None = None,
    quality: int = 95,
    fit: str = "pad",
    skip_bad: bool = False,
    progress: bool = True,
    max_pixels: int | None = None,
    names: list[str] | None = None,
) -> PackReport:
    """Write ``paths`` with ``labels`` (contiguous 0..K-1) to ``rec_path`` (+ ``.idx``), and
    ``names`` (one per label) to the sidecar ``<stem>.names.json`` (without ``names``, a
    sidecar left from an earlier set of that name is removed).

    Unreadable images (including any whose header claims more than ``max_pixels`` pixels,
    default :func:`partialfc.data.decode.max_image_pixels`) raise ValueError naming the file,
    unless ``skip_bad`` (then they are listed in the report; an identity left without images
    is still an error). The output folder must exist. On any failure, a full disk included,
    no temporary file is left behind and an existing ``rec_path`` is untouched.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if len(paths) != len(labels):
        raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
    if len(paths) == 0:
        raise ValueError("nothing to pack: no images")
    num_classes = check_contiguous_labels(labels, "pack_images labels")
    if names is not None:
        check_identity_names(list(names), "pack_images names")
        if len(names) != num_classes:
            raise ValueError(f"{len(names)} identity names for {num_classes} labels")
    order = np.argsort(labels, kind="stable") if header else np.arange(len(labels))
    rec_path = Path(rec_path)
    if not rec_path.parent.is_dir():
        raise FileNotFoundError(f"{rec_path}: output folder {rec_path.parent} does not exist")
    if fit not in RESIZE_FITS:
        raise ValueError(f"fit must be one of {', '.join(RESIZE_FITS)}, got {fit!r}")
    work = partial(_prepare, resize=resize, quality=quality, fit=fit, max_pixels=max_pixels)
    items = [paths[i] for i in order]
    skipped: list[str] = []
    written_labels: list[int] = []
    non_square = 0
    first_key = 1 if header else 0
    with RecordIOWriter(rec_path) as writer:
        pool = _pool(workers)
        try:
            results = pool.imap(work, items, chunksize=32) if pool else map(work, items)
            bar = tqdm(
                results, total=len(items), desc=f"pack {rec_path.name}", disable=not progress
            )
            for position, (data, error, squared) in enumerate(bar):
                if data is None:
                    if not skip_bad:
                        raise ValueError(error)
                    skipped.append(error)
                    continue
                key = first_key + len(written_labels)
                label = int(labels[order[position]])
                writer.write(key, pack_record(IRHeader(0, float(label), key, 0), data))
                written_labels.append(label)
                non_square += squared
        finally:
            if pool:
                pool.terminate()
        counts = np.bincount(np.asarray(written_labels, dtype=np.int64), minlength=num_classes)
        if (counts == 0).any():
            empty = np.flatnonzero(counts == 0)[:5].tolist()
            raise ValueError(f"classes {empty} have no readable image; labels must be contiguous")
        if header:
            starts = first_key + np.concatenate([[0], np.cumsum(counts)[:-1]])
            first_identity = first_key + len(written_labels)
            for identity, (start, count) in enumerate(zip(starts, counts, strict=True)):
                key = first_identity + identity
                label = np.array([start, start + count], dtype=np.float32)
                writer.write(key, pack_record(IRHeader(2, label, key, 0)))
            end = first_identity + num_classes
            head = np.array([first_identity, end], dtype=np.float32)
            writer.write(0, pack_record(IRHeader(2, head, 0, 0)))
    if names is not None:
        write_identity_names(rec_path, list(names), len(written_labels))
    else:
        identity_names_path(rec_path).unlink(missing_ok=True)
    return PackReport(
        rec_path=str(rec_path),
        idx_path=str(writer.idx_path),
        images=len(written_labels),
        classes=num_classes,
        skipped=skipped,
        has_header=header,
        non_square=non_square,
    )


def unpack_records(
    rec_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    idx_path: str | os.PathLike | None = None,
    progress: bool = True,
    use_names: bool = True,
) -> int:
    """Write every image of a ``.rec`` set to ``out_dir/<identity>/<key>.<ext>`` plus
    ``out_dir/list.txt`` (``path label``). Images are the stored bytes, unchanged, with the
    extension of their format (``.jpg``, ``.png``, ...). ``<identity>`` is the name from the
    set's ``.names.json`` sidecar (written by ``pack``) when there is one and ``use_names``,
    else the zero-padded label (so the sorted folder order equals the label order). ``out_dir``
    must not exist; it appears complete or not at all (built under a temporary name). Returns
    the number of images."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir}: already exists; choose a new output folder")
    dataset = RecordIODataset(rec_path, idx_path)
    names = read_identity_names(rec_path, idx_path) if use_names else None
    if names is not None and len(names) != dataset.num_classes:
        raise ValueError(
            f"{identity_names_path(rec_path)}: {len(names)} names for "
            f"{dataset.num_classes} identities in {rec_path}"
        )
    width = len(str(max(dataset.num_classes - 1, 0)))
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    lines = []
    try:
        tmp.mkdir(parents=True)
        keys = tqdm(dataset.keys, desc=f"unpack {Path(rec_path).name}", disable=not progress)
        for index, key in enumerate(keys):
            label, data = dataset.read_record(index)
            folder = names[label] if names is not None else f"{label:0{width}d}"
            rel = f"{folder}/{int(key):08d}{image_extension(data)}"
            (tmp / rel).parent.mkdir(exist_ok=True)
            (tmp / rel).write_bytes(data)
            lines.append(f"{rel} {label}\n")
        (tmp / "list.txt").write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return len(lines)
