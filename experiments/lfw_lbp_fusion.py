"""The LBP + WCCN descriptor on the LFW recipe's split: its settings, and its fusion with models.

    python -m experiments.lfw_lbp_fusion --config configs/lfw_dev_val.yaml \\
        --components 800,1200,1600,2000 --regularization 0.1,0.3,1 \\
        [--models RUN [RUN ...] --weights 1,2,3,5] --out runs/lfw_lbp_fusion.json

The descriptors of the training, validation and colour pair images
(:class:`partialfc.models.lbp.LbpWccnEmbedder`, grid and codes of the recipe's ``lbp_*`` keys) are
computed once; every (components, ridge) pair is then fitted on the training people only and
scored on the validation pairs of ``recipe.pair_sources`` (threshold from the other fold) and
all-vs-all.
With ``--models``, each trained run (whitened on the training images when ``recipe.whiten``,
as ``--evaluate`` does) is fused with the descriptor of the recipe's ``lbp_components`` and
``lbp_regularization`` at every weight ``w`` (score ``(cos_model + w·cos_lbp) / (1 + w)``).
Every number is chosen on the validation folds: read them as a validation curve.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or not all(np.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _summary(metrics: dict) -> dict:
    """Pair accuracy and AUC per source, all-vs-all TAR@FAR=1e-3 and AUC."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("pairs_"):
            out[key] = {"accuracy": value["accuracy"]["mean"], "auc": value["auc"]}
    ava = metrics["all_vs_all"]
    out["all_vs_all"] = {"tar@far=0.001": ava["tar@far=0.001"]["tar"], "auc": ava["auc"]}
    return out


def _line(name: str, summary: dict) -> str:
    pairs = "  ".join(
        f"{k[6:]} {100 * v['accuracy']:.2f}% / {v['auc']:.4f}"
        for k, v in summary.items()
        if k.startswith("pairs_")
    )
    tar = summary["all_vs_all"]["tar@far=0.001"]
    return f"{name:28s} {pairs}  all-vs-all TAR@1e-3 {100 * tar:.2f}%"


def run(recipe, components, ridges, models=(), weights=(), grid=None) -> dict:
    """The table of every (components, ridge) and, with ``models``, of every fusion weight;
    ``grid`` (default: the recipe's, :func:`lfw_face_recipe.lbp_embedder`) is where the
    histograms are taken and which codes."""
    from partialfc.eval import l2_normalize
    from partialfc.models.lbp import LbpWccnEmbedder, fuse_embeddings

    grid = grid or recipe_mod.lbp_embedder(recipe).grid

    t0 = time.perf_counter()
    split = recipe_mod.build_split(recipe)
    pair_sets = {s: recipe_mod.pair_images(recipe, split, s) for s in recipe.pair_sources}
    colour = pair_sets["colour"].images if "colour" in pair_sets else split.val_images[:1]
    describe = LbpWccnEmbedder(grid)
    descriptors = {
        "train": describe.descriptor(split.train_images),
        "val": describe.descriptor(split.val_images),
        "colour": describe.descriptor(colour),
    }
    result: dict = {
        "recipe": asdict(recipe),
        "descriptor_seconds": time.perf_counter() - t0,  # with the split (alignment)
        "lbp": [],
    }
    lbp_embeddings = {}

    def embeddings(k: int, ridge: float) -> tuple[np.ndarray, np.ndarray]:
        """Validation and colour-pair LBP embeddings of the setting, fitted once."""
        if (k, ridge) not in lbp_embeddings:
            embedder = LbpWccnEmbedder(grid, num_components=k, regularization=ridge)
            embedder.fit_descriptors(descriptors["train"], split.train_labels)
            lbp_embeddings[(k, ridge)] = tuple(
                embedder.project(descriptors[part]) for part in ("val", "colour")
            )
        return lbp_embeddings[(k, ridge)]

    for k in components:
        for ridge in ridges:
            val, col = embeddings(k, ridge)
            summary = _summary(recipe_mod.evaluate_embeddings(val, col, split, pair_sets))
            result["lbp"].append({"components": k, "regularization": ridge, **summary})
            print(_line(f"lbp k={k} ridge={ridge:g}", summary), flush=True)
    if models:
        key = (recipe.lbp_components, recipe.lbp_regularization)
        lbp_val, lbp_col = (l2_normalize(x) for x in embeddings(*key))
        result["fusion"] = {"lbp_components": key[0], "lbp_regularization": key[1], "models": {}}
        for model in models:
            embed, size = recipe_mod.ensemble_embed(
                [model], split if recipe.whiten else None, recipe
            )
            model_val, model_col = (
                recipe_mod.embed_flip_test(embed, images, size, recipe.flip_test)
                for images in (split.val_images, colour)
            )
            rows = []
            for w in (0.0, *weights):
                fused_val = fuse_embeddings(model_val, lbp_val, w)
                fused_col = fuse_embeddings(model_col, lbp_col, w)
                summary = _summary(
                    recipe_mod.evaluate_embeddings(fused_val, fused_col, split, pair_sets)
                )
                rows.append({"lbp_weight": w, **summary})
                print(_line(f"{Path(model).name} w={w:g}", summary), flush=True)
            result["fusion"]["models"][str(model)] = rows
    result["total_seconds"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a validation preset, e.g. lfw_dev_val")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--components", type=_ints, default=[1600], help="PCA dimensions")
    parser.add_argument("--regularization", type=_floats, default=[0.3], help="WCCN ridges")
    parser.add_argument("--models", nargs="+", default=[], metavar="RUN")
    parser.add_argument("--weights", type=_floats, default=[1.0, 2.0, 3.0, 5.0])
    parser.add_argument("--out", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    try:
        recipe, _ = recipe_mod.load_validation_recipe(args.config, args.set)
    except ValueError as err:
        parser.error(str(err))
    result = run(recipe, args.components, args.regularization, args.models, args.weights)
    if args.out:
        recipe_mod._atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
