"""Verification during and after training, through :mod:`partialfc.eval`.

``eval.protocols`` in the config names the sets:

==========================  ==============================================================
``omniglot_open_set``       all pairs of the 13,180 Omniglot evaluation images (659 unseen
                            classes): TAR@FAR with k, ROC AUC, EER
``omniglot_one_shot``       Lake's 20 runs of 20-way one-shot classification (rank-1)
``omniglot_holdout``        20-way one-shot episodes and all pairs on the background
                            alphabets held out of training (``data.holdout_background_alphabets``)
``orl``                     ORL faces (shared data folder)
``lfw_dev``                 LFW development pairs (shared data folder)
``bin:PATH``                an InsightFace ``.bin`` pair file (lfw.bin, cfp_fp.bin, ...)
==========================  ==============================================================
"""

from __future__ import annotations

from pathlib import Path

PROTOCOL_NAMES = (
    "omniglot_open_set",
    "omniglot_one_shot",
    "omniglot_holdout",
    "orl",
    "lfw_dev",
    "bin:PATH",
)


def build_protocols(
    names: list[str], input_size: int, flip: bool, batch_size: int, holdout_alphabets=()
) -> list:
    """``holdout_alphabets``: the held-out background alphabets ``omniglot_holdout`` uses."""
    from partialfc.eval.protocols import (
        LfwPairs,
        OmniglotHoldout,
        OmniglotOneShot,
        OmniglotOpenSet,
        Orl,
        VerificationBin,
    )

    protocols = []
    for name in names:
        if name == "omniglot_open_set":
            protocols.append(OmniglotOpenSet(size=input_size, flip=flip, batch_size=batch_size))
        elif name == "omniglot_one_shot":
            protocols.append(OmniglotOneShot(size=input_size, flip=flip))
        elif name == "omniglot_holdout":
            if not holdout_alphabets:
                raise ValueError(
                    "eval.protocols: omniglot_holdout needs data.holdout_background_alphabets"
                )
            protocols.append(
                OmniglotHoldout(
                    holdout_alphabets, size=input_size, flip=flip, batch_size=batch_size
                )
            )
        elif name == "orl":
            protocols.append(Orl(flip=flip))
        elif name == "lfw_dev":
            protocols.append(LfwPairs(flip=flip))
        elif name.startswith("bin:"):
            protocols.append(VerificationBin(name[4:], flip=flip, batch_size=batch_size))
        else:
            choices = ", ".join(PROTOCOL_NAMES)
            raise ValueError(f"eval.protocols: unknown protocol {name!r}; choose from {choices}")
    return protocols


def summarize(reports: list) -> dict:
    """Headline numbers per report: ``{name: {auc, eer, tar@far=…, rank1, …}}``."""
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
        elif isinstance(r, IdentificationReport):
            entry = {"rank1": r.cmc.rank(1).rate, "rank5": r.cmc.rank(min(5, len(r.cmc.hits))).rate}
        else:
            continue
        out[r.name] = entry
    return out


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
        flip: bool,
        batch_size: int,
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
