"""Photos into ``embed``/``verify``/``search``: detect, align to the model's input, embed."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from partialfc.detect.photos import AlignedPhotos, align_photos, photo_list


@dataclass
class PhotoEmbeddings:
    """Raw embeddings of aligned faces, one row per face, with where each came from."""

    raw: np.ndarray  # (N, d) unnormalised
    labels: np.ndarray  # (N,) identity label of each row's photo
    names: list[str]  # identity name per label
    photos: AlignedPhotos

    @property
    def sources(self) -> list[str]:
        return self.photos.sources

    def arrays(self) -> dict[str, np.ndarray]:
        """Per-row provenance for an ``.npz``: source path, box, score, landmarks."""
        return {
            "sources": np.asarray(self.photos.sources, dtype=str),
            "boxes": self.photos.boxes(),
            "detection_scores": self.photos.scores(),
            "landmarks": self.photos.landmarks(),
            "no_face": np.asarray(self.photos.no_face, dtype=str),
        }


def _aligned(embedder, paths, labels, args, desc: str | None) -> AlignedPhotos:
    from partialfc.detect.command import detector_from_args

    spec = embedder.spec
    height, width = spec.input_size
    if height != width:
        raise ValueError(f"--detect aligns square crops; the model expects {height}x{width}")
    return align_photos(
        paths,
        labels,
        detector_from_args(args),
        size=height,
        all_faces=getattr(args, "all_faces", False),
        grayscale=spec.in_channels == 1,
        skip_unreadable=getattr(args, "skip_bad", False),
        progress=desc,
        template=spec.alignment_landmarks,
    )


def embed_photos(embedder, path, args: argparse.Namespace, desc: str) -> PhotoEmbeddings:
    """Embed the faces in a photo file or folder (``root/<identity>/<photo>`` or photos).

    Photos without a face are reported on stderr and skipped; none at all is an error. With
    ``args.skip_bad`` unreadable photos are skipped too (listed in ``photos.unreadable``).
    """
    paths, labels, names = photo_list(path)
    photos = _aligned(embedder, paths, labels, args, desc)
    if photos.no_face:
        shown = ", ".join(photos.no_face[:5]) + (" ..." if len(photos.no_face) > 5 else "")
        print(f"no face found in {len(photos.no_face)} photo(s), skipped: {shown}", file=sys.stderr)
    if not photos.sources:
        raise ValueError(f"{path}: no face found in any of {len(paths)} photo(s)")
    raw = embedder.embed_raw(photos.crops, flip=args.flip, batch_size=args.batch_size)
    return PhotoEmbeddings(raw, photos.labels, names, photos)


def read_aligned_faces(embedder, paths: list[str], args: argparse.Namespace) -> np.ndarray:
    """The largest face of each photo, aligned to the model input; a photo without a face is
    an error naming it."""
    photos = _aligned(
        embedder,
        paths,
        np.zeros(len(paths)),
        argparse.Namespace(**{**vars(args), "all_faces": False}),
        None,
    )
    if photos.no_face:
        raise ValueError(f"{photos.no_face[0]}: no face found")
    return photos.crops
