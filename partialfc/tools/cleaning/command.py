"""``partialfc clean RUN_OR_CHECKPOINT --out DIR``: sub-center cleaning of a training set."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .recipe import clean_checkpoint, resolve_training_checkpoint
from .rule import DEFAULT_THRESHOLD_DEG


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    from partialfc.train.config import allowed_values

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
        choices=allowed_values("data.source"),
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
    parser.add_argument("--batch-size", type=int, default=512, help="images per embedding batch")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")


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
