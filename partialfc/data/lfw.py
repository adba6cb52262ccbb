"""LFW-style verification pairs: ``pairs.txt`` and the images they refer to.

``pairs.txt`` (LFW View 2): a header ``<folds>\\t<n>``, then per fold ``n`` matched lines
``name i j`` followed by ``n`` mismatched lines ``name1 i name2 j``; images are
``<name>/<name>_<NNNN>.jpg`` (NNNN = image number, 1-based).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from partialfc.data.decode import decode_image


@dataclass
class VerificationPairs:
    """Image pairs with same/different ground truth. Arrays of length P (number of pairs):
    ``name1/number1`` and ``name2/number2`` identify the images; ``issame`` is bool;
    ``fold`` is the 1-based cross-validation fold of each pair."""

    name1: list[str]
    number1: np.ndarray
    name2: list[str]
    number2: np.ndarray
    issame: np.ndarray
    fold: np.ndarray

    def __len__(self) -> int:
        return len(self.name1)

    def image_names(self) -> list[str]:
        """Distinct image ids ``<Name>_<NNNN>`` used by the pairs, sorted."""
        ids = {f"{n}_{k:04d}" for n, k in zip(self.name1, self.number1, strict=True)}
        ids |= {f"{n}_{k:04d}" for n, k in zip(self.name2, self.number2, strict=True)}
        return sorted(ids)


def read_lfw_pairs(path: str | os.PathLike) -> VerificationPairs:
    """Parse an LFW ``pairs.txt`` (or ``pairs_dev.txt``); errors name the file and line."""
    path = Path(path)
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    if not lines or len(lines[0]) != 2:
        raise ValueError(f"{path}: line 1: expected header '<folds> <pairs per class>'")
    folds, per_class = int(lines[0][0]), int(lines[0][1])
    expected = folds * 2 * per_class
    if len(lines) - 1 != expected:
        raise ValueError(f"{path}: header promises {expected} pairs, file has {len(lines) - 1}")
    name1, number1, name2, number2, issame, fold = [], [], [], [], [], []
    for i, fields in enumerate(lines[1:]):
        lineno = i + 2
        try:
            if len(fields) == 3:
                a, b, c = fields
                name1.append(a), number1.append(int(b)), name2.append(a), number2.append(int(c))
                issame.append(True)
            elif len(fields) == 4:
                a, b, c, d = fields
                name1.append(a), number1.append(int(b)), name2.append(c), number2.append(int(d))
                issame.append(False)
            else:
                raise ValueError(f"expected 3 or 4 fields, got {len(fields)}")
        except ValueError as err:
            raise ValueError(f"{path}: line {lineno}: {err}") from None
        fold.append(i // (2 * per_class) + 1)
    return VerificationPairs(
        name1=name1,
        number1=np.asarray(number1, dtype=np.int64),
        name2=name2,
        number2=np.asarray(number2, dtype=np.int64),
        issame=np.asarray(issame, dtype=bool),
        fold=np.asarray(fold, dtype=np.int64),
    )


class LfwImageArchive:
    """Read LFW images ``<prefix>/<Name>/<Name>_<NNNN>.jpg`` from a zip archive or a folder.

    ``read(name, number)`` returns RGB uint8 (H, W, 3). The zip handle is opened lazily per
    process, so instances can be used inside DataLoader workers.
    """

    def __init__(self, path: str | os.PathLike, prefix: str | None = None):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: LFW image archive/folder not found")
        self._zip: zipfile.ZipFile | None = None
        self._pid = -1
        if self.path.is_dir():
            self.prefix = prefix or ""
        else:
            with zipfile.ZipFile(self.path) as archive:
                first = next((n for n in archive.namelist() if n.endswith(".jpg")), "")
            default = "/".join(first.split("/")[:-2])
            self.prefix = default if prefix is None else prefix

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_zip"], state["_pid"] = None, -1  # reopened lazily in the receiving process
        return state

    def member(self, name: str, number: int) -> str:
        rel = f"{name}/{name}_{int(number):04d}.jpg"
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def image_ids(self) -> list[str]:
        """Every image as ``<Name>_<NNNN>``, sorted."""
        if self.path.is_dir():
            files = (p.relative_to(self.path).as_posix() for p in self.path.rglob("*.jpg"))
        else:
            with zipfile.ZipFile(self.path) as archive:
                files = archive.namelist()
        start = f"{self.prefix}/" if self.prefix else ""
        return sorted(
            f[len(start) :].split("/")[-1][:-4]
            for f in files
            if f.endswith(".jpg") and f.startswith(start)
        )

    def read_bytes(self, name: str, number: int) -> bytes:
        member = self.member(name, number)
        if self.path.is_dir():
            file = self.path / member
            if not file.is_file():
                raise FileNotFoundError(f"{file}: image not found")
            return file.read_bytes()
        if self._zip is None or self._pid != os.getpid():
            self._zip, self._pid = zipfile.ZipFile(self.path), os.getpid()
        try:
            return self._zip.read(member)
        except KeyError:
            raise FileNotFoundError(f"{self.path}: no member {member}") from None

    def read(self, name: str, number: int) -> np.ndarray:
        source = f"{self.path}:{self.member(name, number)}"
        return decode_image(self.read_bytes(name, number), source)

    def read_pairs(self, pairs: VerificationPairs) -> tuple[np.ndarray, np.ndarray]:
        """Both images of every pair: two uint8 arrays (P, H, W, 3); each image decoded once."""
        cache: dict[tuple[str, int], np.ndarray] = {}

        def get(name: str, number: int) -> np.ndarray:
            key = (name, int(number))
            if key not in cache:
                cache[key] = self.read(*key)
            return cache[key]

        first = np.stack([get(n, k) for n, k in zip(pairs.name1, pairs.number1, strict=True)])
        second = np.stack([get(n, k) for n, k in zip(pairs.name2, pairs.number2, strict=True)])
        return first, second
