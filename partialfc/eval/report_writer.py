"""Write evaluation results: ``results.json``, ``report.md`` and PNG plots (ROC on a log-FAR
axis, CMC). Every number in the Markdown carries its counts. Files are written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from partialfc.atomic import atomic_output, atomic_write_bytes

from .intervals import percent
from .reports import IdentificationReport, VerificationReport, roc_points
from .results import to_jsonable


def _plot(path: Path, draw) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=110)
    try:
        draw(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)


def plot_roc(reports: list[VerificationReport], path: Path) -> None:
    def draw(ax):
        for r in reports:
            points = [p for p in roc_points(r.roc, max_points=2000) if p["far"] > 0]
            ax.plot(
                [p["far"] for p in points],
                [p["tar"] for p in points],
                label=f"{r.name} ({r.n_impostor} impostor pairs)",
            )
            ax.axvline(1.0 / r.n_impostor, ls=":", lw=0.8, color=ax.lines[-1].get_color())
        ax.set_xscale("log")
        ax.set_xlabel("FAR (log); dotted: 1 / impostor pairs, the smallest measurable FAR")
        ax.set_ylabel("TAR")
        ax.set_ylim(0, 1.01)

    _plot(path, draw)


def plot_cmc(reports: list[IdentificationReport], path: Path) -> None:
    def draw(ax):
        for r in reports:
            ax.plot(
                r.cmc.ranks,
                r.cmc.rates,
                marker="o",
                ms=3,
                label=f"{r.name} ({r.cmc.n_probes} probes)",
            )
        ax.set_xlabel("rank")
        ax.set_ylabel("identification rate")
        ax.set_ylim(0, 1.01)

    _plot(path, draw)


def _pct(p) -> str:
    return str(p)


def verification_markdown(r: VerificationReport) -> str:
    lines = [
        f"### {r.name} (verification)",
        "",
        f"{r.n_genuine} genuine / {r.n_impostor} impostor pairs. AUC {r.auc:.5f}. "
        f"EER {100 * r.eer.eer:.2f}% at threshold {r.eer.threshold:.4f} "
        f"({r.eer.false_accepts} false accepts, {r.eer.false_rejects} false rejects).",
        "",
    ]
    if r.kfold_accuracy is not None:
        k = r.kfold_accuracy
        correct = sum(a.k for a in k.fold_accuracy)
        lines += [
            f"{len(k.fold_accuracy)}-fold accuracy {100 * k.mean:.2f} ± {100 * k.std:.2f}% "
            f"({correct}/{k.n_pairs} pairs correct; threshold chosen on the other folds).",
            "",
        ]
    if r.tar_at_far:
        lines += [
            "| target FAR | TAR (95% CI, k/n) | threshold | false accepts k (95% CI on FAR) |",
            "|---|---|---|---|",
        ]
        for t in r.tar_at_far:
            lines.append(
                f"| {t.target_far:g} | {_pct(t.tar)} | {t.threshold:.4f} | "
                f"{t.far.k} of {t.far.n} ({t.far.lower:.2g}–{t.far.upper:.2g}) |"
            )
        lines.append("")
    lines += [f"- not reported: {u}" for u in r.unresolved]
    lines += [f"- {n}" for n in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def identification_markdown(r: IdentificationReport) -> str:
    ranks = [k for k in (1, 5, 10, 20) if k <= len(r.cmc.ranks)]
    lines = [
        f"### {r.name} (identification)",
        "",
        f"{r.n_gallery_identities} gallery identities, {r.n_mated_probes} mated probes, "
        f"{r.n_nonmated_probes} non-mated probes.",
        "",
        "| rank | identification rate (95% CI, hits/probes) |",
        "|---|---|",
    ]
    lines += [f"| {k} | {_pct(r.cmc.rank(k))} |" for k in ranks]
    if r.open_set:
        lines += [
            "",
            "| target FPIR | FNIR (95% CI, misses/mated) | TPIR | threshold | FPIR realized |",
            "|---|---|---|---|---|",
        ]
        for p in r.open_set:
            lines.append(
                f"| {p.target_fpir:g} | {_pct(p.fnir)} | {100 * p.tpir:.2f}% | "
                f"{p.threshold:.4f} | {p.fpir.k}/{p.fpir.n} |"
            )
    lines += [""] + [f"- {n}" for n in r.notes]
    return "\n".join(lines).rstrip() + "\n"


def write_report(reports: list, out_dir, title: str = "Evaluation report", meta=None) -> dict:
    """Write ``results.json``, ``report.md``, ``roc.png``, ``cmc.png`` into ``out_dir``.

    Returns the JSON-ready dict that was written.
    """
    out = Path(out_dir)
    verification = [r for r in reports if isinstance(r, VerificationReport) and r.roc is not None]
    identification = [r for r in reports if isinstance(r, IdentificationReport)]
    payload = {
        "title": title,
        "meta": to_jsonable(meta or {}),
        "results": [r.to_dict() for r in reports],
    }
    atomic_write_bytes(out / "results.json", (json.dumps(payload, indent=1) + "\n").encode())
    md = [f"# {title}", ""]
    if verification:
        plot_roc(verification, out / "roc.png")
        md += ["![ROC](roc.png)", ""]
    if identification:
        plot_cmc(identification, out / "cmc.png")
        md += ["![CMC](cmc.png)", ""]
    for r in reports:
        if isinstance(r, VerificationReport):
            md.append(verification_markdown(r))
        elif isinstance(r, IdentificationReport):
            md.append(identification_markdown(r))
    atomic_write_bytes(out / "report.md", "\n".join(md).encode())
    return payload


def summary_line(r) -> str:
    """One line per report for logs."""
    if isinstance(r, VerificationReport):
        best = max(r.tar_at_far, key=lambda t: -t.target_far, default=None)
        extra = f", TAR@FAR={best.target_far:g}: {best.tar}" if best else ""
        accuracy = ""
        if r.kfold_accuracy is not None:  # the published tables' number: mean ± std over folds
            k = r.kfold_accuracy
            flip = ", flip" if "flip test: True" in r.notes else ""
            accuracy = (
                f"{len(k.fold_accuracy)}-fold accuracy {100 * k.mean:.2f} ± {100 * k.std:.2f}%"
                f" ({k.n_pairs} pairs{flip}), "
            )
        return f"{r.name}: {accuracy}AUC {r.auc:.4f}, EER {percent(r.eer.eer)}{extra}"
    if isinstance(r, IdentificationReport):
        return f"{r.name}: rank-1 {r.cmc.rank(1)}"
    return repr(r)


__all__ = ["plot_cmc", "plot_roc", "summary_line", "write_report"]
