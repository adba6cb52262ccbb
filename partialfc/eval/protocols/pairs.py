"""Pair-list verification protocols: InsightFace ``.bin`` sets and LFW ``pairs.txt``.

``.bin`` sets (LFW, CFP-FP, AgeDB-30, CALFW, CPLFW): images ``2i`` and ``2i+1`` form pair
``i``; 10 contiguous folds. ``pairs.txt``: the folds are the file's own. Both report the exact
ROC, EER, TAR@FAR (only the FARs the impostor count resolves) and k-fold accuracy.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..embedding import EmbedFn, embed_images
from ..reports import DEFAULT_FARS, VerificationReport, verification_report
from .base import Protocol


class VerificationBin(Protocol):
    """An InsightFace ``.bin`` verification set, read with the safe (restricted) reader."""

    def __init__(
        self,
        path: str | os.PathLike,
        name: str | None = None,
        flip: bool = True,
        batch_size: int = 256,
        fars=DEFAULT_FARS,
        n_folds: int = 10,
    ):
        self.path = Path(path)
        self.name = name or self.path.stem
        self.flip, self.batch_size, self.fars, self.n_folds = flip, batch_size, fars, n_folds

    def run(self, embed_fn: EmbedFn) -> list[VerificationReport]:
        from partialfc.data.verification_bin import decode_images, load_verification_bin

        encoded, issame = load_verification_bin(self.path)
        if len(encoded) != 2 * len(issame):
            raise ValueError(
                f"{self.path}: {len(encoded)} images for {len(issame)} pairs (expected 2 per pair)"
            )
        emb = embed_images(
            embed_fn, decode_images(encoded, str(self.path)), self.flip, self.batch_size
        )
        scores = np.sum(emb[0::2] * emb[1::2], axis=1)
        return [
            verification_report(
                self.name,
                scores=scores,
                is_genuine=issame,
                n_folds=self.n_folds,
                fars=self.fars,
                notes=[f"flip test: {self.flip}"],
            )
        ]


class LfwPairs(Protocol):
    """LFW ``pairs.txt`` over an image folder or zip (``<Name>/<Name>_<NNNN>.jpg``).

    Each distinct image is decoded and embedded once. Defaults: the LFW development pairs
    (View 2 folds 1-5) in the shared data folder. With ``skip_bad`` an image that cannot be
    read is listed in ``refused`` and the pairs that use it are left out (the report says how
    many); otherwise it stops the run.
    """

    skips_bad = True

    def __init__(
        self,
        pairs_path: str | os.PathLike | None = None,
        images_path: str | os.PathLike | None = None,
        name: str = "lfw_pairs",
        flip: bool = True,
        batch_size: int = 256,
        fars=DEFAULT_FARS,
    ):
        if pairs_path is None or images_path is None:
            from partialfc.data.loaders import shared_data_root

            root = shared_data_root() / "lfw_dev"
            pairs_path = pairs_path or root / "pairs_dev.txt"
            images_path = images_path or root / "lfw_color150_dev.zip"
            name = "lfw_dev_pairs" if name == "lfw_pairs" else name
        self.pairs_path, self.images_path = Path(pairs_path), Path(images_path)
        self.name, self.flip, self.batch_size, self.fars = name, flip, batch_size, fars

    def run(self, embed_fn: EmbedFn) -> list[VerificationReport]:
        from partialfc.data.lfw import LfwImageArchive, read_lfw_pairs
        from partialfc.data.refused import reason_of

        pairs = read_lfw_pairs(self.pairs_path)
        archive = LfwImageArchive(self.images_path)
        keys = sorted(
            set(zip(pairs.name1, pairs.number1.tolist(), strict=True))
            | set(zip(pairs.name2, pairs.number2.tolist(), strict=True))
        )
        images, refused = {}, []
        for key in keys:
            try:
                images[key] = archive.read(*key)
            except (ValueError, FileNotFoundError) as err:
                if not self.skip_bad:
                    raise
                source = f"{self.images_path}:{archive.member(*key)}"
                refused.append((source, reason_of(source, str(err))))
        self.refused = tuple(refused)
        first = list(zip(pairs.name1, pairs.number1.tolist(), strict=True))
        second = list(zip(pairs.name2, pairs.number2.tolist(), strict=True))
        kept = np.asarray(
            [a in images and b in images for a, b in zip(first, second, strict=True)], bool
        )
        if not kept.any():
            raise ValueError(f"{self.images_path}: no pair has two readable images")
        keys = [key for key in keys if key in images]
        row = {key: i for i, key in enumerate(keys)}
        emb = np.concatenate(
            [
                embed_images(
                    embed_fn,
                    np.stack([images[key] for key in keys[s : s + self.batch_size]]),
                    self.flip,
                    self.batch_size,
                )
                for s in range(0, len(keys), self.batch_size)
            ]
        )
        a = emb[[row[k] for k, keep in zip(first, kept, strict=True) if keep]]
        b = emb[[row[k] for k, keep in zip(second, kept, strict=True) if keep]]
        scores = np.sum(a * b, axis=1)
        notes = [f"{len(keys)} images, {len(np.unique(pairs.fold))} folds; flip test: {self.flip}"]
        if refused:
            notes.append(
                f"{len(refused)} unreadable image(s) refused (--skip-bad): "
                f"{int((~kept).sum())} of {len(kept)} pairs left out"
            )
        return [
            verification_report(
                self.name,
                scores=scores,
                is_genuine=pairs.issame[kept],
                folds=pairs.fold[kept],
                fars=self.fars,
                notes=notes,
            )
        ]
