"""Map-style torch Datasets over in-memory arrays, image folders and ``path label`` list files.

Every dataset yields ``(image, label)`` — ``image`` a uint8 tensor (C, H, W) in RGB order (or
(1, H, W) grey), ``label`` an int — or ``(image, label, index)`` with ``return_index=True``.
Normalisation to float happens on the batch (:func:`partialfc.backbone.pixels.normalize_batch`),
so workers ship 4x fewer bytes. Every dataset exposes ``labels`` (int64 numpy array) and
``num_classes`` for samplers and the corruption wrappers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from partialfc.data.decode import IMAGE_EXTENSIONS, decode_image, to_chw_tensor
from partialfc.data.loaders import check_contiguous_labels

Transform = Callable[[torch.Tensor], torch.Tensor]


class LabelledDataset(Dataset):
    """Shared ``__getitem__`` plumbing: subclasses implement ``load(index) -> uint8 tensor``."""

    labels: np.ndarray
    transform: Transform | None = None
    return_index: bool = False

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    def load(self, index: int) -> torch.Tensor:
        raise NotImplementedError

    def __getitem__(self, index: int):
        image = self.load(int(index))
        if self.transform is not None:
            image = self.transform(image)
        label = int(self.labels[index])
        return (image, label, int(index)) if self.return_index else (image, label)


class ArrayDataset(LabelledDataset):
    """In-memory images: uint8 (N, H, W) (grey) or (N, H, W, C); labels (N,) ints.

    Labels are kept as given (int64); use ``check_contiguous_labels`` for training sets.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        transform: Transform | None = None,
        return_index: bool = False,
    ):
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(
                f"images must be uint8 (N, H, W) or (N, H, W, C), got {images.dtype} {images.shape}"
            )
        if labels.shape != (len(images),):
            raise ValueError(f"labels shape {labels.shape} does not match {len(images)} images")
        self.images = images
        self.labels = labels.astype(np.int64)
        self.transform = transform
        self.return_index = return_index

    def load(self, index: int) -> torch.Tensor:
        return to_chw_tensor(self.images[index])


