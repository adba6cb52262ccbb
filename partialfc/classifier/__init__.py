"""Partial FC: class-sharded, sampled margin-softmax classifier with row-sparse optimizers.

See :mod:`partialfc.classifier.partial_fc` for the semantics and gradient conventions.
"""

from partialfc.classifier.checkpoint import (
    gather_full_centers,
    load_partial_fc_checkpoint,
    save_partial_fc_checkpoint,
)
from partialfc.classifier.optim import RowSparseAdamW, RowSparseOptimizer, RowSparseSGD
from partialfc.classifier.partial_fc import ActiveRows, PartialFC, init_center_rows
from partialfc.classifier.sampling import sample_active_classes, sampling_budget
from partialfc.classifier.sharding import ClassBlock, class_block, class_blocks

__all__ = [
    "PartialFC",
    "ActiveRows",
    "RowSparseSGD",
    "RowSparseAdamW",
    "RowSparseOptimizer",
    "init_center_rows",
    "save_partial_fc_checkpoint",
    "load_partial_fc_checkpoint",
    "gather_full_centers",
    "ClassBlock",
    "class_block",
    "class_blocks",
    "sample_active_classes",
    "sampling_budget",
]
