"""The cleaning report: ``report.json`` (summary), ``per_class.csv`` and ``angles.png``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from partialfc.atomic import atomic_output, atomic_write_bytes

from .rule import CleaningResult


def plot_angle_histogram(result: CleaningResult, path: str | Path) -> Path:
    """PNG histogram of the angle to the dominant center, one colour per group, with the
    threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    bins = np.linspace(0.0, 180.0, 91)
    fig, ax = plt.subplots(figsize=(7, 4))
    dom = result.is_dominant
    if result.noisy_mask is None:
        parts = [("dominant", dom), ("non-dominant", ~dom)]
    else:
        noisy = result.noisy_mask
        parts = [
            ("dominant, clean", dom & ~noisy),
            ("dominant, noisy", dom & noisy),
            ("non-dominant, clean", ~dom & ~noisy),
            ("non-dominant, noisy", ~dom & noisy),
        ]
    ax.hist(
        [result.angle_deg[m] for _, m in parts],
        bins=bins,
        stacked=True,
        label=[f"{name} ({int(m.sum())})" for name, m in parts],
    )
    ax.axvline(result.threshold_deg, color="k", linestyle="--", label="threshold")
    ax.set_xlabel("angle to the dominant sub-center of the labelled class (degrees)")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path


def write_report(result: CleaningResult, out_dir: str | Path, extra: dict | None = None) -> dict:
    """``report.json`` (summary + ``extra``), ``per_class.csv`` and ``angles.png`` in
    ``out_dir``; returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**result.summary(), **(extra or {})}
    atomic_write_bytes(out_dir / "report.json", json.dumps(summary, indent=2).encode())
    per_class = result.per_class()
    lines = ["class,samples,kept,dominant_assigned,dominant_subcenter"]
    for c in range(len(result.dominant_subcenter)):
        lines.append(",".join([str(c), *(str(int(per_class[key][c])) for key in per_class)]))
    atomic_write_bytes(out_dir / "per_class.csv", ("\n".join(lines) + "\n").encode())
    plot_angle_histogram(result, out_dir / "angles.png")
    return summary
