"""Margin math, dense margin-softmax heads and metric-learning losses."""

from partialfc.losses.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
)
from partialfc.losses.subcenter import max_over_subcenters

__all__ = [
    "ArcFaceMargin",
    "CombinedMargin",
    "CosFaceMargin",
    "NormFaceMargin",
    "SphereFaceMargin",
    "max_over_subcenters",
]
