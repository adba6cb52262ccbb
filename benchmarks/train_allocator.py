"""What keeping freed memory between steps (``train.keep_freed_memory``) does to a training run,
as JSON: wall time, user and kernel CPU seconds and minor page faults of the same short run of a
preset, with the option on and off, in alternating passes (so that a slower or faster moment of
a shared machine falls on both), and the last logged loss of each to show the arithmetic is the
same.

Each pass is a fresh ``partialfc train`` process (``--no-eval``; its own run folder under a
temporary directory); its resources are read with ``resource.getrusage(RUSAGE_CHILDREN)``, so
they include the DataLoader workers.

    python benchmarks/train_allocator.py --config configs/omniglot_cpu.yaml --epochs 0.5 \\
        --repeat 3 --out benchmarks/results/train_allocator_omniglot.json
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_MEASURED = ("wall_s", "user_s", "kernel_s", "minor_page_faults")
_LOSS = re.compile(r"step ([\d,]+)/[\d,]+ .*?loss ([-\d.e+]+)")


def _one_pass(config: str, epochs: float, keep: bool, output_dir: str, name: str) -> dict:
    command = [
        sys.executable, "-m", "partialfc.cli", "train", "--config", config, "--no-eval",
        "--overwrite", "--set", f"train.epochs={epochs}", "--set", f"run.output_dir={output_dir}",
        "--set", f"run.name={name}", "--set", f"train.keep_freed_memory={str(keep).lower()}",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr[-2000:]}")
    losses = _LOSS.findall(out.stdout)
    return {
        "wall_s": round(wall, 2),
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "kernel_s": round(after.ru_stime - before.ru_stime, 2),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
        "last_logged_step": int(losses[-1][0].replace(",", "")) if losses else None,
        "last_logged_loss": losses[-1][1] if losses else None,
    }


def summarise(passes: dict[str, list[dict]]) -> dict:
    """Medians and bests of each setting's passes; whether every pass ended on the same loss."""
    median = {
        label: {key: round(float(np.median([p[key] for p in runs])), 2) for key in _MEASURED}
        for label, runs in passes.items()
    }
    best = {label: min(p["wall_s"] for p in runs) for label, runs in passes.items()}
    return {
        "median": median,
        "best_wall_s": best,
        "default_over_kept_median_wall": round(
            median["default"]["wall_s"] / median["kept"]["wall_s"], 3
        ),
        "default_over_kept_best_wall": round(best["default"] / best["kept"], 3),
        "same_last_loss": len({p["last_logged_loss"] for r in passes.values() for p in r}) == 1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/omniglot_cpu.yaml")
    parser.add_argument("--epochs", type=float, default=0.5, help="(default: 0.5)")
    parser.add_argument("--repeat", type=int, default=3, help="passes of each (default: 3)")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: stdout only)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from face_embedding_cost import _cpu  # the CPU's model and vector flags

    passes: dict[str, list[dict]] = {"kept": [], "default": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for label in ("kept", "default") if r % 2 == 0 else ("default", "kept"):
                result = _one_pass(args.config, args.epochs, label == "kept", tmp, label)
                passes[label].append(result)
                print(label, result, file=sys.stderr, flush=True)
    report = {
        "config": args.config,
        "epochs": args.epochs,
        "repeat": args.repeat,
        "cpu": _cpu(),
        "passes": passes,
        **summarise(passes),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
