"""The one-network model against the fused preset's side file, pair by pair, on the same networks.

    python -m experiments.lfw_descriptor_comparison --runs RUN_0 RUN_1 RUN_2 \\
        --out benchmarks/results/lfw_onefile_vs_side_file_paired.json

Each run folder (a validation run of ``configs/lfw_dev_val_onefile.yaml``) is scored on the
validation pairs twice: as the one-network model (``--config``: the network whitened and the
in-graph descriptor fitted, exactly what the run would export) and as the fused preset
(``--side-file-config``: the same network with the side-file descriptor ``lbp_wccn.npz`` fitted
on the same training images). Both scorings of all the runs are then compared on each pair set
by :func:`partialfc.eval.compare_kfold_accuracy`: the difference of the reported accuracy
(each fold at the threshold carried from the other), its paired bootstrap interval (pairs
resampled within each fold and genuine / impostor stratum, the same resample for every run and
both scorings) and McNemar's exact test on the pairs that exactly one scoring decides correctly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod


def pair_scores(run: str | Path, split, pair_sets: dict, one_network, side_file) -> dict:
    """``{source: {"in_graph": (P,), "side_file": (P,)}}``: the cosine of every kept pair of each
    pair set under the two scorings of one run's network."""
    from partialfc.backbone.embedding import embed_array
    from partialfc.eval import l2_normalize
    from partialfc.models.lbp import fuse_embeddings

    fused = recipe_mod.whitened_run(run, split, one_network)
    embed, size = recipe_mod.ensemble_embed([str(run)], split, side_file)
    descriptor = recipe_mod.fit_lbp(split, side_file)
    out = {}
    for source, pairs in pair_sets.items():
        in_graph = l2_normalize(embed_array(fused, pairs.images, 128).astype(np.float64))
        network = l2_normalize(
            recipe_mod.embed_flip_test(embed, pairs.images, size, side_file.flip_test)
        )
        side = fuse_embeddings(
            network, l2_normalize(descriptor(pairs.images)), side_file.lbp_weight
        )
        side = l2_normalize(side.astype(np.float64))
        out[source] = {
            name: np.sum(e[pairs.first] * e[pairs.second], axis=1)
            for name, e in (("in_graph", in_graph), ("side_file", side))
        }
    return out


def compare(scores: list[dict], is_genuine: dict, folds: dict, resamples: int, seed: int) -> dict:
    """Per pair set: each run's carried-threshold accuracy under both scorings with its own
    McNemar test, and the paired comparison of all runs together (in graph − side file)."""
    from partialfc.eval import (
        compare_kfold_accuracy,
        correct_at_carried_threshold,
        kfold_accuracy,
        mcnemar_exact_p,
    )

    out = {}
    for source in scores[0]:
        same, fold = is_genuine[source], folds[source]
        rows = {
            name: np.stack([s[source][name] for s in scores]) for name in ("in_graph", "side_file")
        }
        per_run = []
        for i in range(len(scores)):
            right = {n: correct_at_carried_threshold(rows[n][i], same, fold) for n in rows}
            only_in_graph = int(np.count_nonzero(right["in_graph"] & ~right["side_file"]))
            only_side_file = int(np.count_nonzero(~right["in_graph"] & right["side_file"]))
            per_run.append(
                {
                    **{n: kfold_accuracy(rows[n][i], same, folds=fold).mean for n in rows},
                    "only_in_graph_right": only_in_graph,
                    "only_side_file_right": only_side_file,
                    "mcnemar_p": mcnemar_exact_p(only_in_graph, only_side_file),
                }
            )
        result = compare_kfold_accuracy(
            rows["in_graph"], rows["side_file"], same, fold, resamples=resamples, seed=seed
        )
        out[source] = {"per_run": per_run, "in_graph_minus_side_file": result.to_dict()}
        print(f"{source} pairs, in graph − side file: {result}", flush=True)
    return out


def run(runs: list[str], one_network, side_file, resamples: int = 2000, seed: int = 0) -> dict:
    """Score every run both ways on the validation pairs of ``one_network`` and compare."""
    if not one_network.val_folds:
        raise ValueError("the comparison needs validation folds (recipe.val_folds)")
    split = recipe_mod.build_split(one_network)
    pair_sets = {s: recipe_mod.pair_images(one_network, split, s) for s in one_network.pair_sources}
    scores = [pair_scores(r, split, pair_sets, one_network, side_file) for r in runs]
    is_genuine = {s: split.pairs.issame[p.keep] for s, p in pair_sets.items()}
    folds = {s: split.pairs.fold[p.keep] for s, p in pair_sets.items()}
    return {"runs": [str(r) for r in runs], **compare(scores, is_genuine, folds, resamples, seed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", nargs="+", required=True, help="validation run folders (required)"
    )
    parser.add_argument(
        "--config",
        default="configs/lfw_dev_val_onefile.yaml",
        help="the one-network validation preset the runs were trained with (default "
        "configs/lfw_dev_val_onefile.yaml)",
    )
    parser.add_argument(
        "--side-file-config",
        default="configs/lfw_dev_val_fused.yaml",
        help="the fused preset whose side-file descriptor is fitted beside the same networks "
        "(default configs/lfw_dev_val_fused.yaml)",
    )
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="write the results to this JSON file (default: print only)")
    args = parser.parse_args(argv)
    from partialfc.backbone.io import newest_checkpoint

    for path in args.runs:
        if not Path(path).is_dir():
            parser.error(f"--runs: {path} is not a run folder")
        if newest_checkpoint(path) is None:
            parser.error(f"--runs: {path} holds no checkpoint (model.json) to score")
    if args.resamples < 1 or args.threads < 1:
        parser.error(
            f"--resamples and --threads must be >= 1, got {args.resamples}, {args.threads}"
        )
    if args.out and not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out: the folder of {args.out} does not exist")
    import torch

    torch.set_num_threads(args.threads)
    try:
        one_network, _ = recipe_mod.load_recipe(args.config)
        side_file, _ = recipe_mod.load_recipe(args.side_file_config)
        if not one_network.ltp_in_graph or side_file.ltp_in_graph or side_file.lbp_weight <= 0:
            raise ValueError(
                f"--config must set recipe.ltp_in_graph ({args.config}) and --side-file-config "
                f"must be a side-file preset ({args.side_file_config})"
            )
        result = run(args.runs, one_network, side_file, args.resamples, args.seed)
    except ValueError as error:
        parser.error(str(error))
    if args.out:
        result = {
            "how": " ".join(__doc__.split("\n\n")[2:]).replace("\n", " "),
            "command": "python -m experiments.lfw_descriptor_comparison "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "threads": args.threads,
            **result,
        }
        recipe_mod._atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
