"""Loaders for the real data sets packed as plain ``.npz`` arrays (and their companion files).

* Omniglot (Lake et al., Science 2015): 1,623 handwritten character classes x 20 drawers.
  The 28x28 copy is bundled with partialfc; the 105x105 copy lives in ``../shared/data``.
  The files store 255 = paper; loaders return **ink = 255** (inverted), the usual convention.
* ORL / AT&T faces: 40 subjects x 10 greyscale 112x92 images.
* LFW development part: greyscale 96x96 tight crops (``dev`` = people of View 2 folds 1-5,
  ``extra`` = people in no pair), plus the 150x150 colour images of the pairs (see
  :mod:`partialfc.data.lfw`).

Every loader returns a dataclass with ``images`` (uint8) and ``labels`` (int64, contiguous
from 0) so it can be wrapped directly in :class:`partialfc.data.datasets.ArrayDataset`.
Nothing is pickled: ``np.load`` is always called without ``allow_pickle``.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUNDLED_OMNIGLOT = Path(__file__).resolve().parent / "bundled" / "omniglot"


def shared_data_root() -> Path:
    """``$PARTIALFC_SHARED_DATA`` or ``<repository>/../shared/data`` (where the real sets live)."""
    env = os.environ.get("PARTIALFC_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _npz_path(root: str | os.PathLike | None, default_dir: Path, filename: str) -> Path:
    """Resolve ``root`` (a folder holding ``filename`` or the file itself) to an existing file."""
    base = Path(root) if root is not None else default_dir
    path = base if base.suffix == ".npz" else base / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found (pass root=<folder with {filename}>)")
    return path


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


@dataclass
class OmniglotSet:
    """One Omniglot split, class-major: image ``i`` is drawing ``i % 20`` of class ``i // 20``.

    images: uint8 (N, H, W), ink = 255, paper = 0.
    labels: int64 (N,), contiguous 0..num_classes-1 within the split.
    class_names: ``"<Alphabet>/characterNN"`` per class; alphabets: the alphabet name per class.
    drawers: int64 (N,), the drawer (``sample_number``, 1-20) of each image, or None.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    alphabets: list[str]
    drawers: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def load_omniglot(
    split: str = "background",
    size: int = 28,
    root: str | os.PathLike | None = None,
    alphabets: Sequence[str] | None = None,
    exclude_alphabets: Sequence[str] = (),
) -> OmniglotSet:
    """Omniglot ``split`` ("background": 964 classes, "evaluation": 659) at ``size`` × ``size``.

    Size 28 reads ``omniglot_28.npz``; every other size reads the 105×105 originals
    (``omniglot_105.npz``) and resizes them with Pillow's LANCZOS filter, as the 28×28 copy and
    the one-shot runs (:func:`load_omniglot_one_shot_runs`) are made. Default root: the bundled
    copy when it holds the file, else ``../shared/data/omniglot``.

    ``alphabets`` (default None = all) keeps only the classes of these alphabets of the split;
    ``exclude_alphabets`` (default none) drops those of these. Labels stay contiguous, in the
    file's class order. An alphabet name that is not in the split is an error.
    """
    if split not in ("background", "evaluation"):
        raise ValueError(f"split must be 'background' or 'evaluation', got {split!r}")
    if not isinstance(size, int) or not 8 <= size <= 105:
        raise ValueError(f"size must be an integer in [8, 105] pixels, got {size!r}")
    filename = "omniglot_28.npz" if size == 28 else "omniglot_105.npz"
    default_dir = BUNDLED_OMNIGLOT
    if not (default_dir / filename).is_file():
        default_dir = shared_data_root() / "omniglot"
    data = _load_npz(_npz_path(root, default_dir, filename))
    keep = data["is_background"] if split == "background" else ~data["is_background"]
    if alphabets is not None or exclude_alphabets:
        keep = keep & _alphabet_mask(data, keep, split, alphabets, exclude_alphabets)
    images = data["images"][keep]  # (C, 20, H, W), 255 = paper
    num_classes, per_class = images.shape[:2]
    images = images.reshape(num_classes * per_class, *images.shape[2:])
    if images.shape[-1] != size:
        images = _resize_lanczos(images, size)
    images = 255 - images
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
    alphabet_names = [str(a) for a in data["alphabet_names"]]
    return OmniglotSet(
        images=np.ascontiguousarray(images),
        labels=labels,
        class_names=[str(c) for c in data["class_names"][keep]],
        alphabets=[alphabet_names[a] for a in data["alphabet"][keep]],
        drawers=np.tile(data["sample_number"].astype(np.int64), num_classes),
    )


def _alphabet_mask(data, in_split, split, alphabets, exclude_alphabets) -> np.ndarray:
    """Per class: in ``alphabets`` (all when None) and not in ``exclude_alphabets``."""
    names = [str(a) for a in data["alphabet_names"]]
    present = {names[a] for a in np.unique(data["alphabet"][in_split])}
    for name in [*(alphabets or ()), *exclude_alphabets]:
        if name not in present:
            raise ValueError(
                f"{name!r} is not an alphabet of the Omniglot {split} set; "
                f"choose from {', '.join(sorted(present))}"
            )
    class_alphabet = np.array(names)[data["alphabet"]]
    mask = ~np.isin(class_alphabet, list(exclude_alphabets))
    if alphabets is not None:
        mask &= np.isin(class_alphabet, list(alphabets))
    return mask


def _resize_lanczos(images: np.ndarray, size: int) -> np.ndarray:
    """``(N, H, W)`` uint8 → ``(N, size, size)`` with Pillow LANCZOS (the file convention)."""
    from PIL import Image

    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.asarray(Image.fromarray(image).resize((size, size), Image.LANCZOS))
    return out


