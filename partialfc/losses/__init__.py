"""Margin math, dense margin-softmax heads and metric-learning losses."""

from partialfc.losses.contrastive import ContrastiveLoss, ContrastiveStats
from partialfc.losses.heads import MarginSoftmaxHead, SoftmaxHead, SubcenterAssignment
from partialfc.losses.margin_softmax import margin_cross_entropy, normalized_margin_cross_entropy
from partialfc.losses.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
    angle_from_cos,
)
from partialfc.losses.penalties import inter_angular_penalty, intra_angular_penalty
from partialfc.losses.proxy_nca import ProxyNCALoss, ProxyNCAStats
from partialfc.losses.schedules import MarginRamp, MarginWarmup, ScaleRamp
from partialfc.losses.subcenter import max_over_subcenters
from partialfc.losses.triplet import TripletLoss, Triplets, TripletStats, squared_distances

__all__ = [
    "ArcFaceMargin",
    "CombinedMargin",
    "ContrastiveLoss",
    "ContrastiveStats",
    "CosFaceMargin",
    "MarginRamp",
    "MarginSoftmaxHead",
    "MarginWarmup",
    "NormFaceMargin",
    "ProxyNCALoss",
    "ProxyNCAStats",
    "ScaleRamp",
    "SoftmaxHead",
    "SphereFaceMargin",
    "SubcenterAssignment",
    "TripletLoss",
    "TripletStats",
    "Triplets",
    "angle_from_cos",
    "inter_angular_penalty",
    "intra_angular_penalty",
    "margin_cross_entropy",
    "max_over_subcenters",
    "normalized_margin_cross_entropy",
    "squared_distances",
]
