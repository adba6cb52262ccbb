"""``partialfc import-config CONFIG.py --output CONFIG.yaml``: an arcface_torch config as a
partialfc YAML config (read without running it; :mod:`partialfc.tools.arcface_torch.config`).

    partialfc import-config arcface_torch/configs/ms1mv3_r50.py --rec /data/ms1mv3 \\
        --output ms1mv3_r50.yaml
    partialfc train --config ms1mv3_r50.yaml

Every arcface_torch key is printed as mapped (to which partialfc keys, and how the meaning
differs) or dropped (with the reason); the same lines head the YAML as comments. On an error
nothing is written.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "config",
        help="arcface_torch config file (configs/NAME.py); configs/base.py beside it is read "
        "first, as arcface_torch does",
    )
    parser.add_argument("--output", required=True, help="the partialfc YAML config to write")
    parser.add_argument(
        "--rec",
        default=None,
        metavar="FOLDER",
        help="dataset folder (train.rec, train.idx, NAME.bin) to use instead of config.rec",
    )
    parser.add_argument(
        "--network",
        default=None,
        metavar="MODEL",
        help="partialfc model name to use instead of the mapping of config.network "
        "(e.g. iresnet50, mobilefacenet, vit_t)",
    )


def run(args: argparse.Namespace) -> int:
    from partialfc.tools.arcface_torch.config import (
        ArcfaceConfigError,
        convert_config,
        write_converted,
    )

    prog = "partialfc import-config"
    try:
        converted = convert_config(args.config, rec=args.rec, network=args.network)
        output = write_converted(converted, args.output)
    except ArcfaceConfigError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{prog}: cannot write {args.output}: {err}", file=sys.stderr)
        return 1
    print(converted.report())
    print(f"wrote {output}; train with: partialfc train --config {output}")
    return 0
