"""A trained model's LFW pair accuracy with aligned crops vs centre crops of the same photos.

On the LFW pairs of the selected folds of ``pairs_dev.txt`` (default folds 4-5, the people the
LFW recipe of ``configs/lfw_dev_val.yaml`` never trains on) and the 150x150 colour photos of
``lfw_color150_dev.zip`` (``../shared/data/lfw_dev``), every photo becomes a model input twice:

* ``aligned``: the largest MTCNN face (Zhang et al., IEEE SPL 2016) warped onto the ArcFace
  112x112 template by its 5 landmarks (``align_face``; Umeyama's similarity), then resized to
  the model's input side (area filter); a photo without a face falls back to its centre crop
  (counted in ``aligned_fallback_to_centre``);
* ``centre``: the centred square of ``--centre-side`` pixels (default 116: the framing of the
  grey crops the LFW recipe trains on), resized to the model's input side (area filter).

Grey models get BT.601 luma of either crop. Each pair is scored by the cosine of the
(flip-test, unless ``--no-flip``) embeddings; accuracy uses LFW's protocol on the selected
folds (threshold chosen on the other folds; 10 interleaved folds when one fold is selected),
with ROC AUC. A model trained on centre crops sees aligned crops only at test time, so its
``aligned`` score measures a pipeline change at inference; comparing the pipelines for
training too needs one model trained on each.

    python benchmarks/aligned_vs_centre_crop.py --model runs/lfw_dev_val \\
        [--folds 4 5] [--centre-side 116] [--pairs-per-fold N] [--scores] \\
        [--out benchmarks/results/aligned_vs_centre_crop.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from partialfc.backbone.embedder import Embedder
from partialfc.data.align import align_face
from partialfc.data.lfw import LfwImageArchive, read_lfw_pairs
from partialfc.data.loaders import shared_data_root
from partialfc.detect import largest_face, load_detector
from partialfc.eval.accuracy import kfold_accuracy
from partialfc.eval.roc import roc_auc

PIPELINES = ("aligned", "centre")


def centre_crop(image: np.ndarray, side: int, size: int) -> np.ndarray:
    """The centred ``side`` x ``side`` square of ``image``, resized to ``size`` (area)."""
    h, w = image.shape[:2]
    if side > min(h, w):
        raise ValueError(f"--centre-side {side} is larger than the {w}x{h} photos")
    top, left = (h - side) // 2, (w - side) // 2
    crop = image[top : top + side, left : left + side]
    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)


def aligned_crop(image: np.ndarray, landmarks: np.ndarray, size: int) -> np.ndarray:
    """``align_face`` at 112 x 112, resized to ``size`` (area) when the model differs."""
    crop = align_face(image, landmarks, size=112)
    if size != 112:
        crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    return crop


def to_model_channels(images: np.ndarray, channels: int) -> np.ndarray:
    if channels == 3:
        return images
    return np.stack([cv2.cvtColor(im, cv2.COLOR_RGB2GRAY) for im in images])


def select_pairs(pairs, folds: list[int], per_fold: int | None) -> np.ndarray:
    """Indices of the pairs of ``folds``; with ``per_fold``, the first ``per_fold // 2``
    genuine and impostor pairs of each fold (file order)."""
    keep = []
    for fold in folds:
        in_fold = np.flatnonzero(pairs.fold == fold)
        if in_fold.size == 0:
            raise ValueError(f"--folds: fold {fold} has no pairs")
        if per_fold is None:
            keep.append(in_fold)
            continue
        genuine = in_fold[pairs.issame[in_fold]][: per_fold // 2]
        impostor = in_fold[~pairs.issame[in_fold]][: per_fold // 2]
        keep.append(np.sort(np.concatenate([genuine, impostor])))
    return np.concatenate(keep)


def measure(args: argparse.Namespace) -> dict:
    root = Path(args.data_root) if args.data_root else shared_data_root() / "lfw_dev"
    pairs = read_lfw_pairs(root / "pairs_dev.txt")
    archive = LfwImageArchive(root / "lfw_color150_dev.zip")
    selected = select_pairs(pairs, args.folds, args.pairs_per_fold)
    embedder = Embedder.load(args.model, backend=args.backend)
    height, width = embedder.spec.input_size
    if height != width:
        raise ValueError(f"{args.model}: input {height}x{width}; square model inputs only")
    channels = embedder.spec.in_channels

    first_keys = [(pairs.name1[i], int(pairs.number1[i])) for i in selected]
    second_keys = [(pairs.name2[i], int(pairs.number2[i])) for i in selected]
    keys = sorted(set(first_keys) | set(second_keys))
    index = {key: i for i, key in enumerate(keys)}
    detector = load_detector("mtcnn")
    crops = {name: [] for name in PIPELINES}
    fallbacks, start = [], time.perf_counter()
    for name, number in keys:
        image = archive.read(name, number)
        centred = centre_crop(image, args.centre_side, width)
        face = largest_face(detector.detect(image))
        if face is None:
            fallbacks.append(f"{name}_{number:04d}")
        crops["centre"].append(centred)
        crops["aligned"].append(
            centred if face is None else aligned_crop(image, face.landmarks, width)
        )
    seconds_crops = time.perf_counter() - start

    first = np.array([index[k] for k in first_keys])
    second = np.array([index[k] for k in second_keys])
    genuine = pairs.issame[selected]
    folds = pairs.fold[selected] if len(args.folds) > 1 else np.arange(len(selected)) % 10
    pipelines, scores = {}, {}
    start = time.perf_counter()
    for name in PIPELINES:
        x = to_model_channels(np.stack(crops[name]), channels)
        e = embedder.embed(x, flip=not args.no_flip)
        s = np.sum(e[first] * e[second], axis=1).astype(np.float64)
        acc = kfold_accuracy(s, genuine, folds=folds)
        pipelines[name] = {
            "accuracy": round(float(acc.mean), 4),
            "accuracy_std": round(float(acc.std), 4),
            "roc_auc": round(float(roc_auc(s[genuine], s[~genuine])), 4),
        }
        scores[name] = s
    seconds_embed = time.perf_counter() - start

    result = {
        "model": str(args.model),
        "model_sha256": embedder.model_sha256,
        "model_input": {"side": width, "channels": channels},
        "data": str(root),
        "folds": args.folds,
        "pairs": int(len(selected)),
        "genuine_pairs": int(genuine.sum()),
        "images": len(keys),
        "flip_test": not args.no_flip,
        "aligned": "largest MTCNN face -> align_face 112x112 (ArcFace template) -> area resize",
        "centre": f"centred {args.centre_side}x{args.centre_side} square -> area resize",
        "aligned_fallback_to_centre": fallbacks,
        "pipelines": pipelines,
        "aligned_minus_centre_accuracy": round(
            pipelines["aligned"]["accuracy"] - pipelines["centre"]["accuracy"], 4
        ),
        "seconds": {"detect_and_crop": round(seconds_crops, 1), "embed": round(seconds_embed, 1)},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average_1min": round(os.getloadavg()[0], 2),
        },
    }
    if args.scores:
        result["pair_scores"] = {k: [round(float(v), 6) for v in s] for k, s in scores.items()}
        result["pair_indices"] = selected.tolist()  # rows of pairs_dev.txt after its header
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="trained model (Embedder.load)")
    parser.add_argument("--backend", choices=("auto", "torch", "onnx"), default="auto")
    parser.add_argument("--folds", type=int, nargs="+", default=[4, 5])
    parser.add_argument("--data-root", help="the lfw_dev folder (default: the shared data)")
    parser.add_argument("--centre-side", type=int, default=116, help="centre crop side, px")
    parser.add_argument("--pairs-per-fold", type=int, help="first N/2 genuine + N/2 impostor")
    parser.add_argument("--no-flip", action="store_true", help="no flip test")
    parser.add_argument("--scores", action="store_true", help="add every pair's scores")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="write the JSON here as well")
    args = parser.parse_args(argv)
    if args.centre_side < 1 or (args.pairs_per_fold is not None and args.pairs_per_fold < 2):
        parser.error("--centre-side must be >= 1 and --pairs-per-fold >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(1)
    try:
        result = measure(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"aligned_vs_centre_crop: {err}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(Path(args.out), (text + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
