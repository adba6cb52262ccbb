"""``partialfc import-weights``: an arcface_torch backbone file → a partialfc model directory."""

from __future__ import annotations

import argparse
import json
import sys

from partialfc.tools.arcface_torch.weights import NETWORKS, import_weights


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "weights",
        help="arcface_torch backbone weights: model.pt / backbone.pth (a state dict), "
        "checkpoint_gpu_<rank>.pt (its state_dict_backbone) or .safetensors; "
        "read with torch.load(weights_only=True): tensors only, no code in the file runs",
    )
    parser.add_argument(
        "--network",
        required=True,
        choices=tuple(NETWORKS),
        metavar="NAME",
        help=f"the network as arcface_torch names it (config.network): {', '.join(NETWORKS)}",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="model directory to create (must not exist, or be empty); embed, eval, export, "
        "search and checkpoint.init_from read it",
    )
    parser.add_argument(
        "--embedding-size",
        type=int,
        help="config.embedding_size of the run (default: read from the weights; 512 in every "
        "config arcface_torch ships)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        result = import_weights(
            args.weights, args.network, args.output, embedding_size=args.embedding_size
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"partialfc import-weights: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2))
    print(
        f"{args.network} -> {result.model_name}: {result.num_tensors} tensors written to "
        f"{result.output} (RGB 112x112, (x - 127.5) / 127.5)",
        file=sys.stderr,
    )
    return 0
