"""Input checks shared by the metric functions (clear errors that name the argument)."""

from __future__ import annotations

import numpy as np


def as_scores(values, name: str, allow_empty: bool = False) -> np.ndarray:
    """A 1-D float64 array of finite scores; raises ValueError naming ``name`` otherwise."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        arr = arr.reshape(-1) if arr.ndim == 0 else arr
        if arr.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} non-finite value(s)")
    return arr


def as_bool(values, name: str, size: int | None = None) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype != bool:
        if not np.all(np.isin(arr, (0, 1))):
            raise ValueError(f"{name} must be boolean (or 0/1)")
        arr = arr.astype(bool)
    arr = arr.reshape(-1)
    if size is not None and arr.size != size:
        raise ValueError(f"{name} has {arr.size} entries, expected {size}")
    return arr


def split_scores(scores, is_genuine) -> tuple[np.ndarray, np.ndarray]:
    """(genuine, impostor) scores from one score array and a boolean same-identity mask."""
    s = as_scores(scores, "scores")
    g = as_bool(is_genuine, "is_genuine", s.size)
    return s[g], s[~g]