@dataclass
class OneShotRun:
    """One 20-way one-shot trial: classify each test image as one of the 20 training images.

    training_images, test_images: uint8 (20, H, W), ink = 255.
    answers: int64 (20,): ``answers[i]`` indexes the training image of test image ``i``'s class.
    """

    training_images: np.ndarray
    test_images: np.ndarray
    answers: np.ndarray


def _read_run_png(archive: zipfile.ZipFile, name: str, size: int) -> np.ndarray:
    from PIL import Image

    image = Image.open(io.BytesIO(archive.read(name))).convert("L")  # 255 = paper
    if image.size != (size, size):
        image = image.resize((size, size), Image.LANCZOS)  # as the packed arrays were made
    return 255 - np.asarray(image, dtype=np.uint8)


def load_omniglot_one_shot_runs(
    size: int = 28, root: str | os.PathLike | None = None
) -> list[OneShotRun]:
    """The 20 runs of Lake's 20-way one-shot benchmark (``one_shot_all_runs.zip``).

    Images are resized to ``size`` with Pillow LANCZOS (like the packed arrays) and inverted
    to ink = 255. The answer key comes from each run's ``class_labels.txt``.
    """
    base = Path(root) if root is not None else BUNDLED_OMNIGLOT
    path = base if base.suffix == ".zip" else base / "one_shot_all_runs.zip"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: one-shot runs archive not found")
    runs = []
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        run_dirs = sorted({n.split("/")[0] for n in names if re.match(r"run\d+/", n)})
        for run in run_dirs:
            key = archive.read(f"{run}/class_labels.txt").decode().split()
            pairs = list(zip(key[0::2], key[1::2], strict=True))
            training = sorted(
                n for n in names if n.startswith(f"{run}/training/") and n.endswith(".png")
            )
            test = [t for t, _ in pairs]
            position = {name: i for i, name in enumerate(training)}
            try:
                answers = np.array([position[c] for _, c in pairs], dtype=np.int64)
            except KeyError as err:
                message = f"{path}: {run}/class_labels.txt names a missing image {err}"
                raise ValueError(message) from None
            runs.append(
                OneShotRun(
                    training_images=np.stack([_read_run_png(archive, n, size) for n in training]),
                    test_images=np.stack([_read_run_png(archive, n, size) for n in test]),
                    answers=answers,
                )
            )
    return runs


@dataclass
class FaceSet:
    """Labelled face images. images: uint8 (N, H, W); labels: int64 (N,) contiguous from 0;
    identity_names[k] names label k; image_names (optional) identifies each image."""

    images: np.ndarray
    labels: np.ndarray
    identity_names: list[str]
    image_names: list[str] | None = None
    identity_fold: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return len(self.identity_names)


def load_orl(root: str | os.PathLike | None = None) -> FaceSet:
    """ORL / AT&T faces: 400 greyscale images (112 x 92), 40 subjects, 10 images each.

    ``root``: the ``orl_faces`` folder or ``orl_faces.npz`` (default ``../shared/data/orl_faces``).
    """
    data = _load_npz(_npz_path(root, shared_data_root() / "orl_faces", "orl_faces.npz"))
    images = data["images"]  # (40, 10, 112, 92)
    subjects, per_subject = images.shape[:2]
    names = [str(s) for s in data["subject_names"]]
    image_names = [f"{s}/{int(n)}" for s in names for n in data["image_number"]]
    return FaceSet(
        images=np.ascontiguousarray(images.reshape(subjects * per_subject, *images.shape[2:])),
        labels=np.repeat(np.arange(subjects, dtype=np.int64), per_subject),
        identity_names=names,
        image_names=image_names,
    )


def load_lfw_gray(root: str | os.PathLike | None = None, part: str = "dev") -> FaceSet:
    """LFW greyscale 96x96 face crops: ``part`` "dev" (folds 1-5 people, 5,183 images, 2,041
    identities) or "extra" (people in no View 2 pair). ``identity_fold`` gives each person's fold.

    ``root``: the ``lfw_dev`` folder (default ``../shared/data/lfw_dev``).
    """
    if part not in ("dev", "extra"):
        raise ValueError(f"part must be 'dev' or 'extra', got {part!r}")
    path = _npz_path(root, shared_data_root() / "lfw_dev", f"lfw_gray96_{part}.npz")
    data = _load_npz(path)
    labels = data["labels"].astype(np.int64)
    names = [str(n) for n in data["identity_names"]]
    check_contiguous_labels(labels, str(path), num_classes=len(names))
    return FaceSet(
        images=data["images"],
        labels=labels,
        identity_names=names,
        image_names=[str(n) for n in data["image_names"]],
        identity_fold=data["identity_fold"],
    )


def check_contiguous_labels(labels: np.ndarray, source: str, num_classes: int | None = None) -> int:
    """Check that ``labels`` use every class 0..K-1 (classifiers index centers by label).

    Returns K. Raises ValueError naming ``source`` and the first missing / invalid labels.
    """
    labels = np.asarray(labels)
    if labels.size == 0:
        raise ValueError(f"{source}: no labels")
    if labels.min() < 0:
        raise ValueError(f"{source}: negative label {int(labels.min())}")
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.max() >= k:
        raise ValueError(f"{source}: label {int(labels.max())} >= number of classes {k}")
    present = np.zeros(k, dtype=bool)
    present[labels] = True
    if not present.all():
        missing = np.flatnonzero(~present)
        raise ValueError(
            f"{source}: labels are not contiguous 0..{k - 1}: {missing.size} classes have no "
            f"samples (first missing: {missing[:5].tolist()}); remap them, e.g. "
            "np.unique(labels, return_inverse=True)[1]"
        )
    return k
