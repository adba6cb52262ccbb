"""Sub-center cleaning of a noisy training set (Sub-center ArcFace, Deng et al.,
ECCV 2020).

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

Command::

    partialfc clean RUN_OR_CHECKPOINT --out cleaned/ [--threshold-deg 75]
        [--data-source npz --data-path noisy.npz] [--noisy-mask truth.npy]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from partialfc.atomic import atomic_output, atomic_write_bytes

DEFAULT_THRESHOLD_DEG = 75.0


# ---------------------------------------------------------------------------- the decision


@dataclass
class CleaningResult:
    """Per-sample outcome of the cleaning rule (arrays have one entry per sample, N).

    labels: int64 training labels.
    assigned_subcenter: int64, the sub-center of its own class each sample is closest to.
    dominant_subcenter: int64 (C,), per class the most-assigned sub-center (-1: empty class).
    is_dominant: bool, ``assigned_subcenter == dominant_subcenter[label]``.
    angle_deg: float32, angle to the dominant center of its own class, degrees.
    keep: bool, ``angle_deg <= threshold_deg``.
    noisy_mask: bool ground truth (True = wrong label), or None when unknown.
    """

    labels: np.ndarray
    assigned_subcenter: np.ndarray
    dominant_subcenter: np.ndarray
    is_dominant: np.ndarray
    angle_deg: np.ndarray
    keep: np.ndarray
    threshold_deg: float
    num_subcenters: int
    noisy_mask: np.ndarray | None = None

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def groups(self) -> dict[str, int]:
        """Sample counts: dominant / non-dominant (x clean / noisy when ground truth is known)."""
        dom = self.is_dominant
        if self.noisy_mask is None:
            return {"dominant": int(dom.sum()), "non_dominant": int((~dom).sum())}
        noisy = self.noisy_mask
        return {
            "dominant_clean": int((dom & ~noisy).sum()),
            "dominant_noisy": int((dom & noisy).sum()),
            "non_dominant_clean": int((~dom & ~noisy).sum()),
            "non_dominant_noisy": int((~dom & noisy).sum()),
        }

    def removal_quality(self) -> dict[str, float] | None:
        """Against the ground truth: how many removed samples were noisy (precision), how many
        noisy samples were removed (recall), and the noise rate before and after."""
        if self.noisy_mask is None:
            return None
        removed, noisy = ~self.keep, self.noisy_mask
        hits = int((removed & noisy).sum())
        return {
            "removed": int(removed.sum()),
            "removed_noisy": hits,
            "precision": hits / max(int(removed.sum()), 1),
            "recall": hits / max(int(noisy.sum()), 1),
            "noise_rate_before": float(noisy.mean()) if noisy.size else 0.0,
            "noise_rate_after": float(noisy[self.keep].mean()) if self.keep.any() else 0.0,
        }

    def per_class(self) -> dict[str, np.ndarray]:
        """Per class: samples, kept, assigned to the dominant sub-center, and the dominant index."""
        c = len(self.dominant_subcenter)
        return {
            "samples": np.bincount(self.labels, minlength=c),
            "kept": np.bincount(self.labels[self.keep], minlength=c),
            "dominant_assigned": np.bincount(self.labels[self.is_dominant], minlength=c),
            "dominant_subcenter": self.dominant_subcenter,
        }

    def summary(self) -> dict:
        per_class = self.per_class()
        kept_per_class = per_class["kept"][per_class["samples"] > 0]
        out = {
            "samples": self.num_samples,
            "kept": int(self.keep.sum()),
            "removed": int((~self.keep).sum()),
            "threshold_deg": self.threshold_deg,
            "num_subcenters": self.num_subcenters,
            "classes": int(len(self.dominant_subcenter)),
            "classes_emptied": int((kept_per_class == 0).sum()),
            "groups": self.groups(),
            "angle_deg_quantiles": {
                str(q): float(np.quantile(self.angle_deg, q)) if self.num_samples else 0.0
                for q in (0.05, 0.25, 0.5, 0.75, 0.95)
            },
        }
        quality = self.removal_quality()
        if quality is not None:
            out["removal_vs_ground_truth"] = quality
        return out


def clean_by_dominant_subcenter(
    own_cos: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    threshold_deg: float = DEFAULT_THRESHOLD_DEG,
    noisy_mask: np.ndarray | None = None,
) -> CleaningResult:
    """Apply the rule to ``own_cos`` (N, K): cosines of each sample to its own class's K
    sub-centers (see :func:`own_class_subcenter_cosines`).

    Ties in the per-class vote go to the lowest sub-center index (``np.argmax``).
    """
    own_cos = np.asarray(own_cos, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    if own_cos.ndim != 2 or own_cos.shape[0] != labels.shape[0]:
        raise ValueError(
            f"own_cos must be (N, K) with N = len(labels) = {labels.shape[0]}, got {own_cos.shape}"
        )
    if not 0.0 < threshold_deg <= 180.0:
        raise ValueError(f"threshold_deg must be in (0, 180], got {threshold_deg}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes})")
    if noisy_mask is not None:
        noisy_mask = np.asarray(noisy_mask, dtype=bool)
        if noisy_mask.shape != labels.shape:
            raise ValueError(f"noisy_mask has shape {noisy_mask.shape}, labels {labels.shape}")
    k = own_cos.shape[1]
    assigned = own_cos.argmax(axis=1).astype(np.int64)
    votes = np.zeros((num_classes, k), dtype=np.int64)
    np.add.at(votes, (labels, assigned), 1)
    dominant = votes.argmax(axis=1).astype(np.int64)
    dominant[votes.sum(axis=1) == 0] = -1
    dom_of_sample = dominant[labels]
    cos_dom = own_cos[np.arange(len(labels)), dom_of_sample] if labels.size else own_cos[:, 0]
    from partialfc.losses.margins import angle_from_cos

    angle = torch.rad2deg(angle_from_cos(torch.from_numpy(np.ascontiguousarray(cos_dom))))
    angle_deg = angle.numpy().astype(np.float32)
    return CleaningResult(
        labels=labels,
        assigned_subcenter=assigned,
        dominant_subcenter=dominant,
        is_dominant=assigned == dom_of_sample,
        angle_deg=angle_deg,
        keep=angle_deg <= threshold_deg,
        threshold_deg=float(threshold_deg),
        num_subcenters=k,
        noisy_mask=noisy_mask,
    )


# ---------------------------------------------------------------------------- embeddings


def load_head_centers(checkpoint: str | Path) -> tuple[torch.Tensor, int]:
    """``(centers (C*K, d) float32, K)`` from a Partial FC checkpoint directory (the ``head``
    folder of a training checkpoint, or the training checkpoint itself), whatever number of
    shards it was written with: the shards are resharded into one block by the classifier's own
    loader and gathered with :func:`partialfc.classifier.gather_full_centers`."""
    from partialfc.classifier import PartialFC, gather_full_centers, load_partial_fc_checkpoint
    from partialfc.losses.margins import NormFaceMargin

    path = Path(checkpoint)
    head_dir = path / "head" if (path / "head" / "manifest.json").is_file() else path
    manifest_path = head_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{checkpoint}: no Partial FC head (manifest.json) found")
    manifest = json.loads(manifest_path.read_text())
    try:
        num_classes = int(manifest["num_classes"])
        dim = int(manifest["embedding_dim"])
        k = int(manifest["num_subcenters"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{manifest_path}: incomplete manifest ({err})") from None
    head = PartialFC(num_classes, dim, NormFaceMargin(), num_subcenters=k, init_std=0.0)
    load_partial_fc_checkpoint(head_dir, head)
    return gather_full_centers(head), k


def resolve_training_checkpoint(path: str | Path) -> Path:
    """A ``checkpoints/step-*`` directory, given it or a run folder (newest checkpoint)."""
    from partialfc.backbone.io import newest_checkpoint

    found = newest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no training checkpoint (model.json) found")
    return found


@torch.no_grad()
def embed_to_memmap(
    backbone: torch.nn.Module,
    dataset,
    path: str | Path,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
) -> np.memmap:
    """Embed ``dataset`` (yielding ``(uint8 C×H×W, label, ...)``) into an (N, d) float32 memory
    map at ``path``, rows L2-normalised; only one batch is in memory at a time."""
    from partialfc.backbone.embedding import run_backbone

    device = torch.device(device)
    backbone.to(device)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers
    )
    out = None
    row = 0
    for e in run_backbone(backbone, (batch[0] for batch in loader), device):
        e = torch.nn.functional.normalize(e, dim=1).numpy()
        if out is None:
            out = np.lib.format.open_memmap(
                path, mode="w+", dtype=np.float32, shape=(len(dataset), e.shape[1])
            )
        out[row : row + len(e)] = e
        row += len(e)
    if out is None:
        raise ValueError("embed_to_memmap: the dataset is empty")
    out.flush()
    return out


def own_class_subcenter_cosines(
    embeddings: np.ndarray,
    labels: np.ndarray,
    centers: torch.Tensor,
    num_subcenters: int,
    chunk: int = 65536,
) -> np.ndarray:
    """``(N, K)`` cosines of each (unit) embedding to the K sub-centers of its own class.

    ``centers`` is class-major ``(C*K, d)``; only the K rows of each sample's class are read, so
    the cost is O(N·K·d) whatever the number of classes. Embeddings are read in chunks (a
    memory map stays on disk)."""
    k = int(num_subcenters)
    labels = np.asarray(labels, dtype=np.int64)
    c = centers.shape[0] // k
    if centers.shape[0] != c * k:
        raise ValueError(f"centers have {centers.shape[0]} rows, not a multiple of K={k}")
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        raise ValueError(f"labels outside [0, {c}): the head has {c} classes")
    w = torch.nn.functional.normalize(centers.float(), dim=1).reshape(c, k, -1)
    out = np.empty((len(labels), k), dtype=np.float32)
    for start in range(0, len(labels), chunk):
        x = torch.from_numpy(np.ascontiguousarray(embeddings[start : start + chunk]))
        x = torch.nn.functional.normalize(x.float(), dim=1)
        y = torch.from_numpy(labels[start : start + chunk])
        out[start : start + len(x)] = torch.einsum("nd,nkd->nk", x, w[y]).numpy()
    return out


# ---------------------------------------------------------------------------- outputs


def plot_angle_histogram(result: CleaningResult, path: str | Path) -> Path:
    """PNG histogram of the angle to the dominant center, one colour per group, with the
    threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    bins = np.linspace(0.0, 180.0, 91)
    fig, ax = plt.subplots(figsize=(7, 4))
    dom = result.is_dominant
    if result.noisy_mask is None:
        parts = [("dominant", dom), ("non-dominant", ~dom)]
    else:
        noisy = result.noisy_mask
        parts = [
            ("dominant, clean", dom & ~noisy),
            ("dominant, noisy", dom & noisy),
            ("non-dominant, clean", ~dom & ~noisy),
            ("non-dominant, noisy", ~dom & noisy),
        ]
    ax.hist(
        [result.angle_deg[m] for _, m in parts],
        bins=bins,
        stacked=True,
        label=[f"{name} ({int(m.sum())})" for name, m in parts],
    )
    ax.axvline(result.threshold_deg, color="k", linestyle="--", label="threshold")
    ax.set_xlabel("angle to the dominant sub-center of the labelled class (degrees)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path


def write_report(result: CleaningResult, out_dir: str | Path, extra: dict | None = None) -> dict:
    """``report.json`` (summary + ``extra``), ``per_class.csv`` and ``angles.png`` in
    ``out_dir``; returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**result.summary(), **(extra or {})}
    atomic_write_bytes(out_dir / "report.json", json.dumps(summary, indent=2).encode())
    per_class = result.per_class()
    lines = ["class,samples,kept,dominant_assigned,dominant_subcenter"]
    for c in range(len(result.dominant_subcenter)):
        lines.append(",".join([str(c), *(str(int(per_class[key][c])) for key in per_class)]))
    atomic_write_bytes(out_dir / "per_class.csv", ("\n".join(lines) + "\n").encode())
    plot_angle_histogram(result, out_dir / "angles.png")
    return summary


def write_cleaned_set(dataset, keep: np.ndarray, out_dir: str | Path, clean_labels=None) -> Path:
    """Write the kept samples, in the input's own format, to ``out_dir``.

    * images in memory (``ArrayDataset``-like: ``.images``): ``cleaned.npz`` with ``images``,
      ``labels``, ``indices`` (positions in the input) [, ``clean_labels``];
    * RecordIO: ``cleaned.rec`` + ``cleaned.idx`` with the kept records copied byte for byte
      (labels in their headers; no InsightFace header record);

    and, for any input, ``kept.lst`` with one ``index<TAB>label`` line per kept sample.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keep = np.asarray(keep, dtype=bool)
    labels = np.asarray(dataset.labels, dtype=np.int64)
    if keep.shape != labels.shape:
        raise ValueError(f"keep has shape {keep.shape} for a set of {labels.shape[0]} samples")
    indices = np.flatnonzero(keep)
    text = "".join(f"{i}\t{labels[i]}\n" for i in indices)
    atomic_write_bytes(out_dir / "kept.lst", text.encode())
    if hasattr(dataset, "images"):
        arrays = {
            "images": np.asarray(dataset.images)[indices],
            "labels": labels[indices],
            "indices": indices.astype(np.int64),
        }
        if clean_labels is not None:
            arrays["clean_labels"] = np.asarray(clean_labels, dtype=np.int64)[indices]
        with atomic_output(out_dir / "cleaned.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return out_dir / "cleaned.npz"
    if hasattr(dataset, "reader") and hasattr(dataset, "keys"):
        from partialfc.data.recordio import RecordIOWriter

        with RecordIOWriter(out_dir / "cleaned.rec") as writer:
            for new_key, i in enumerate(indices, start=1):
                writer.write(new_key, bytes(dataset.reader.payload(int(dataset.keys[i]))))
        return out_dir / "cleaned.rec"
    return out_dir / "kept.lst"


# ---------------------------------------------------------------------------- the whole recipe


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


# ---------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("checkpoint", help="run folder or checkpoints/step-* of a K>1 run")
    parser.add_argument("--out", required=True, help="output folder (report + cleaned set)")
    parser.add_argument(
        "--threshold-deg",
        type=float,
        default=DEFAULT_THRESHOLD_DEG,
        help="drop samples farther than this from their class's dominant sub-center (75)",
    )
    parser.add_argument(
        "--data-source",
        choices=("omniglot", "npz", "recordio", "folder"),
        default=None,
        help="training set; default: the one in the checkpoint's config",
    )
    parser.add_argument("--data-path", default=None, help="path for --data-source")
    parser.add_argument(
        "--noisy-mask",
        default=None,
        help=".npy bool array (True = wrong label) for the four-group report; an .npz training "
        "set with a 'clean_labels' array provides it by itself",
    )
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--device", default="cpu")


def _training_set(args, ckpt: Path):
    from partialfc.train.config import config_from_dict
    from partialfc.train.data import build_train_set

    meta = json.loads((ckpt / "meta.json").read_text()) if (ckpt / "meta.json").is_file() else {}
    cfg = config_from_dict(meta.get("config", {}), str(ckpt / "meta.json"))
    if args.data_source:
        cfg.data.source = args.data_source
        cfg.data.path = args.data_path or ""
    elif args.data_path:
        cfg.data.path = args.data_path
    return build_train_set(cfg.data), cfg.data


def run(args: argparse.Namespace) -> int:
    from partialfc.ranges import Range, check_options

    try:
        check_options(
            args,
            {
                "--batch-size": Range(1, integer=True),
                "--threshold-deg": Range(0, 180, low_open=True),
            },
        )
        ckpt = resolve_training_checkpoint(args.checkpoint)
        dataset, data_cfg = _training_set(args, ckpt)
        noisy_mask = clean_labels = None
        if args.noisy_mask:
            noisy_mask = np.load(args.noisy_mask, allow_pickle=False)
        elif data_cfg.source == "npz":
            with np.load(data_cfg.path, allow_pickle=False) as arrays:
                if "clean_labels" in arrays.files:
                    clean_labels = arrays["clean_labels"]
        result, summary = clean_checkpoint(
            ckpt,
            dataset,
            args.out,
            threshold_deg=args.threshold_deg,
            noisy_mask=noisy_mask,
            clean_labels=clean_labels,
            batch_size=args.batch_size,
            device=args.device,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"partialfc clean: {err}", file=sys.stderr)
        return 1
    print(
        f"kept {summary['kept']} of {summary['samples']} samples "
        f"(threshold {summary['threshold_deg']:g} deg); groups {summary['groups']}"
    )
    quality = summary.get("removal_vs_ground_truth")
    if quality:
        from partialfc.eval.intervals import percent

        print(
            f"removed {quality['removed']}: precision {quality['precision']:.3f}, recall "
            f"{quality['recall']:.3f}; noise {percent(quality['noise_rate_before'])} -> "
            f"{percent(quality['noise_rate_after'])}"
        )
    print(f"report: {Path(args.out) / 'report.json'}; set: {summary.get('cleaned_set')}")
    return 0
