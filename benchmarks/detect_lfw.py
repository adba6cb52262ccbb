"""MTCNN on the LFW colour photos, and what alignment changes for verification.

On the pairs of ``../shared/data/lfw_dev/pairs_dev.txt`` (150x150 colour photos, one roughly
centred face each), measures on one core (one process, one thread):

* detection: share of images with at least one face, milliseconds per image, number of faces
  per image, landmark sanity (inside the box; eyes above nose above mouth; nose between the
  eyes) of the largest face;
* verification: the same pairs scored through two pipelines,
  - ``aligned``: largest MTCNN face -> ``align_face`` onto the 112x112 ArcFace template
    (a photo with no face falls back to the centre crop, counted);
  - ``centre``: the central 128x128 square resized to 112x112 (same face scale, no alignment);
  with model-free descriptors of the grey crop, so the comparison needs no trained model:
  ``pixels`` (mean-centred 32x32 pixels, cosine) and ``lbp`` (Ahonen et al., TPAMI 2006:
  8-neighbour LBP codes, 256-bin histograms on a 7x7 grid, Hellinger/cosine); and, with
  ``--model``, embeddings of that model (``Embedder.load``; grey models get grey crops).
  Accuracy: threshold chosen on the other LFW folds (10 interleaved folds when only one LFW
  fold is selected); ROC AUC too.

    python benchmarks/detect_lfw.py [--folds 1 2 3 4 5] [--model DIR] \
        [--out benchmarks/results/detect_lfw_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import cv2
import numpy as np
import torch

from partialfc.data.align import align_face
from partialfc.data.lfw import LfwImageArchive, read_lfw_pairs
from partialfc.data.loaders import shared_data_root
from partialfc.detect import largest_face, load_detector
from partialfc.eval.accuracy import kfold_accuracy
from partialfc.eval.roc import roc_auc


def landmarks_sane(face) -> bool:
    (lex, ley), (rex, rey), (nx, ny), (lmx, lmy), (rmx, rmy) = face.landmarks
    x1, y1, x2, y2 = face.box
    inside = bool(
        np.all((face.landmarks[:, 0] >= x1) & (face.landmarks[:, 0] <= x2))
        and np.all((face.landmarks[:, 1] >= y1) & (face.landmarks[:, 1] <= y2))
    )
    order = max(ley, rey) < ny < min(lmy, rmy) and lex < nx < rex and lmx < rmx
    return inside and bool(order)


def centre_crop(image: np.ndarray, side: int = 128, size: int = 112) -> np.ndarray:
    h, w = image.shape[:2]
    top, left = (h - side) // 2, (w - side) // 2
    crop = image[top : top + side, left : left + side]
    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)


def grey(images: np.ndarray) -> np.ndarray:
    return np.stack([cv2.cvtColor(im, cv2.COLOR_RGB2GRAY) for im in images])


def pixel_descriptor(grey_crops: np.ndarray) -> np.ndarray:
    small = np.stack([cv2.resize(g, (32, 32), interpolation=cv2.INTER_AREA) for g in grey_crops])
    x = small.reshape(len(small), -1).astype(np.float64)
    return x - x.mean(axis=0)


def lbp_descriptor(grey_crops: np.ndarray, grid: int = 7) -> np.ndarray:
    out = []
    for g in grey_crops.astype(np.int16):
        c = g[1:-1, 1:-1]
        code = np.zeros_like(c, dtype=np.int32)
        shifts = [(-1, -1), (-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1)]
        for bit, (dy, dx) in enumerate(shifts):
            n = g[1 + dy : g.shape[0] - 1 + dy, 1 + dx : g.shape[1] - 1 + dx]
            code |= (n >= c).astype(np.int32) << bit
        edges = np.linspace(0, code.shape[0], grid + 1).astype(int)
        hist = [
            np.bincount(code[a:b, p:q].ravel(), minlength=256)
            for a, b in zip(edges[:-1], edges[1:], strict=True)
            for p, q in zip(edges[:-1], edges[1:], strict=True)
        ]
        h = np.concatenate(hist).astype(np.float64)
        out.append(np.sqrt(h / h.sum()))
    return np.stack(out)


def cosine_scores(desc: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    d = desc / np.maximum(np.linalg.norm(desc, axis=1, keepdims=True), 1e-12)
    return np.sum(d[first] * d[second], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--model", help="optional model for embedding scores (Embedder.load)")
    parser.add_argument("--out", help="write the JSON here as well")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)

    root = shared_data_root() / "lfw_dev"
    pairs = read_lfw_pairs(root / "pairs_dev.txt")
    archive = LfwImageArchive(root / "lfw_color150_dev.zip")
    keep = np.isin(pairs.fold, args.folds)
    keys = sorted(
        {(n, int(k)) for n, k, s in zip(pairs.name1, pairs.number1, keep, strict=True) if s}
        | {(n, int(k)) for n, k, s in zip(pairs.name2, pairs.number2, keep, strict=True) if s}
    )
    index = {key: i for i, key in enumerate(keys)}
    detector = load_detector("mtcnn")
    detector.detect(np.zeros((150, 150, 3), np.uint8))  # warm-up

    aligned, centred, times, counts, sane, fallbacks = [], [], [], [], 0, 0
    for key in keys:
        image = archive.read(*key)
        start = time.perf_counter()
        faces = detector.detect(image)
        times.append(time.perf_counter() - start)
        counts.append(len(faces))
        face = largest_face(faces)
        centred.append(centre_crop(image))
        if face is None:
            fallbacks += 1
            aligned.append(centred[-1])
            continue
        sane += landmarks_sane(face)
        aligned.append(align_face(image, face.landmarks, size=112))
    counts = np.asarray(counts)
    ms = 1000 * np.asarray(times)

    sel = np.flatnonzero(keep)
    first = np.array([index[(pairs.name1[i], int(pairs.number1[i]))] for i in sel])
    second = np.array([index[(pairs.name2[i], int(pairs.number2[i]))] for i in sel])
    genuine, folds = pairs.issame[sel], pairs.fold[sel]
    if len(args.folds) == 1:  # one LFW fold: 10 interleaved folds of its matched/mismatched pairs
        folds = np.arange(len(sel)) % 10

    def score(scores: np.ndarray) -> dict:
        acc = kfold_accuracy(scores, genuine, folds=folds)
        return {
            "accuracy": round(acc.mean, 4),
            "accuracy_std": round(acc.std, 4),
            "roc_auc": round(roc_auc(scores[genuine], scores[~genuine]), 4),
        }

    crops = {"aligned": np.stack(aligned), "centre": np.stack(centred)}
    verification = {}
    for name, images in crops.items():
        g = grey(images)
        verification[name] = {
            "pixels": score(cosine_scores(pixel_descriptor(g), first, second)),
            "lbp": score(cosine_scores(lbp_descriptor(g), first, second)),
        }
    if args.model:
        from partialfc.deploy import Embedder

        embedder = Embedder.load(args.model)
        side = embedder.spec.input_size
        for name, images in crops.items():
            x = np.stack(
                [cv2.resize(im, (side, side), interpolation=cv2.INTER_AREA) for im in images]
            )
            x = grey(x) if embedder.spec.in_channels == 1 else x
            e = embedder.embed(x, flip=True)
            verification[name]["model"] = score(np.sum(e[first] * e[second], axis=1))

    result = {
        "images": len(keys),
        "pairs": int(len(sel)),
        "folds": args.folds,
        "detection": {
            "detector": "mtcnn (min_face_size 20, thresholds 0.6/0.7/0.7, factor 0.709)",
            "found": int((counts > 0).sum()),
            "rate": round(float((counts > 0).mean()), 4),
            "faces_per_image": {str(k): int((counts == k).sum()) for k in np.unique(counts)},
            "landmarks_sane": int(sane),
            "ms_per_image_median": round(float(np.median(ms)), 1),
            "ms_per_image_mean": round(float(ms.mean()), 1),
            "ms_per_image_p95": round(float(np.percentile(ms, 95)), 1),
        },
        "aligned_fallback_to_centre": fallbacks,
        "centre_crop": "central 128x128 of 150x150, resized to 112x112",
        "verification": verification,
        "model": args.model,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "threads": 1,
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
