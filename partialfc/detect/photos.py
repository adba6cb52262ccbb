"""From photos to aligned crops: detect, pick the face(s), warp onto the template.

* :func:`detect_and_align`: one image array -> aligned crops with their detections;
* :func:`photo_list`: a photo file or a ``root/<identity>/<photo>`` folder -> paths and labels;
* :func:`align_photos`: many photo files -> aligned crops per face plus a report of photos
  with no face or several faces (used by ``align``, ``pack --detect`` and ``embed --detect``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from partialfc.detect.base import Face, FaceDetector, as_rgb, largest_face

DETECTORS = ("mtcnn", "scrfd")


def load_detector(name: str = "mtcnn", device: str = "cpu", **options) -> FaceDetector:
    """A detector by name; ``options`` go to its constructor.

    ``"mtcnn"``: the bundled MTCNN; ``"scrfd"``: an SCRFD ONNX, ``path=`` the ``.onnx`` file or
    an InsightFace model pack folder holding one.
    """
    if name == "mtcnn":
        from partialfc.detect.mtcnn import MTCNN

        return MTCNN(device=device, **options)
    if name == "scrfd":
        from partialfc.detect.scrfd import SCRFD, find_scrfd_onnx

        options = dict(options)
        path = Path(options.pop("path", ""))
        if path.is_dir():
            path = find_scrfd_onnx(path)
        elif not path.is_file():
            raise ValueError(f"{path}: no SCRFD .onnx file or model pack folder there")
        return SCRFD(path, device=device, **options)
    raise ValueError(f"unknown face detector {name!r}; choose from {', '.join(DETECTORS)}")


@dataclass(frozen=True)
class AlignedFace:
    """An aligned ``size`` x ``size`` RGB crop and the detection it came from."""

    crop: np.ndarray
    face: Face


def detect_and_align(
    image: np.ndarray,
    detector: FaceDetector,
    size: int = 112,
    all_faces: bool = False,
    source: str = "image",
    template: np.ndarray | None = None,
) -> list[AlignedFace]:
    """Aligned crops of the largest face (default) or of every face (``all_faces``).

    ``image``: uint8 RGB or grey. Returns an empty list when no face is found. ``template``:
    the five target points in crop pixels (default: the ArcFace template scaled to ``size``).
    """
    from partialfc.data.align import align_face

    rgb = as_rgb(image, source)
    faces = detector.detect(rgb)
    if not all_faces:
        best = largest_face(faces)
        faces = [] if best is None else [best]
    return [
        AlignedFace(align_face(rgb, f.landmarks, size=size, template=template), f) for f in faces
    ]


def photo_list(path: str | os.PathLike) -> tuple[list[str], np.ndarray, list[str]]:
    """``(paths, labels, identity names)`` of one photo file or a ``root/<identity>/`` folder.

    A single file is its own identity (its stem); a folder without identity sub-folders but
    with photos directly in it gives one identity per photo.
    """
    from partialfc.data.datasets import scan_labelled_images

    path = Path(path)
    if path.is_file():
        return [str(path)], np.zeros(1, dtype=np.int64), [path.stem]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such photo file or folder")
    return scan_labelled_images(path)


def read_photo(path: str) -> np.ndarray:
    """uint8 RGB ``(H, W, 3)``; ValueError naming the file when it cannot be read."""
    from partialfc.data.decode import decode_image

    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read photo: {err.strerror or err}") from None
    return decode_image(data, path)


@dataclass
class AlignedPhotos:
    """Aligned crops, one row per kept face, and what happened to every photo."""

    crops: np.ndarray  # (N, size, size, 3) uint8 RGB, or (N, size, size) when grey
    sources: list[str]  # photo of each row
    labels: np.ndarray  # (N,) label of each row's photo
    faces: list[Face]  # detection of each row
    no_face: list[str] = field(default_factory=list)
    several_faces: dict[str, int] = field(default_factory=dict)  # photo -> faces found
    unreadable: dict[str, str] = field(default_factory=dict)  # photo -> error

    def boxes(self) -> np.ndarray:
        return np.array([f.box for f in self.faces], dtype=np.float32).reshape(-1, 4)

    def scores(self) -> np.ndarray:
        return np.array([f.score for f in self.faces], dtype=np.float32)

    def landmarks(self) -> np.ndarray:
        return np.array([f.landmarks for f in self.faces], dtype=np.float32).reshape(-1, 5, 2)

    def summary(self) -> dict:
        return {
            "faces": len(self.sources),
            "photos_with_a_face": len(set(self.sources)),
            "no_face": list(self.no_face),
            "several_faces": dict(self.several_faces),
            "unreadable": dict(self.unreadable),
        }


def align_photos(
    paths: list[str],
    labels,
    detector: FaceDetector,
    size: int = 112,
    all_faces: bool = False,
    grayscale: bool = False,
    skip_unreadable: bool = False,
    progress: str | None = None,
    template: np.ndarray | None = None,
) -> AlignedPhotos:
    """Detect and align every photo; photos with no face are listed, not fatal.

    ``all_faces``: a row per face (default: the largest face only); photos with several faces
    are listed either way. Unreadable photos raise ValueError unless ``skip_unreadable``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    crops, sources, row_labels, faces = [], [], [], []
    result = AlignedPhotos(np.zeros((0, size, size, 3), np.uint8), [], labels[:0], [])
    iterator = zip(paths, labels, strict=True)
    if progress:
        import sys

        from tqdm import tqdm

        iterator = tqdm(iterator, total=len(paths), desc=progress, unit="img", file=sys.stderr)
    for path, label in iterator:
        try:
            image = read_photo(path)
        except ValueError as err:
            if not skip_unreadable:
                raise
            result.unreadable[path] = str(err)
            continue
        found = detect_and_align(
            image, detector, size=size, all_faces=True, source=path, template=template
        )
        if not found:
            result.no_face.append(path)
            continue
        if len(found) > 1:
            result.several_faces[path] = len(found)
        if not all_faces:
            best = largest_face([a.face for a in found])
            found = [a for a in found if a.face is best]
        for aligned in found:
            crop = aligned.crop
            crops.append(cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY) if grayscale else crop)
            sources.append(path)
            row_labels.append(int(label))
            faces.append(aligned.face)
    if crops:
        result.crops = np.stack(crops)
    elif grayscale:
        result.crops = np.zeros((0, size, size), np.uint8)
    result.sources, result.labels, result.faces = sources, np.asarray(row_labels, np.int64), faces
    return result
