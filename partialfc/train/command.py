"""``partialfc train --config FILE [--set section.key=value ...]``.

Single process::

    partialfc train --config configs/omniglot_cpu.yaml --set train.epochs=3

Several processes (one per GPU, or several CPU ranks with gloo)::

    torchrun --nproc_per_node 8 -m partialfc.cli train --config configs/ms1mv3_r50_arcface.yaml

The run folder (``run.output_dir/run.name``) receives ``config.yaml`` (resolved),
``metrics.jsonl``, ``training.log`` (every console line, with the time; a resumed run appends),
``checkpoints/`` and ``report/`` (verification report). A folder that
already holds a run is an error unless ``--resume`` continues it or ``--overwrite`` replaces it
(:mod:`partialfc.train.run_folder`). Training starts with a banner: the run folder, device,
threads, classes, images, steps, precision and head. Without a progress bar
(``run.progress=false``, or stderr not a terminal: ``nohup``, a cluster job) a plain line
every ``train.log_every`` steps gives the step, loss, lr, samples/s and ETA. Each check on a
verification set prints its own lines, with the 10-fold accuracy (mean ± std) of the pair sets.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
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
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in the run folder if it holds one (run.on_exists=overwrite)",
    )
    parser.add_argument("--no-eval", action="store_true", help="skip the final verification")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )


def headline(summary: dict, elapsed_s: float) -> str:
    """The console summary of the final evaluation; every rate as
    :func:`partialfc.eval.intervals.percent` writes it."""
    from partialfc.eval.intervals import percent

    lines = [f"trained and evaluated in {elapsed_s / 60:.1f} min"]
    for name, entry in summary.items():
        parts = []
        if "kfold_accuracy" in entry:
            std = entry.get("kfold_accuracy_std")
            spread = f" ± {100 * std:.2f}" if std is not None else ""
            parts.append(f"10-fold accuracy {100 * entry['kfold_accuracy']:.2f}{spread}%")
        if "auc" in entry:
            parts.append(f"ROC AUC {entry['auc']:.4f}")
            parts.append(f"EER {percent(entry['eer'])}")
            for key, value in entry.items():
                if key.startswith("tar@far="):
                    far = key.split("=", 1)[1]
                    parts.append(f"TAR@FAR={far} {percent(value)} (k={entry[f'k@far={far}']})")
        if "rank1" in entry:
            parts.append(f"rank-1 {percent(entry['rank1'])}")
        lines.append(f"  {name}: " + ", ".join(parts))
    return "\n".join(lines)


def start_banner(trainer) -> str:
    """What is about to run, before the first step."""
    cfg = trainer.cfg
    precision = {None: "fp32", "bfloat16": "bf16 autocast", "float16": "fp16 autocast"}[
        None if trainer.autocast_dtype is None else str(trainer.autocast_dtype).split(".")[-1]
    ]
    ranks = trainer.ctx.world_size
    start = f", resuming at step {trainer.step:,}" if trainer.step else ""
    head = cfg.head.kind
    if head == "partial_fc":
        head += f" (sample rate {cfg.head.sample_rate:g})"
    if cfg.head.compute_dtype != "float32":
        precision += f", head GEMMs {cfg.head.compute_dtype}"
    accumulate = cfg.train.accumulate_steps
    micro = f", {accumulate} micro-batches per step" if accumulate > 1 else ""
    rows = [
        ("run folder", f"{trainer.run_dir}{start}"),
        ("device", f"{trainer.ctx.device}, {ranks} rank{'s' if ranks > 1 else ''}"),
        (
            "threads",
            f"{trainer.num_threads} compute (train.num_threads={cfg.train.num_threads}) + "
            f"{cfg.data.num_workers} data worker{'s' if cfg.data.num_workers != 1 else ''}",
        ),
        ("data", f"{len(trainer.train_set):,} images, {trainer.num_classes:,} classes"),
        (
            "steps",
            f"{trainer.total_steps:,} ({cfg.train.epochs:g} epochs of {trainer.steps_per_epoch:,}"
            f" steps, global batch {trainer.global_batch:,}{micro})",
        ),
        ("precision", precision),
        ("model", f"{trainer.model_config['name']}, {cfg.model.embedding_dim}-d embedding"),
        ("head", head),
    ]
    if cfg.train.ema_decay:
        rows.append(("ema", f"backbone weights, decay {cfg.train.ema_decay:g}"))
    return "\n".join(f"{name:<11} {value}" for name, value in rows)


def run(args: argparse.Namespace) -> int:
    return train_and_report(args, prog="partialfc train")


def _announce(trainer) -> None:
    from partialfc.train.threads import available_cores, load_average, oversubscription_warning

    if trainer.run_note:
        trainer.console(trainer.run_note)
    trainer.console(start_banner(trainer))
    warning = oversubscription_warning(available_cores(), load_average())
    if warning:
        trainer.console(warning, error=True)


def _print(text: str, error: bool = False) -> None:
    print(text, file=sys.stderr if error else sys.stdout, flush=True)


def _missing_extra(cfg) -> str | None:
    """A one-line message when the config asks for an optional package that is not installed."""
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        return (
            "run.tensorboard=true needs the tensorboard package: pip install "
            "'partialfc[tensorboard]' (or --set run.tensorboard=false)"
        )
    return None


def train_and_report(args: argparse.Namespace, prog: str, make_extra_losses=None) -> int:
    """Load the config from ``args``, train, evaluate and print the headline.

    ``make_extra_losses(cfg, device) -> list`` supplies extra loss terms (``partialfc distill``).
    """
    from partialfc.train.allocator import keep_freed_memory
    from partialfc.train.threads import passive_wait_environment

    os.environ.update(passive_wait_environment(os.environ))  # before OpenMP starts (torch)
    import yaml

    from partialfc.train.config import ConfigError, config_to_dict, load_config

    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={args.resume}")
    if getattr(args, "overwrite", False):
        overrides.append("run.on_exists=overwrite")
    try:
        cfg = load_config(args.config, overrides)
    except (ConfigError, FileNotFoundError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0
    if cfg.train.keep_freed_memory:
        keep_freed_memory()  # each step reuses the last step's memory instead of faulting it in
    missing = _missing_extra(cfg)
    if missing:
        print(f"{prog}: {missing}", file=sys.stderr)
        return 2
    from partialfc.eval.progress import set_progress

    set_progress(None if cfg.run.progress else False)  # evaluation bars: terminal only, or off

    from partialfc.train.data import holdout_alphabets
    from partialfc.train.distributed import setup_distributed
    from partialfc.train.engine import NonFiniteLossError, Trainer
    from partialfc.train.evaluation import Evaluator

    start = time.perf_counter()
    say = _print  # the console; once the run folder is known, also its training.log
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
        if trainer.ctx.is_main:
            trainer.console.open(trainer.run_dir / "training.log")
        say = trainer.console
        if trainer.ctx.is_main:
            _announce(trainer)
        result = trainer.fit()
    except (ConfigError, NonFiniteLossError, ValueError, FileNotFoundError) as err:
        say(f"{prog}: {err}", error=True)
        return 1
    if trainer.ctx.is_main:
        say(
            f"{result.steps} steps ({result.epochs_completed:.2f} epochs) in "
            f"{(time.perf_counter() - start) / 60:.1f} min; checkpoint: {result.last_checkpoint}"
        )
    if evaluator is not None and cfg.eval.at_end:
        summary = trainer.evaluate(final=True)
        if trainer.ctx.is_main and summary is not None:
            say(headline(summary, time.perf_counter() - start))
            if trainer.last_ema_summary is not None:
                from partialfc.train.evaluation import side_by_side

                table = side_by_side(summary, trainer.last_ema_summary, trainer.ema.decay)
                say(table.rstrip("\n"))
            say(f"report: {trainer.run_dir / 'report' / 'report.md'}")
    trainer.log.close()  # flushes TensorBoard / ends the MLflow run (eval scalars included)
    return 0
