"""The in-graph LTP descriptor's size budget, cross-validated inside the training folds.

    python -m experiments.lfw_ltp_inner_cv --config configs/lfw_dev_val_onefile.yaml \\
        --settings 16:380,16:600,8:760 --out benchmarks/results/lfw_ltp_inner_cv.json

A setting ``c:k`` is the texture part of :class:`partialfc.models.ltp_fused.LtpFusedEmbedding`
with ``c`` dimensions a cell and code and ``k`` components; its int8 projection and cell bases
take ``cells · c · (k + 59)`` bytes of the export (``cells``: the kept half of the grid). For
each training fold ``f`` of the preset (``recipe.train_folds``), every setting is fitted
(:meth:`LtpFusedEmbedding.fit_texture`, ridge ``recipe.lbp_regularization``) on the training
images of the other training folds, built as the recipe builds its training set (grey crops,
colour views, people with enough photos), and scored all-vs-all on the grey crops of fold
``f``'s people (aligned when the recipe aligns): ROC AUC and TAR at FAR = 10⁻³ with the
threshold set by the impostors alone. What is scored is the stored int8 projection, i.e. what an
export runs. The preset's validation folds are never read, so a setting chosen here can be
reported on them afterwards.

With ``--pairs`` the held-out material is LFW pairs instead, as the validation folds score a
model: every two training folds with pairs (folds 1-5) are held out in turn, the descriptor is
fitted on the other training folds, and the pairs of the two held-out folds are scored, grey and
colour (``recipe.pair_sources``), as the reported accuracy (each fold at the threshold that is
best on the other), each fold at its own best threshold, and ROC AUC.

With ``--side-file-config`` the side-file descriptor of a fused preset
(:class:`partialfc.models.lbp.LbpWccnEmbedder` with that preset's ``lbp_*`` keys, fitted by
:func:`experiments.lfw_face_recipe.fit_lbp` on the same training images) is scored on the same
held-out folds, so that what the in-graph settings give up against it is measured without the
validation folds too.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod

TARGET_FAR = 1e-3


@dataclass(frozen=True)
class Setting:
    """``cell_components`` dimensions a cell and code, ``components`` after PCA + WCCN."""

    cell_components: int
    components: int


def _settings(text: str) -> list[Setting]:
    out = []
    for item in (v for v in text.split(",") if v.strip()):
        try:
            cells, components = (int(v) for v in item.split(":"))
        except ValueError:
            cells = components = 0
        if not 1 <= cells <= 59 or components < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated CELL:COMPONENTS with CELL in 1..59 and COMPONENTS "
                f">= 1, got {item!r}"
            )
        out.append(Setting(cells, components))
    if not out:
        raise argparse.ArgumentTypeError("expected at least one CELL:COMPONENTS setting")
    return out


def held_out_fold(recipe, fold: int) -> tuple[np.ndarray, np.ndarray]:
    """Grey crops and person labels of every image of fold ``fold``'s people (fold 0: the
    people in no View 2 pair), aligned when ``recipe.align``."""
    from partialfc.data.loaders import load_lfw_gray

    part = "extra" if fold == 0 else "dev"
    images, labels, _, _ = recipe_mod._select_people(
        load_lfw_gray(recipe_mod.lfw_root(recipe), part=part), [fold]
    )
    if recipe.align:
        images = recipe_mod.align_grey_crops(images)[0]
    return images, labels


def fit_setting(setting: Setting, split, recipe):
    """The texture part of a one-network model of ``setting``, fitted on ``split``'s training
    images with the recipe's threshold and ridge."""
    from partialfc.models.iresnet import iresnet_tiny
    from partialfc.models.ltp_fused import LtpFusedEmbedding
    from partialfc.models.ltp_layer import LtpHistograms

    side = recipe_mod.GREY_SIZE
    histograms = LtpHistograms(side, (side, side // 2), threshold_grey=recipe.lbp_ternary_threshold)
    # the network part is not scored here: any backbone of the right input size will do
    backbone = iresnet_tiny(embedding_dim=8, input_size=64, in_channels=1)
    model = LtpFusedEmbedding(
        backbone,
        histograms,
        setting.components,
        recipe.lbp_weight,
        cell_components=setting.cell_components,
    ).eval()
    images = recipe_mod.normalised_faces(split.train_images)
    return model.fit_texture(images, split.train_labels, recipe.lbp_regularization)


def side_file_recipe(recipe, side_config: str | Path):
    """``recipe`` with the ``lbp_*`` keys (components, ridge, ternary threshold) of the fused
    preset ``side_config``: every other key, and so the training images, stay ``recipe``'s."""
    side, _ = recipe_mod.load_recipe(side_config)
    if side.lbp_weight <= 0 or side.ltp_in_graph:
        raise ValueError(
            f"{side_config}: not a side-file preset (needs recipe.lbp_weight > 0 and "
            "recipe.ltp_in_graph false)"
        )
    return replace(
        recipe,
        lbp_components=side.lbp_components,
        lbp_regularization=side.lbp_regularization,
        lbp_ternary_threshold=side.lbp_ternary_threshold,
    )


def texture_embeddings(model, images: np.ndarray, batch_size: int = 128) -> np.ndarray:
    """``e_ltp`` (unnormalised) of uint8 grey crops."""
    import torch

    faces = recipe_mod.normalised_faces(images)
    with torch.no_grad():
        parts = [model.texture(faces[i : i + batch_size]) for i in range(0, len(faces), batch_size)]
    return torch.cat(parts).numpy().astype(np.float64)


def score(embeddings: np.ndarray, labels: np.ndarray) -> dict:
    """All-vs-all AUC and TAR@FAR = 1e-3 (with its counts) of cosine scores."""
    from partialfc.eval import l2_normalize, verification_report

    genuine, impostor = recipe_mod._upper_pairs(l2_normalize(embeddings), labels)
    report = verification_report("all_vs_all", genuine, impostor, fars=(TARGET_FAR,))
    return recipe_mod._report_dict(report)


def run(recipe, settings: list[Setting], side_file=None) -> dict:
    """Every (training fold held out, setting) row and each setting's mean over the folds; with
    ``side_file`` (a recipe from :func:`side_file_recipe`) a row of its side-file descriptor
    too."""
    folds = sorted(recipe.train_folds)
    if len(folds) < 2:
        raise ValueError(f"cross-validation needs two training folds or more, got {folds}")
    rows, fold_info = [], {}
    for fold in folds:
        others = [f for f in folds if f != fold]
        split = recipe_mod.build_split(replace(recipe, train_folds=others, val_folds=[]))
        if side_file is not None and side_file.lbp_components >= len(split.train_images):
            raise ValueError(
                f"the side file's recipe.lbp_components ({side_file.lbp_components}) must be "
                f"below the {len(split.train_images)} training images of folds {others}"
            )
        images, labels = held_out_fold(recipe, fold)
        fold_info[str(fold)] = {
            "train_folds": others,
            "train_images": int(len(split.train_images)),
            "train_people": int(len(split.train_identities)),
            "held_out_images": int(len(images)),
            "held_out_people": int(len(np.unique(labels))),
        }
        for setting in settings:
            start = time.perf_counter()
            model = fit_setting(setting, split, recipe)
            described = {
                "descriptor": "in_graph",
                "cell_components": setting.cell_components,
                "components": setting.components,
                # int8: the projection and the kept cells' bases
                "projection_bytes": int(
                    model.projection_int8.numel() + model.cell_basis_int8.numel()
                ),
            }
            embeddings = texture_embeddings(model, images)
            name = f"{setting.cell_components}:{setting.components}"
            rows.append(_scored_row(fold, name, described, embeddings, labels, start))
        if side_file is not None:
            start = time.perf_counter()
            side = recipe_mod.fit_lbp(split, side_file)
            described = {
                "descriptor": "side_file",
                "cell_components": None,
                "components": side_file.lbp_components,
                "regularization": side_file.lbp_regularization,
                "projection_bytes": int(side.projection.nbytes),  # float32, as saved
            }
            embeddings = np.asarray(side(images), dtype=np.float64)
            name = f"side file, {side_file.lbp_components} components"
            rows.append(_scored_row(fold, name, described, embeddings, labels, start))
    return {"folds": fold_info, "rows": rows, "means": summarise(rows)}


def pair_splits(recipe) -> list[tuple[list[int], list[int]]]:
    """``(fitted on, held out)`` folds: every two training folds with pairs held out in turn,
    the descriptor fitted on the other training folds (fold 0, the people in no pair, is always
    fitted on)."""
    from itertools import combinations

    folds = sorted(recipe.train_folds)
    paired = [f for f in folds if f != 0]
    if len(paired) < 3:
        raise ValueError(
            f"--pairs holds out two training folds with pairs and fits on the rest: it needs "
            f"three or more of folds 1-5 in recipe.train_folds, got {folds}"
        )
    return [([f for f in folds if f not in held], list(held)) for held in combinations(paired, 2)]


def score_pairs(embed, pair_sets: dict, split) -> dict:
    """Per pair source: the reported accuracy (threshold carried between the held-out folds),
    each fold at its own best threshold, and ROC AUC of the cosines of ``embed(images)``."""
    from partialfc.eval import kfold_accuracy, l2_normalize, roc_auc

    out = {}
    for source, pairs in pair_sets.items():
        e = l2_normalize(np.asarray(embed(pairs.images), dtype=np.float64))
        scores = np.sum(e[pairs.first] * e[pairs.second], axis=1)
        same, folds = split.pairs.issame[pairs.keep], split.pairs.fold[pairs.keep]
        accuracy = kfold_accuracy(scores, same, folds=folds)
        out[source] = {
            "accuracy": accuracy.mean,
            "accuracy_at_own_threshold": float(
                np.mean([a.rate for a in accuracy.fold_best_accuracy])
            ),
            "auc": float(roc_auc(scores[same], scores[~same])),
            "n_pairs": int(scores.size),
        }
    return out


def run_pairs(recipe, settings: list[Setting], side_file=None) -> dict:
    """The ``--pairs`` mode (module docstring): a row per (held-out folds, descriptor) and each
    descriptor's means over the splits."""
    from functools import partial

    rows = []
    for fitted_on, held_out in pair_splits(recipe):
        split = recipe_mod.build_split(replace(recipe, train_folds=fitted_on, val_folds=held_out))
        if side_file is not None and side_file.lbp_components >= len(split.train_images):
            raise ValueError(
                f"the side file's recipe.lbp_components ({side_file.lbp_components}) must be "
                f"below the {len(split.train_images)} training images of folds {fitted_on}"
            )
        pair_sets = {s: recipe_mod.pair_images(recipe, split, s) for s in recipe.pair_sources}
        made = []
        for setting in settings:
            model = fit_setting(setting, split, recipe)
            made.append(
                {
                    "descriptor": "in_graph",
                    "setting": f"{setting.cell_components}:{setting.components}",
                    **score_pairs(partial(texture_embeddings, model), pair_sets, split),
                }
            )
        if side_file is not None:
            side = recipe_mod.fit_lbp(split, side_file)
            made.append(
                {
                    "descriptor": "side_file",
                    "setting": f"side file, {side_file.lbp_components} components",
                    **score_pairs(side, pair_sets, split),
                }
            )
        for row in made:
            row.update(fitted_on=fitted_on, held_out=held_out)
            scored = ", ".join(
                f"{s} {100 * row[s]['accuracy']:.2f} % "
                f"({100 * row[s]['accuracy_at_own_threshold']:.2f}) AUC {row[s]['auc']:.4f}"
                for s in recipe.pair_sources
            )
            print(f"held out {held_out}, {row['setting']}: {scored}", flush=True)
        rows += made
    means = []
    for name in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == name]
        means.append(
            {
                "setting": name,
                "descriptor": mine[0]["descriptor"],
                **{
                    s: {
                        key: float(np.mean([r[s][key] for r in mine]))
                        for key in ("accuracy", "accuracy_at_own_threshold", "auc")
                    }
                    for s in recipe.pair_sources
                },
            }
        )
    return {"ternary_threshold": recipe.lbp_ternary_threshold, "rows": rows, "means": means}


def _scored_row(fold: int, name: str, described: dict, embeddings, labels, start: float) -> dict:
    """The row of one fitted descriptor: ``described`` plus its held-out scores and the seconds
    since ``start`` (fit and scoring); printed as it is made."""
    key = f"tar@far={TARGET_FAR:g}"
    metrics = score(embeddings, labels)
    row = {
        "held_out_fold": fold,
        **described,
        "auc": metrics["auc"],
        key: metrics[key],
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(
        f"fold {fold} {name} ({row['projection_bytes'] / 1e6:.1f} MB): AUC {row['auc']:.4f}, "
        f"TAR@1e-3 {row[key]['tar']:.3f}",
        flush=True,
    )
    return row


def summarise(rows: list[dict]) -> list[dict]:
    """Per descriptor and setting: the mean over held-out folds of AUC and TAR, and each fold's
    AUC."""
    key = f"tar@far={TARGET_FAR:g}"

    def of(row):
        return row["descriptor"], row["cell_components"], row["components"]

    out = []
    for setting in dict.fromkeys(of(r) for r in rows):
        mine = [r for r in rows if of(r) == setting]
        out.append(
            {
                "descriptor": setting[0],
                "cell_components": setting[1],
                "components": setting[2],
                "projection_bytes": mine[0]["projection_bytes"],
                "mean_auc": float(np.mean([r["auc"] for r in mine])),
                "mean_tar": float(np.mean([r[key]["tar"] for r in mine])),
                "auc_per_fold": [r["auc"] for r in mine],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a validation preset with lbp_* keys")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--settings",
        type=_settings,
        default=_settings("16:380"),
        help="CELL:COMPONENTS,... (default 16:380, the preset's)",
    )
    parser.add_argument(
        "--side-file-config",
        metavar="CONFIG",
        help="also score the side-file descriptor of this fused preset (its lbp_* keys) on the "
        "same folds (default: none)",
    )
    parser.add_argument(
        "--pairs",
        action="store_true",
        help="score the LFW pairs of two held-out training folds at a time (reported accuracy, "
        "own-threshold accuracy, AUC) instead of every pair of one held-out fold's faces",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out: the folder of {args.out} does not exist")
    import torch

    torch.set_num_threads(args.threads)
    try:
        recipe, _ = recipe_mod.load_recipe(args.config, args.set)
        side = side_file_recipe(recipe, args.side_file_config) if args.side_file_config else None
        result = (run_pairs if args.pairs else run)(recipe, args.settings, side)
    except ValueError as error:  # a bad config, key or setting (ConfigError is one)
        parser.error(str(error))
    for row in [] if args.pairs else result["means"]:
        name = (
            f"{row['cell_components']:2d}:{row['components']:<5d}"
            if row["descriptor"] == "in_graph"
            else f"side file {row['components']}"
        )
        print(
            f"{name} "
            f"{row['projection_bytes'] / 1e6:5.1f} MB  mean AUC {row['mean_auc']:.4f}  "
            f"mean TAR@1e-3 {row['mean_tar']:.3f}"
        )
    if args.out:
        result = {
            "how": " ".join(__doc__.split("\n\n")[2:]).replace("\n", " "),
            "command": "python -m experiments.lfw_ltp_inner_cv "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "config": str(args.config),
            "overrides": args.set,
            "threads": args.threads,
            **result,
        }
        recipe_mod._atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