def read_file(path: str) -> bytes:
    """Whole file as bytes via os.open/fstat/read (about half the cost of ``open().read()``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size)
        while len(data) < size:  # short reads are allowed by POSIX
            chunk = os.read(fd, size - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


class FileListDataset(LabelledDataset):
    """Images read from files: ``paths[i]`` with label ``labels[i]``.

    on_error: "raise" (ValueError naming the file) or "skip" (substitute the next readable
    sample and count it in ``skipped``; the count is per process when used in workers).
    """

    def __init__(
        self,
        paths: list[str],
        labels: np.ndarray,
        transform: Transform | None = None,
        grayscale: bool = False,
        on_error: str = "raise",
        return_index: bool = False,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.grayscale = grayscale
        self.on_error = on_error
        self.return_index = return_index
        self.skipped: list[str] = []

    def read(self, index: int) -> np.ndarray:
        path = self.paths[index]
        try:
            data = read_file(path)
        except OSError as err:
            raise ValueError(f"{path}: cannot read image: {err.strerror or err}") from None
        return decode_image(data, path, grayscale=self.grayscale)  # path only used in errors

    def load(self, index: int) -> torch.Tensor:
        return to_chw_tensor(self.read(index), copy=False)  # fresh buffer: a view suffices

    def __getitem__(self, index: int):
        if self.on_error == "raise":
            return super().__getitem__(index)
        for attempt in range(len(self)):
            candidate = (int(index) + attempt) % len(self)
            try:
                return super().__getitem__(candidate)
            except ValueError:
                self.skipped.append(self.paths[candidate])
        raise ValueError("no readable image in the whole dataset")


def scan_image_folder(root: str | os.PathLike) -> tuple[list[str], np.ndarray, list[str]]:
    """One sub-folder per identity -> (paths, labels, class names); classes sorted by name.

    Raises ValueError for a missing root, no identity folders, or an identity folder without
    images (naming it).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: image folder not found")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise ValueError(f"{root}: no identity sub-folders (expected <root>/<identity>/<image>)")
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(
            f.name
            for f in os.scandir(root / name)
            if f.is_file() and f.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not files:
            raise ValueError(f"{root / name}: identity folder has no images")
        paths += [str(root / name / f) for f in files]
        labels += [label] * len(files)
    return paths, np.asarray(labels, dtype=np.int64), classes


def scan_labelled_images(root: str | os.PathLike) -> tuple[list[str], np.ndarray, list[str]]:
    """:func:`scan_image_folder` for ``root/<identity>/<image>``; a folder without identity
    sub-folders but with images directly in it gives one identity per image (its stem), the
    way photos are read for ``embed``, ``search`` and ``verify`` (with or without detection)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: image folder not found")
    if any(d.is_dir() for d in root.iterdir()):
        return scan_image_folder(root)
    files = sorted(f for f in root.iterdir() if f.name.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise ValueError(f"{root}: no images (expected <root>/<identity>/<image> or images)")
    return [str(f) for f in files], np.arange(len(files), dtype=np.int64), [f.stem for f in files]


def read_list_file(
    list_path: str | os.PathLike, root: str | os.PathLike | None = None, remap_labels: bool = False
) -> tuple[list[str], np.ndarray]:
    """Parse ``path label`` lines (path may contain spaces; relative paths resolve against
    ``root``, default the list file's folder). Labels must be contiguous 0..K-1 unless
    ``remap_labels`` (then sorted distinct labels map to 0..K-1)."""
    list_path = Path(list_path)
    if not list_path.is_file():
        raise ValueError(f"{list_path}: list file not found")
    base = Path(root) if root is not None else list_path.parent
    paths, labels = [], []
    for lineno, line in enumerate(list_path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.rsplit(maxsplit=1)
        try:
            if len(parts) != 2:
                raise ValueError
            label = int(parts[1])
        except ValueError:
            raise ValueError(f"{list_path}: line {lineno}: expected '<path> <int label>'") from None
        path = Path(parts[0])
        paths.append(str(path if path.is_absolute() else base / path))
        labels.append(label)
    if not paths:
        raise ValueError(f"{list_path}: no entries")
    labels = np.asarray(labels, dtype=np.int64)
    if remap_labels:
        labels = np.unique(labels, return_inverse=True)[1].astype(np.int64)
    else:
        check_contiguous_labels(labels, str(list_path))
    return paths, labels


class ImageFolderDataset(FileListDataset):
    """``root/<identity>/<image>``; labels follow the sorted identity folder names (``classes``)."""

    def __init__(self, root: str | os.PathLike, transform: Transform | None = None, **kwargs):
        paths, labels, self.classes = scan_image_folder(root)
        super().__init__(paths, labels, transform, **kwargs)


class ListFileDataset(FileListDataset):
    """``path label`` list file (see :func:`read_list_file`)."""

    def __init__(
        self,
        list_path: str | os.PathLike,
        root: str | os.PathLike | None = None,
        transform: Transform | None = None,
        remap_labels: bool = False,
        **kwargs,
    ):
        paths, labels = read_list_file(list_path, root, remap_labels)
        super().__init__(paths, labels, transform, **kwargs)


class QuarterTurnClasses(Dataset):
    """Each image turned by ``k · 360/turns`` degrees becomes an image of a new class.

    Item ``i`` is item ``i mod N`` of ``dataset`` rotated counter-clockwise by ``k`` quarter
    (``turns=4``) or half (``turns=2``) turns, ``k = i div N``, with label ``label + k · C``
    (``C = dataset.num_classes``). The standard class augmentation of the few-shot literature
    for Omniglot (Santoro et al., ICML 2016, §4.1; Vinyals et al., NeurIPS 2016, §4.1.1):
    a character turned on its side is a different character. ``turns=1`` is the dataset as is.
    """

    def __init__(self, dataset, turns: int = 4):
        if turns not in (1, 2, 4):
            raise ValueError(
                f"turns must be 1, 2 or 4 (rotations by multiples of 90°), got {turns}"
            )
        self.dataset = dataset
        self.turns = int(turns)
        self.base_classes = int(dataset.num_classes)
        base = np.asarray(dataset.labels, dtype=np.int64)
        self.labels = np.concatenate([base + k * self.base_classes for k in range(self.turns)])

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return self.base_classes * self.turns

    def __getitem__(self, index: int):
        n = len(self.dataset)
        k, base_index = divmod(int(index), n)
        item = self.dataset[base_index]
        image = item[0]
        if k:
            image = torch.rot90(image, k * (4 // self.turns), dims=(-2, -1)).contiguous()
        return (image, int(self.labels[index]), *item[2:])
