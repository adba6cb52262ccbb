"""The detector interface: an RGB image in, faces (box, score, five landmarks) out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

LANDMARK_NAMES = ("left_eye", "right_eye", "nose", "mouth_left", "mouth_right")


@dataclass(frozen=True)
class Face:
    """One detected face in pixel coordinates of the image it was found in.

    ``box``: ``(4,)`` float ``x1, y1, x2, y2``; ``score``: detector confidence in [0, 1];
    ``landmarks``: ``(5, 2)`` float ``(x, y)`` in the order of :data:`LANDMARK_NAMES`
    (left/right as seen in the image), the order :func:`partialfc.data.align.align_face` expects.
    """

    box: np.ndarray
    score: float
    landmarks: np.ndarray

    @property
    def area(self) -> float:
        x1, y1, x2, y2 = self.box
        return float(max(x2 - x1, 0.0) * max(y2 - y1, 0.0))

    def to_dict(self) -> dict:
        return {
            "box": [round(float(v), 2) for v in self.box],
            "score": round(float(self.score), 4),
            "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in self.landmarks],
        }


@runtime_checkable
class FaceDetector(Protocol):
    """Anything with ``detect(image) -> list[Face]`` plugs into ``align``/``embed --detect``.

    ``image`` is uint8 ``(H, W, 3)`` RGB. Faces come back highest score first.
    """

    def detect(self, image: np.ndarray) -> list[Face]: ...


def largest_face(faces: list[Face]) -> Face | None:
    """The face with the largest box (ties: the higher score), or None."""
    if not faces:
        return None
    return max(faces, key=lambda f: (f.area, f.score))


def as_rgb(image: np.ndarray, source: str = "image") -> np.ndarray:
    """uint8 ``(H, W, 3)`` RGB from a grey ``(H, W)``/``(H, W, 1)`` or RGB(A) array."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"{source}: expected a uint8 image, got {image.dtype}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim == 2:
        return np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim == 3 and image.shape[2] in (3, 4):
        return np.ascontiguousarray(image[:, :, :3])
    raise ValueError(f"{source}: expected an (H, W) or (H, W, 3) image, got shape {image.shape}")
