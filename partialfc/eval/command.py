"""``partialfc eval``: evaluate a checkpoint or exported model on verification and
identification protocols; writes results.json, report.md, roc.png and cmc.png."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    from .protocols.registry import OMNIGLOT_SIZE

    parser.add_argument(
        "model",
        nargs="+",
        help="checkpoint or exported model (loaded with Embedder.load); several models are "
        "evaluated as one ensemble: the mean of their cosines",
    )
    parser.add_argument("--out", required=True, help="output folder for the report")
    from partialfc.backbone.embedder import PREPROCESSING, PREPROCESSING_HELP

    parser.add_argument(
        "--preprocessing",
        choices=PREPROCESSING,
        default="auto",
        help=PREPROCESSING_HELP,
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument(
        "--bin",
        action="append",
        default=[],
        metavar="PATH",
        help="InsightFace .bin verification set (repeatable)",
    )
    parser.add_argument("--lfw-pairs", metavar="PAIRS_TXT", help="LFW-style pairs.txt")
    parser.add_argument("--lfw-images", metavar="DIR_OR_ZIP", help="images for --lfw-pairs")
    parser.add_argument(
        "--lfw-dev", action="store_true", help="LFW development pairs from the shared data folder"
    )
    parser.add_argument(
        "--omniglot",
        action="store_true",
        help="Omniglot evaluation set, all pairs (open set, ~8.7e7 impostors)",
    )
    parser.add_argument(
        "--omniglot-one-shot", action="store_true", help="Lake's 20-way one-shot runs"
    )
    parser.add_argument(
        "--omniglot-holdout",
        metavar="N_OR_NAMES",
        help="one-shot episodes and all pairs on background alphabets held out of training: "
        "N (the last N candidates) or comma-separated names, as the model's "
        "data.holdout_background_alphabets",
    )
    parser.add_argument(
        "--omniglot-size",
        type=int,
        default=None,
        help=f"side of the Omniglot images in pixels ({OMNIGLOT_SIZE} = the bundled copy; other "
        f"sizes are resized from the 105x105 originals); default: {OMNIGLOT_SIZE}",
    )
    parser.add_argument(
        "--orl",
        nargs="?",
        const="",
        default=None,
        metavar="ROOT",
        help="ORL faces (default root: the shared data folder)",
    )
    parser.add_argument("--ijb", metavar="ROOT", help="IJB-B/C folder with meta/ and loose_crop/")
    parser.add_argument(
        "--ijb-name",
        default="IJBC",
        choices=("IJBB", "IJBC"),
        help="which IJB protocol the --ijb folder holds",
    )
    parser.add_argument(
        "--no-flip",
        action="store_true",
        help="disable the flip test (default: on for faces, off for Omniglot)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="images per embedding call; default: each protocol's (256)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="--lfw-pairs: leave out images that cannot be read, and the pairs using them; "
        "list them (file and reason, tab separated) in OUT/refused.tsv and in the report",
    )
    parser.add_argument(
        "--shift-average",
        type=int,
        default=0,
        metavar="PX",
        help="average each embedding with those of the image moved PX pixels up/down/left/right "
        "(test-time augmentation, 5x the cost); default: 0 = off",
    )


def protocol_specs(args: argparse.Namespace) -> list[str]:
    """The flags as protocol names of :data:`partialfc.eval.protocols.registry.PROTOCOLS`."""
    if bool(args.lfw_pairs) != bool(args.lfw_images):
        raise ValueError("--lfw-pairs and --lfw-images go together")
    specs = [f"bin:{path}" for path in args.bin]
    if args.lfw_pairs:
        specs.append(f"lfw_pairs:{args.lfw_pairs},{args.lfw_images}")
    if args.lfw_dev:
        specs.append("lfw_dev")
    if args.omniglot:
        specs.append("omniglot_open_set")
    if args.omniglot_one_shot:
        specs.append("omniglot_one_shot")
    if args.omniglot_holdout:
        from partialfc.data.omniglot_holdout import holdout_alphabets_from_text

        alphabets = holdout_alphabets_from_text(args.omniglot_holdout, "--omniglot-holdout")
        specs.append("omniglot_holdout:" + ",".join(alphabets))
    if args.orl is not None:
        specs.append(f"orl:{args.orl}" if args.orl else "orl")
    if args.ijb:
        specs.append(f"{args.ijb_name.lower()}:{args.ijb}")
    if not specs:
        raise ValueError("choose at least one protocol (--bin, --lfw-dev, --omniglot, ...)")
    return specs


def build_protocols(args: argparse.Namespace) -> list:
    """The protocols the flags ask for, with the defaults of the one protocol table
    (``--no-flip`` turns the flip test off everywhere; ``--batch-size`` overrides)."""
    from .protocols.registry import build_protocol

    flip = False if args.no_flip else None
    return [
        build_protocol(
            spec,
            flip=flip,
            batch_size=args.batch_size,
            size=args.omniglot_size if spec.startswith("omniglot") else None,
        )
        for spec in protocol_specs(args)
    ]


def run(args: argparse.Namespace) -> int:
    from partialfc.ranges import Range, check_options

    from .evaluate import evaluate_model

    try:
        check_options(args, {"--batch-size": Range(1, integer=True)})
        protocols = build_protocols(args)
        if args.skip_bad:
            if not any(p.skips_bad for p in protocols):
                raise ValueError("--skip-bad applies to --lfw-pairs; no chosen protocol reads one")
            for protocol in protocols:
                protocol.skip_bad = protocol.skips_bad
    except ValueError as err:
        print(f"partialfc eval: {err}", file=sys.stderr)
        return 2
    from partialfc.backbone.embedder import Embedder

    from .embedding import ensemble_embed_fn, with_input_size, with_shift_averaging
    from .protocols import Ijb

    if args.shift_average < 0:
        print(
            f"partialfc eval: --shift-average must be >= 0 pixels, got {args.shift_average}",
            file=sys.stderr,
        )
        return 2
    members, sizes = [], []
    for path in args.model:
        try:
            embedder = Embedder.load(path, device=args.device, preprocessing=args.preprocessing)
        except ValueError as err:
            print(f"partialfc eval: {err}", file=sys.stderr)
            return 2
        # raw (un-normalised) embeddings: protocols normalise, templates pool raw vectors first
        embed_fn = embedder.embed_raw if hasattr(embedder, "embed_raw") else embedder.embed
        input_size = getattr(getattr(embedder, "spec", None), "input_size", None)
        embed_fn = with_shift_averaging(embed_fn, args.shift_average)
        if input_size is not None:  # protocol images come at their stored size
            embed_fn = with_input_size(embed_fn, input_size)
            sizes.append(int(input_size[0]))
        members.append(embed_fn)
    if sizes and any(isinstance(p, Ijb) for p in protocols):
        if len(set(sizes)) > 1:
            print(
                f"partialfc eval: IJB aligns faces at one size; the models take {sorted(sizes)}",
                file=sys.stderr,
            )
            return 2
        for protocol in protocols:
            if isinstance(protocol, Ijb):
                protocol.size = sizes[0]  # align IJB faces at the model's size
    models = args.model[0] if len(args.model) == 1 else ", ".join(args.model)
    try:
        evaluate_model(
            ensemble_embed_fn(members),
            protocols,
            args.out,
            title=f"Evaluation of {models}",
            meta={
                "model": args.model[0] if len(args.model) == 1 else list(args.model),
                "flip_test": {p.name: bool(p.flip) for p in protocols},
                "shift_average_px": args.shift_average,
            },
        )
    except (ValueError, FileNotFoundError) as err:  # an unreadable image, pair list, archive
        print(f"partialfc eval: {err}", file=sys.stderr)
        return 2
    from pathlib import Path

    if args.skip_bad:
        from partialfc.data.refused import write_refused_list

        refused = [item for p in protocols for item in p.refused]
        listed = write_refused_list(Path(args.out) / "refused.tsv", refused)
        print(
            f"partialfc eval: {len(refused)} file(s) refused, listed in {listed}", file=sys.stderr
        )
    print(f"report written to {Path(args.out) / 'report.md'}")
    return 0
