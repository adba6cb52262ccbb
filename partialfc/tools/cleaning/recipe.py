"""The whole cleaning of a training checkpoint: embed, apply the rule, write report and set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .centers import load_head_centers, own_class_subcenter_cosines
from .embedding import embed_to_memmap
from .report import write_report
from .rule import DEFAULT_THRESHOLD_DEG, CleaningResult, clean_by_dominant_subcenter
from .writer import write_cleaned_set


def resolve_training_checkpoint(path: str | Path) -> Path:
    """A ``checkpoints/step-*`` directory, given it or a run folder (newest checkpoint)."""
    from partialfc.backbone.io import newest_checkpoint

    found = newest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no training checkpoint (model.json) found")
    return found


def clean_checkpoint(
    checkpoint: str | Path,
    dataset,
    out_dir: str | Path,
    threshold_deg: float = DEFAULT_THRESHOLD_DEG,
    noisy_mask: np.ndarray | None = None,
    clean_labels: np.ndarray | None = None,
    batch_size: int = 512,
    device: str = "cpu",
    write_set: bool = True,
) -> tuple[CleaningResult, dict]:
    """Embed ``dataset`` with the checkpoint's backbone, apply the rule with its head's
    sub-centers, write the report (and the cleaned set); return ``(result, summary)``."""
    from partialfc.backbone.io import load_backbone_from_checkpoint

    ckpt = resolve_training_checkpoint(checkpoint)
    backbone, _ = load_backbone_from_checkpoint(ckpt)
    centers, k = load_head_centers(ckpt)
    num_classes = centers.shape[0] // k
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = np.asarray(dataset.labels, dtype=np.int64)
    if noisy_mask is None and clean_labels is not None:
        noisy_mask = labels != np.asarray(clean_labels, dtype=np.int64)
    emb_path = out_dir / ".embeddings.npy"
    try:
        emb = embed_to_memmap(backbone, dataset, emb_path, batch_size, device)
        own_cos = own_class_subcenter_cosines(emb, labels, centers, k)
        del emb
    finally:
        emb_path.unlink(missing_ok=True)
    result = clean_by_dominant_subcenter(own_cos, labels, num_classes, threshold_deg, noisy_mask)
    summary = write_report(result, out_dir, extra={"checkpoint": str(ckpt)})
    if write_set:
        summary["cleaned_set"] = str(write_cleaned_set(dataset, result.keep, out_dir, clean_labels))
    return result, summary
