"""Five-landmark face alignment to the ArcFace 112x112 template.

Landmarks are (x, y) pixel coordinates in the order: left eye, right eye, nose tip, left mouth
corner, right mouth corner (left/right as seen in the image). The similarity transform
(rotation + isotropic scale + translation) that maps them onto the template in the least-squares
sense is Umeyama's closed form (IEEE TPAMI 13(4), 1991):

    mu_s, mu_d = means; Sigma = (1/N) sum (d_i - mu_d)(s_i - mu_s)^T = U D V^T
    S = diag(1, sign(det U det V)); R = U S V^T; c = trace(D S) / var_s; t = mu_d - c R mu_s

Colour order is explicit: :func:`align_face` returns RGB, converting once if told the input
is BGR (e.g. straight from ``cv2.imread``).
"""

from __future__ import annotations

import cv2
import numpy as np

# ArcFace / InsightFace reference points for a 112x112 crop (x, y).
ARCFACE_TEMPLATE_112 = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ],
    dtype=np.float64,
)


def umeyama_similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity transform mapping ``src`` (N, 2) onto ``dst`` (N, 2).

    Returns the 2x3 matrix ``[c·R | t]`` (apply as ``dst ≈ M[:, :2] @ p + M[:, 2]``).
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 2 or len(src) < 2:
        raise ValueError(f"need matching (N>=2, 2) point sets, got {src.shape} and {dst.shape}")
    mu_s, mu_d = src.mean(0), dst.mean(0)
    src_c, dst_c = src - mu_s, dst - mu_d
    var_s = (src_c**2).sum(1).mean()
    if var_s <= 0:
        raise ValueError("source points are all identical; no similarity transform exists")
    u, d, vt = np.linalg.svd(dst_c.T @ src_c / len(src))
    s = np.array([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])
    rotation = u @ np.diag(s) @ vt
    scale = float((d * s).sum() / var_s)
    translation = mu_d - scale * rotation @ mu_s
    return np.hstack([scale * rotation, translation[:, None]])


def apply_transform(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a 2x3 affine matrix to (N, 2) points."""
    points = np.asarray(points, dtype=np.float64)
    return points @ matrix[:, :2].T + matrix[:, 2]


def template_for_size(size: int = 112) -> np.ndarray:
    """The ArcFace template scaled to a ``size`` x ``size`` crop."""
    return ARCFACE_TEMPLATE_112 * (size / 112.0)


def align_face(
    image: np.ndarray,
    landmarks: np.ndarray,
    size: int = 112,
    input_order: str = "rgb",
    template: np.ndarray | None = None,
    border: str = "constant",
) -> np.ndarray:
    """Warp ``image`` (H, W, 3) or grey (H, W) uint8 so that ``landmarks`` (5, 2) land on the
    template.

    ``template``: (5, 2) target points in output pixels (default: the ArcFace template scaled
    to ``size``); ``input_order``: "rgb" or "bgr" (the channel order of ``image``); the result
    is RGB (or grey), ``size`` x ``size``, bilinear interpolation; ``border``: "constant"
    (black) or "replicate" (edge pixels repeated).
    """
    if input_order not in ("rgb", "bgr"):
        raise ValueError(f"input_order must be 'rgb' or 'bgr', got {input_order!r}")
    borders = {"constant": cv2.BORDER_CONSTANT, "replicate": cv2.BORDER_REPLICATE}
    if border not in borders:
        raise ValueError(f"border must be one of {sorted(borders)}, got {border!r}")
    landmarks = np.asarray(landmarks, dtype=np.float64)
    if landmarks.shape != (5, 2):
        raise ValueError(f"landmarks must be (5, 2) (x, y) points, got {landmarks.shape}")
    target = template_for_size(size) if template is None else np.asarray(template, np.float64)
    if target.shape != (5, 2):
        raise ValueError(f"template must be (5, 2) (x, y) points, got {target.shape}")
    matrix = umeyama_similarity(landmarks, target)
    warped = cv2.warpAffine(
        image, matrix, (size, size), flags=cv2.INTER_LINEAR, borderMode=borders[border]
    )
    if input_order == "bgr" and warped.ndim == 3:
        warped = cv2.cvtColor(warped, cv2.COLOR_BGR2RGB)
    return warped
