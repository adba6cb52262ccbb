"""Verification during and after training, through :mod:`partialfc.eval`.

``eval.protocols`` in the config names the sets as the one protocol table does
(:data:`partialfc.eval.protocols.registry.PROTOCOLS`, the same names ``partialfc eval``
builds from its flags): ``omniglot_open_set``, ``omniglot_one_shot``, ``orl[:ROOT]``,
``lfw_dev``, ``lfw_pairs:PAIRS_TXT,IMAGES``, ``bin:PATH``, ``ijbb:ROOT``, ``ijbc:ROOT``, and
``omniglot_holdout``, whose alphabets come from ``data.holdout_background_alphabets``.
``eval.flip_test`` and ``eval.batch_size`` left at null keep each protocol's defaults; the
Omniglot sets are read, and IJB faces aligned, at ``data.input_size``.
"""

from __future__ import annotations

from pathlib import Path


def build_protocols(
    names: list[str],
    input_size: int,
    flip: bool | None = None,
    batch_size: int | None = None,
    holdout_alphabets=(),
) -> list:
    """The protocols of ``eval.protocols`` (ValueError naming the key for an unknown name);
    a bare ``omniglot_holdout`` evaluates on ``holdout_alphabets`` (the held-out ones)."""
    from partialfc.eval.protocols.registry import build_protocols as build

    if holdout_alphabets:
        held_out = "omniglot_holdout:" + ",".join(holdout_alphabets)
        names = [held_out if name == "omniglot_holdout" else name for name in names]
    return build(names, flip, batch_size, input_size, where="eval.protocols")


def summarize(reports: list) -> dict:
    """Headline numbers per report: ``{name: {auc, eer, tar@far=…, kfold_accuracy(_std),
    rank1, …}}``."""
    from partialfc.eval.reports import IdentificationReport, VerificationReport

    out: dict = {}
    for r in reports:
        if isinstance(r, VerificationReport):
            entry = {"auc": r.auc, "eer": r.eer.eer}
            for t in r.tar_at_far:
                entry[f"tar@far={t.target_far:g}"] = t.tar.rate
                entry[f"k@far={t.target_far:g}"] = t.far.k
            if r.kfold_accuracy is not None:
                entry["kfold_accuracy"] = r.kfold_accuracy.mean
                entry["kfold_accuracy_std"] = r.kfold_accuracy.std
        elif isinstance(r, IdentificationReport):
            entry = {"rank1": r.cmc.rank(1).rate, "rank5": r.cmc.rank(min(5, len(r.cmc.hits))).rate}
        else:
            continue
        out[r.name] = entry
    return out


def side_by_side(raw: dict, ema: dict, ema_decay: float) -> str:
    """A Markdown table of two summaries (:func:`summarize`): trained weights vs their EMA."""
    lines = [
        f"| set | metric | trained weights | EMA (decay {ema_decay:g}) | EMA − trained |",
        "|---|---|---:|---:|---:|",
    ]
    for name, entry in raw.items():
        for key, value in entry.items():
            other = ema.get(name, {}).get(key)
            if other is None or key.startswith("k@"):
                continue
            lines.append(f"| {name} | {key} | {value:.4f} | {other:.4f} | {other - value:+.4f} |")
    return "\n".join(lines) + "\n"


def append_comparison(report: Path, raw: dict, ema: dict, ema_decay: float) -> None:
    """Append the side-by-side table of the trained and EMA weights to ``report`` (atomic)."""
    from partialfc.atomic import atomic_write_bytes

    report = Path(report)
    text = report.read_text() if report.is_file() else ""
    section = (
        f"\n## Trained weights and their EMA (train.ema_decay={ema_decay:g})\n\n"
        f"The EMA model's full report is in `ema/report.md`.\n\n"
        + side_by_side(raw, ema, ema_decay)
    )
    atomic_write_bytes(report, (text + section).encode())


class Evaluator:
    """``evaluator(embed_fn, out_dir) -> summary``: runs the protocols, writes the report."""

    def __init__(self, protocols: list, log=print, shift_average_px: int = 0):
        if not protocols:
            raise ValueError("Evaluator needs at least one protocol")
        if shift_average_px < 0:
            raise ValueError(f"eval.shift_average_px must be >= 0 pixels, got {shift_average_px}")
        self.protocols = list(protocols)
        self.log = log
        self.shift_average_px = int(shift_average_px)
        self.reports: list = []

    @classmethod
    def from_names(
        cls,
        names: list[str],
        input_size: int,
        flip: bool | None = None,
        batch_size: int | None = None,
        log=print,
        shift_average_px: int = 0,
        holdout_alphabets=(),
    ):
        protocols = build_protocols(names, input_size, flip, batch_size, holdout_alphabets)
        return cls(protocols, log=log, shift_average_px=shift_average_px)

    def __call__(self, embed_fn, out_dir: Path, title: str = "Verification", meta=None) -> dict:
        from partialfc.eval import evaluate_model
        from partialfc.eval.embedding import with_shift_averaging

        embed_fn = with_shift_averaging(embed_fn, self.shift_average_px)
        self.reports = evaluate_model(
            embed_fn, self.protocols, out_dir, title=title, meta=meta, log=self.log
        )
        return summarize(self.reports)
