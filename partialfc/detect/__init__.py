"""Face detection with five landmarks, feeding :func:`partialfc.data.align.align_face`.

    from partialfc.detect import load_detector, detect_and_align
    detector = load_detector()                      # MTCNN, weights shipped in the package
    faces = detector.detect(rgb_image)              # [Face(box, score, landmarks)], best first
    crops = detect_and_align(rgb_image, detector)   # [(112x112 RGB crop, Face)]

    detector = load_detector("scrfd", path="buffalo_l")   # an InsightFace pack's SCRFD ONNX

Any object with ``detect(image) -> list[Face]`` (:class:`FaceDetector`) can replace MTCNN.
"""

from __future__ import annotations

from partialfc.detect.base import LANDMARK_NAMES, Face, FaceDetector, as_rgb, largest_face
from partialfc.detect.photos import AlignedFace, detect_and_align, load_detector

__all__ = [
    "LANDMARK_NAMES",
    "AlignedFace",
    "Face",
    "FaceDetector",
    "as_rgb",
    "detect_and_align",
    "largest_face",
    "load_detector",
]
