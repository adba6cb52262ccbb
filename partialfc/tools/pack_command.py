"""``partialfc pack`` and ``partialfc unpack``: image folder / list file <-> RecordIO."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

FIT_WORDS = {
    "pad": "padding with black",
    "crop": "cropping the centred square",
    "stretch": "stretching",
}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command == "pack":
        parser.add_argument(
            "source", help="image folder (one sub-folder per identity) or a 'path label' list file"
        )
        parser.add_argument("output", help="output .rec path (the .idx is written next to it)")
        parser.add_argument("--root", help="base folder for relative paths in a list file")
        parser.add_argument(
            "--workers",
            type=int,
            default=min(8, os.cpu_count() or 1),
            help="reader processes (default: min(8, CPUs))",
        )
        parser.add_argument(
            "--no-header",
            action="store_true",
            help="plain im2rec layout (keys 0..N-1, no identity records)",
        )
        parser.add_argument("--resize", type=int, help="re-encode as SIZE x SIZE JPEG")
        parser.add_argument(
            "--fit",
            choices=("pad", "crop", "stretch"),
            default="pad",
            help="--resize of non-square images: pad to a square with black (default), "
            "crop the centred square, or stretch",
        )
        parser.add_argument("--quality", type=int, default=95, help="JPEG quality with --resize")
        parser.add_argument(
            "--skip-bad",
            action="store_true",
            help="skip unreadable images (listed in the report) instead of failing",
        )
        parser.add_argument(
            "--max-image-pixels",
            type=int,
            help="refuse (or with --skip-bad skip) images whose header claims more pixels "
            "(default 8192 x 8192 = 67108864, or $PARTIALFC_MAX_IMAGE_PIXELS)",
        )
        parser.add_argument(
            "--remap-labels",
            action="store_true",
            help="list file: map sorted distinct labels to 0..K-1",
        )
        from partialfc.detect.command import add_detect_arguments

        add_detect_arguments(parser)  # --detect: align photos (to --resize or 112) first
    else:
        parser.add_argument("input", help="input .rec path")
        parser.add_argument("output", help="output folder (must not exist)")
        parser.add_argument("--idx", help="index file (default: the .rec path with .idx)")
        parser.add_argument(
            "--numbered",
            action="store_true",
            help="name the folders by label even when the set has a .names.json sidecar",
        )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, OSError) as err:  # RecordIOError, unreadable images, full disk, ...
        print(f"partialfc {args.command}: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from partialfc.data.pack import unpack_records
    from partialfc.ranges import Range, check_options

    if args.command == "unpack":
        count = unpack_records(args.input, args.output, args.idx, use_names=not args.numbered)
        print(json.dumps({"images": count, "output": str(args.output)}))
        return 0
    check_options(
        args,
        {
            "--max-image-pixels": Range(1, integer=True),
            "--resize": Range(1, integer=True),
            "--quality": Range(0, 100, integer=True),
            "--workers": Range(1, integer=True),
        },
    )
    if args.detect:
        from partialfc.detect.command import aligned_copy

        with aligned_copy(args.source, args, size=args.resize or 112) as (folder, aligned):
            args.resize = None  # the crops already have the requested size
            return _pack(args, folder, aligned)
    return _pack(args, Path(args.source))


def _pack(args: argparse.Namespace, source: Path, aligned: dict | None = None) -> int:
    from partialfc.data.datasets import read_list_file, scan_image_folder
    from partialfc.data.pack import identity_names_path, pack_images

    names = None  # a list file has labels only: no names sidecar
    if source.is_dir():
        paths, labels, names = scan_image_folder(source)
    else:
        paths, labels = read_list_file(source, args.root, remap_labels=args.remap_labels)
    report = pack_images(
        paths,
        labels,
        args.output,
        workers=args.workers,
        header=not args.no_header,
        resize=args.resize,
        quality=args.quality,
        fit=args.fit,
        skip_bad=args.skip_bad,
        max_pixels=args.max_image_pixels,
        names=names,
    )
    resized = {"size": args.resize, "fit": args.fit, "non_square": report.non_square}
    if report.non_square:
        count = f"{report.non_square} non-square image" + ("s" if report.non_square > 1 else "")
        how = FIT_WORDS[args.fit]
        size = f"{args.resize}x{args.resize}"
        print(f"resized {count} to {size} by {how} (--fit {args.fit})", file=sys.stderr)
    print(
        json.dumps(
            {
                "images": report.images,
                "classes": report.classes,
                "skipped": report.skipped,
                "rec": report.rec_path,
                "idx": report.idx_path,
                **({"names": str(identity_names_path(report.rec_path))} if names else {}),
                **({"resize": resized} if args.resize else {}),
                **({"aligned": aligned} if aligned is not None else {}),
            }
        )
    )
    return 0
