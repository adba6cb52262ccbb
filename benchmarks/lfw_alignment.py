"""How well the LFW recipe's landmark alignment frames faces (numbers for docs/face_recipe.md).

    python benchmarks/lfw_alignment.py --out benchmarks/results/lfw_alignment.json \
        [--photos 300] [--model runs/lfw_dev_final_bf16/export]

* ``frame``: the mean MTCNN landmarks of the grey crops of the training folds 0-3 (what
  ``GREY_FRAME_LANDMARKS`` holds), how many crops have a face, the per-coordinate spread;
* ``renderings``: for the first ``--photos`` photos present in both the grey and the colour set,
  the normalised cross-correlation of the two renderings (centred crop vs grey crop, and both
  aligned), and the re-detected landmarks' mean distance from the frame before and after;
* ``direct_alignment`` (with ``--model``, an aligned export): pixels and embeddings of the
  recipe's path (align at 96×96, area-resize) against ``align_face`` straight at the input size
  with the spec's ``alignment_landmarks``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _recipe():
    """The recipe module (``experiments/`` is a folder of scripts, not a package)."""
    sys.path.insert(0, str(REPO / "experiments"))
    import lfw_face_recipe

    return lfw_face_recipe


def frame_stats(R, root: Path) -> dict:
    from partialfc.data.loaders import load_lfw_gray

    points = []
    total = 0
    for part in ("dev", "extra"):
        faces = load_lfw_gray(root, part=part)
        fold = np.asarray(faces.identity_fold)[faces.labels]
        crops = faces.images[fold <= 3]
        total += len(crops)
        landmarks, found = R.face_landmarks(crops, pad=R.GREY_DETECT_PAD)
        points.append(landmarks[found])
    points = np.concatenate(points)
    return {
        "grey_crops": total,
        "faces_found": len(points),
        "mean_landmarks_px": np.round(points.mean(0).astype(np.float64), 2).tolist(),
        "per_coordinate_sd_px": float(points.std(0).mean()),
    }


def rendering_stats(R, root: Path, limit: int):
    from partialfc.data import LfwImageArchive
    from partialfc.data.loaders import load_lfw_gray

    grey_set = load_lfw_gray(root, part="dev")
    archive = LfwImageArchive(root / "lfw_color150_dev.zip")
    row = {name: i for i, name in enumerate(grey_set.image_names)}
    both = [i for i in archive.image_ids() if i in row][:limit]
    grey = np.stack([grey_set.images[row[i]] for i in both])
    photos = [archive.read(*i.rsplit("_", 1)) for i in both]
    centred = R.colour_photos_to_grey(photos, align=False)
    aligned_colour = R.colour_photos_to_grey(photos, align=True)
    aligned_grey, found = R.align_grey_crops(grey)
    ncc = R.normalised_cross_correlation
    before = [ncc(c, g) for c, g in zip(centred, grey, strict=True)]
    after = [ncc(c, g) for c, g in zip(aligned_colour, aligned_grey, strict=True)]
    raw, ok_raw = R.face_landmarks(grey, pad=R.GREY_DETECT_PAD)
    new, ok_new = R.face_landmarks(aligned_grey, pad=R.GREY_DETECT_PAD)
    ok = ok_raw & ok_new

    def distance(points):
        return float(np.linalg.norm(points[ok] - R.GREY_FRAME_LANDMARKS, axis=2).mean())

    stats = {
        "photos": len(both),
        "grey_faces_found": found,
        "ncc_centred_vs_grey": {"mean": float(np.mean(before)), "min": float(np.min(before))},
        "ncc_aligned_vs_aligned": {"mean": float(np.mean(after)), "min": float(np.min(after))},
        "landmark_distance_to_frame_px": {"before": distance(raw), "after": distance(new)},
    }
    return stats, photos


def direct_alignment(R, photos, model: str) -> dict:
    import cv2

    from partialfc.data.align import align_face
    from partialfc.deploy import Embedder

    embedder = Embedder.load(model)
    frame = embedder.spec.alignment_landmarks
    if frame is None:
        raise ValueError(f"{model}: its preprocessing spec states no alignment_landmarks")
    size = embedder.spec.input_size[0]
    landmarks, found = R.face_landmarks(photos)
    photos = [p for p, ok in zip(photos, found, strict=True) if ok]
    landmarks = landmarks[found]
    recipe_path = R.resize_to(
        np.stack([R.align_to_grey_frame(p, lm) for p, lm in zip(photos, landmarks, strict=True)]),
        size,
    )
    direct = np.stack(
        [
            align_face(
                cv2.cvtColor(p, cv2.COLOR_RGB2GRAY),
                lm,
                size=size,
                template=frame,
                border="replicate",
            )  # fmt: skip
            for p, lm in zip(photos, landmarks, strict=True)
        ]
    )
    a, b = embedder.embed(recipe_path, flip=True), embedder.embed(direct, flip=True)
    same = (a * b).sum(1)
    others = a @ a.T
    n = len(a)
    return {
        "model": model,
        "photos": n,
        "pixel_mean_abs_difference": float(np.abs(recipe_path.astype(int) - direct).mean()),
        "cosine_same_photo": {"min": float(same.min()), "mean": float(same.mean())},
        "cosine_other_photos_mean": float((others.sum() - np.trace(others)) / (n * (n - 1))),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="the lfw_dev folder (default: ../shared/data/lfw_dev)")
    parser.add_argument("--photos", type=int, default=300, help="photos in both sets to compare")
    parser.add_argument("--model", help="an aligned export to compare the two alignment paths")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    R = _recipe()
    from partialfc.data.loaders import shared_data_root

    root = Path(args.root) if args.root else shared_data_root() / "lfw_dev"
    result = {"frame": frame_stats(R, root)}
    result["renderings"], photos = rendering_stats(R, root, args.photos)
    if args.model:
        result["direct_alignment"] = direct_alignment(R, photos[:30], args.model)
    from partialfc.atomic import atomic_write_bytes

    atomic_write_bytes(Path(args.out), (json.dumps(result, indent=1) + "\n").encode())
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
