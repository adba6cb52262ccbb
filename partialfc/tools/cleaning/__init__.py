"""Sub-center cleaning of a noisy training set (Sub-center ArcFace, Deng et al.,
ECCV 2020, §3.2).

The recipe, given a model trained with ``K`` sub-centers per class (K = 3 in the paper):

1. embed every training image (streamed to a float32 memory map on disk, so sets larger than
   memory work) and L2-normalise it;
2. for each sample, the cosine to each of its own class's K sub-centers; the sub-center it is
   closest to is its *assigned* sub-center;
3. per class, the *dominant* sub-center is the one most of its samples are assigned to;
4. every sample's angle to its class's dominant center,
   ``theta = arccos(<x/|x|, w_dom/|w_dom|>)`` in degrees; samples with ``theta > threshold``
   (75 degrees by default; the paper tested 70-85) are dropped;
5. retrain from scratch on what is kept, with one center per class (``K = 3 -> 1``).

When the true identities are known (a synthetically corrupted set), the report splits the
samples into the paper's four groups: dominant / non-dominant x clean / noisy.

Python API::

    centers, k = load_head_centers(checkpoint_dir)          # (C*K, d), from any number of shards
    emb = embed_to_memmap(backbone, dataset, "emb.f32")       # (N, d) unit rows, on disk
    cos = own_class_subcenter_cosines(emb, labels, centers, k)  # (N, K)
    result = clean_by_dominant_subcenter(cos, labels, num_classes, threshold_deg=75.0,
                                         noisy_mask=truth)
    write_report(result, out_dir); write_cleaned_set(dataset, result.keep, out_dir)

One module per job: :mod:`.rule` (the decision), :mod:`.centers` (the head's sub-centers and
the own-class cosines), :mod:`.embedding` (the set to disk), :mod:`.report`, :mod:`.writer`
(the cleaned set), :mod:`.recipe` (all of it for a checkpoint), :mod:`.command`.

Command::

    partialfc clean RUN_OR_CHECKPOINT --out cleaned/ [--threshold-deg 75]
        [--data-source npz --data-path noisy.npz] [--noisy-mask truth.npy]
"""

from .centers import load_head_centers, own_class_subcenter_cosines
from .embedding import embed_to_memmap
from .recipe import clean_checkpoint, resolve_training_checkpoint
from .report import plot_angle_histogram, write_report
from .rule import DEFAULT_THRESHOLD_DEG, CleaningResult, clean_by_dominant_subcenter
from .writer import write_cleaned_set

__all__ = [
    "DEFAULT_THRESHOLD_DEG",
    "CleaningResult",
    "clean_by_dominant_subcenter",
    "clean_checkpoint",
    "embed_to_memmap",
    "load_head_centers",
    "own_class_subcenter_cosines",
    "plot_angle_histogram",
    "resolve_training_checkpoint",
    "write_cleaned_set",
    "write_report",
]
