"""Per-group error rates at ONE shared threshold (NIST FRVT demographic effects,
Grother et al., NISTIR 8280, 2019).

A one-sigma shift of a group's impostor-score mean is invisible on a histogram and yet gives
a ~100x higher false match rate at a shared threshold, because the tail is exponential. So each
group's FMR and FNMR are reported at the same threshold, each with its pair count and interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import as_scores
from .intervals import Proportion, proportion
from .results import Result


@dataclass(frozen=True)
class GroupRates(Result):
    group: str
    fmr: Proportion  # impostor pairs of the group accepted
    fnmr: Proportion  # genuine pairs of the group rejected


@dataclass(frozen=True)
class SubgroupReport(Result):
    threshold: float
    groups: list[GroupRates]
    fmr_max_over_min: float  # worst/best group FMR (inf if the best group has 0 false matches)

    def to_markdown(self) -> str:
        rows = [
            f"Shared threshold {self.threshold:.4f}; FMR max/min = {self.fmr_max_over_min:.3g}",
            "",
            "| group | FMR | false matches / impostor pairs | FNMR | false non-matches / genuine"
            " pairs |",
            "|---|---|---|---|---|",
        ]
        for g in self.groups:
            rows.append(
                f"| {g.group} | {g.fmr.rate:.3g} [{g.fmr.lower:.3g}, {g.fmr.upper:.3g}] | "
                f"{g.fmr.k} / {g.fmr.n} | {g.fnmr.rate:.3g} [{g.fnmr.lower:.3g}, "
                f"{g.fnmr.upper:.3g}] | {g.fnmr.k} / {g.fnmr.n} |"
            )
        return "\n".join(rows)


def _count_by_group(groups: np.ndarray, event: np.ndarray) -> dict[str, tuple[int, int]]:
    """``{group: (events, total)}``; integer labels take a sort-free bincount path."""
    if groups.size == 0:
        return {}
    if np.issubdtype(groups.dtype, np.integer):
        low = int(groups.min())
        index = (groups - low).astype(np.int64)
        if int(index.max()) < 1_000_000:
            total = np.bincount(index)
            hits = np.bincount(index[event], minlength=total.size)
            return {str(low + i): (int(hits[i]), int(total[i])) for i in np.flatnonzero(total)}
    names, index = np.unique(groups, return_inverse=True)
    index = index.reshape(-1)
    total = np.bincount(index, minlength=names.size)
    hits = np.bincount(index[event], minlength=names.size)
    return {str(n): (int(h), int(t)) for n, h, t in zip(names, hits, total, strict=True)}


def subgroup_report(
    threshold: float,
    genuine_scores,
    genuine_groups,
    impostor_scores,
    impostor_groups,
    confidence: float = 0.95,
) -> SubgroupReport:
    """FMR and FNMR per group at the shared ``threshold`` (accept ``score >= threshold``).

    ``*_groups`` give each pair's group label (e.g. the group of both subjects for
    same-group impostor pairs); groups missing from one side get an empty (0/0) rate.
    """
    gen = as_scores(genuine_scores, "genuine_scores", allow_empty=True)
    imp = as_scores(impostor_scores, "impostor_scores", allow_empty=True)
    gen_groups = np.asarray(genuine_groups).reshape(-1)
    imp_groups = np.asarray(impostor_groups).reshape(-1)
    if gen_groups.size != gen.size or imp_groups.size != imp.size:
        raise ValueError("each score needs exactly one group label")
    gen_counts = _count_by_group(gen_groups, gen < threshold)
    imp_counts = _count_by_group(imp_groups, imp >= threshold)
    rates = [
        GroupRates(
            group=group,
            fmr=proportion(*imp_counts.get(group, (0, 0)), confidence),
            fnmr=proportion(*gen_counts.get(group, (0, 0)), confidence),
        )
        for group in sorted(set(gen_counts) | set(imp_counts))
    ]
    fmrs = [r.fmr.rate for r in rates if r.fmr.n > 0]
    ratio = float("nan")
    if fmrs:
        ratio = float("inf") if min(fmrs) == 0 < max(fmrs) else max(fmrs) / max(min(fmrs), 1e-300)
        ratio = float("nan") if max(fmrs) == 0 else ratio
    return SubgroupReport(threshold=float(threshold), groups=rates, fmr_max_over_min=ratio)
