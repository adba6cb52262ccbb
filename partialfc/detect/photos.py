"""From a photo to aligned crops: detect, pick the face(s), warp onto the template."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partialfc.detect.base import Face, FaceDetector, as_rgb, largest_face

DETECTORS = ("mtcnn",)


def load_detector(name: str = "mtcnn", device: str = "cpu", **options) -> FaceDetector:
    """A detector by name (``"mtcnn"``); ``options`` go to its constructor."""
    if name == "mtcnn":
        from partialfc.detect.mtcnn import MTCNN

        return MTCNN(device=device, **options)
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
) -> list[AlignedFace]:
    """Aligned crops of the largest face (default) or of every face (``all_faces``).

    ``image``: uint8 RGB or grey. Returns an empty list when no face is found.
    """
    from partialfc.data.align import align_face

    rgb = as_rgb(image, source)
    faces = detector.detect(rgb)
    if not all_faces:
        best = largest_face(faces)
        faces = [] if best is None else [best]
    return [AlignedFace(align_face(rgb, f.landmarks, size=size), f) for f in faces]
