"""Evaluation: verification (ROC, EER, TAR@FAR with intervals, k-fold accuracy), identification
(CMC, open-set FNIR@FPIR), templates, subgroup reports, large-scale scoring and protocols.

Plain numpy in, typed results (dataclasses with ``.to_dict()``) out; every rate carries the
counts behind it.
"""

from partialfc.backbone.embedding import flip_horizontal

from .accuracy import (
    AccuracyAtThreshold,
    KFoldAccuracy,
    accuracy_at_threshold,
    best_threshold,
    fold_ids,
    kfold_accuracy,
)
from .embedding import (
    embed_images,
    l2_normalize,
    resize_images,
    with_input_size,
)
from .evaluate import evaluate_model
from .identification import (
    CmcCurve,
    MatedSearch,
    OpenSetPoint,
    cmc,
    cmc_from_ranks,
    mated_search,
    open_set_identification,
    ranks_from_neighbors,
)
from .intervals import Proportion, clopper_pearson, proportion
from .pair_scoring import PairScoreSummary, count_scores_at_least, score_all_pairs
from .paired import (
    PairedAccuracyComparison,
    compare_kfold_accuracy,
    correct_at_carried_threshold,
    mcnemar_exact_p,
)
from .report_writer import write_report
from .reports import (
    IdentificationReport,
    VerificationReport,
    identification_report,
    verification_report,
)
from .roc import EqualErrorRate, RocCurve, equal_error_rate, roc_auc, roc_curve
from .search import ExactSearch, GallerySearch, HNSWSearch, IVFSearch
from .subgroups import GroupRates, SubgroupReport, subgroup_report
from .tar_at_far import (
    ImpostorThreshold,
    InsufficientPairsError,
    TarAtFar,
    impostor_threshold,
    tar_at_far,
    tar_at_threshold,
    tar_at_zero_far,
)
from .templates import pool_media_templates, pool_templates

__all__ = [
    "AccuracyAtThreshold",
    "CmcCurve",
    "EqualErrorRate",
    "ExactSearch",
    "GallerySearch",
    "GroupRates",
    "HNSWSearch",
    "IVFSearch",
    "IdentificationReport",
    "ImpostorThreshold",
    "InsufficientPairsError",
    "KFoldAccuracy",
    "MatedSearch",
    "OpenSetPoint",
    "PairScoreSummary",
    "PairedAccuracyComparison",
    "Proportion",
    "RocCurve",
    "SubgroupReport",
    "TarAtFar",
    "VerificationReport",
    "accuracy_at_threshold",
    "best_threshold",
    "clopper_pearson",
    "cmc",
    "cmc_from_ranks",
    "compare_kfold_accuracy",
    "correct_at_carried_threshold",
    "count_scores_at_least",
    "embed_images",
    "equal_error_rate",
    "evaluate_model",
    "flip_horizontal",
    "fold_ids",
    "identification_report",
    "impostor_threshold",
    "kfold_accuracy",
    "l2_normalize",
    "mated_search",
    "mcnemar_exact_p",
    "open_set_identification",
    "pool_media_templates",
    "pool_templates",
    "proportion",
    "ranks_from_neighbors",
    "resize_images",
    "roc_auc",
    "roc_curve",
    "score_all_pairs",
    "subgroup_report",
    "tar_at_far",
    "tar_at_threshold",
    "tar_at_zero_far",
    "with_input_size",
    "verification_report",
    "write_report",
]
