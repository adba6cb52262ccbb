"""Evaluation: verification (ROC, EER, TAR@FAR with intervals, k-fold accuracy), identification
(CMC, open-set FNIR@FPIR), templates, subgroup reports, large-scale scoring and protocols.

Plain numpy in, typed results (dataclasses with ``.to_dict()``) out; every rate carries the
counts behind it.
"""

from .accuracy import (
    AccuracyAtThreshold,
    KFoldAccuracy,
    accuracy_at_threshold,
    best_threshold,
    fold_ids,
    kfold_accuracy,
)
from .intervals import Proportion, clopper_pearson, proportion
from .roc import EqualErrorRate, RocCurve, equal_error_rate, roc_auc, roc_curve
from .tar_at_far import (
    ImpostorThreshold,
    InsufficientPairsError,
    TarAtFar,
    impostor_threshold,
    tar_at_far,
    tar_at_threshold,
    tar_at_zero_far,
)

__all__ = [
    "AccuracyAtThreshold",
    "EqualErrorRate",
    "ImpostorThreshold",
    "InsufficientPairsError",
    "KFoldAccuracy",
    "Proportion",
    "RocCurve",
    "TarAtFar",
    "accuracy_at_threshold",
    "best_threshold",
    "clopper_pearson",
    "equal_error_rate",
    "fold_ids",
    "impostor_threshold",
    "kfold_accuracy",
    "proportion",
    "roc_auc",
    "roc_curve",
    "tar_at_far",
    "tar_at_threshold",
    "tar_at_zero_far",
]
