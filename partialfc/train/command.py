"""``partialfc train --config FILE [--set section.key=value ...]``.

Single process::

    partialfc train --config configs/omniglot_cpu.yaml --set train.epochs=3

Several processes (one per GPU, or several CPU ranks with gloo)::

    torchrun --nproc_per_node 8 -m partialfc.cli train --config configs/ms1mv3_r50_arcface.yaml

The run folder (``run.output_dir/run.name``) receives ``config.yaml`` (resolved),
``metrics.jsonl``, ``checkpoints/`` and ``report/`` (verification report).
"""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.epochs=3 --set optim.lr=0.05 "
        "(repeatable; VALUE is parsed as YAML)",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default=None,
        metavar="CHECKPOINT",
        help="continue a run: its newest checkpoint (no value) or the given checkpoint directory",
    )
    parser.add_argument("--no-eval", action="store_true", help="skip the final verification")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )


def _print_headline(summary: dict, elapsed_s: float) -> None:
    from partialfc.eval.protocols import published_results

    lines = [f"trained and evaluated in {elapsed_s / 60:.1f} min"]
    for name, entry in summary.items():
        parts = []
        if "auc" in entry:
            parts.append(f"ROC AUC {entry['auc']:.4f}")
            parts.append(f"EER {100 * entry['eer']:.2f}%")
            for key, value in entry.items():
                if key.startswith("tar@far="):
                    far = key.split("=", 1)[1]
                    parts.append(f"TAR@FAR={far} {100 * value:.2f}% (k={entry[f'k@far={far}']})")
        if "rank1" in entry:
            label = "20-way one-shot accuracy" if "one_shot" in name else "rank-1"
            parts.append(f"{label} {100 * entry['rank1']:.1f}%")
            published = published_results(name)
            if published:
                quoted = ", ".join(f"{k} {100 * v:.1f}%" for k, v in published.items())
                parts.append(f"({quoted})")
        lines.append(f"  {name}: " + ", ".join(parts))
    print("\n".join(lines))


def run(args: argparse.Namespace) -> int:
    return train_and_report(args, prog="partialfc train")


def train_and_report(args: argparse.Namespace, prog: str, make_extra_losses=None) -> int:
    """Load the config from ``args``, train, evaluate and print the headline.

    ``make_extra_losses(cfg, device) -> list`` supplies extra loss terms (``partialfc distill``).
    """
    import yaml

    from partialfc.train.config import ConfigError, config_to_dict, load_config

    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={args.resume}")
    try:
        cfg = load_config(args.config, overrides)
    except (ConfigError, FileNotFoundError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0

    from partialfc.train.data import holdout_alphabets
    from partialfc.train.distributed import setup_distributed
    from partialfc.train.engine import NonFiniteLossError, Trainer
    from partialfc.train.evaluation import Evaluator

    start = time.perf_counter()
    evaluator = None
    if cfg.eval.protocols and (cfg.eval.at_end or cfg.eval.every_steps) and not args.no_eval:
        evaluator = Evaluator.from_names(
            cfg.eval.protocols,
            cfg.data.input_size,
            cfg.eval.flip_test,
            cfg.eval.batch_size,
            shift_average_px=cfg.eval.shift_average_px,
            holdout_alphabets=holdout_alphabets(cfg.data),
        )
    try:
        ctx = setup_distributed(cfg.train.device)
        extra = make_extra_losses(cfg, ctx.device) if make_extra_losses is not None else ()
        trainer = Trainer(cfg, ctx=ctx, evaluator=evaluator, extra_losses=extra)
        result = trainer.fit()
    except (ConfigError, NonFiniteLossError, ValueError, FileNotFoundError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    if trainer.ctx.is_main:
        print(
            f"{result.steps} steps ({result.epochs_completed:.2f} epochs) in "
            f"{(time.perf_counter() - start) / 60:.1f} min; checkpoint: {result.last_checkpoint}"
        )
    if evaluator is not None and cfg.eval.at_end:
        summary = trainer.evaluate(final=True)
        if trainer.ctx.is_main and summary is not None:
            _print_headline(summary, time.perf_counter() - start)
            print(f"report: {trainer.run_dir / 'report' / 'report.md'}")
    return 0
