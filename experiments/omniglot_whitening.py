"""Within-class whitening of trained Omniglot models, measured on the held-out alphabets.

    python -m experiments.omniglot_whitening RUN [RUN ...] --holdout 5 \\
        --lambdas 0.3,1,3 --out runs/omniglot_whitening.json

Each ``RUN`` is a run folder (or export) of ``configs/omniglot_select.yaml`` trained without the
``--holdout`` background alphabets. The drawings of the classes it trained on are embedded once;
within-class covariance normalisation (WCCN; Hatch, Kajarekar & Stolcke, ICSLP 2006, §2;
:class:`partialfc.models.whitening.WithinClassWhitening`) is learned on them for each ridge ``λ``
and the ``omniglot_holdout`` protocol (100 episodes of 20-way one-shot and all pairs of the
held-out drawings) is run with the plain cosine and with each whitening. Nothing of the
held-out or evaluation alphabets is used to learn the map. The JSON lists, per run and scoring
rule, the one-shot hits, ROC AUC, EER and TAR at FAR = 1e-3.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def whitened(embed_fn, projection: np.ndarray):
    """``images ↦ embed_fn(images) @ P`` (``P`` symmetric, so the rows are ``P x``)."""
    matrix = np.asarray(projection, dtype=np.float32)

    def embed(images: np.ndarray) -> np.ndarray:
        return np.asarray(embed_fn(images), dtype=np.float32) @ matrix

    return embed


def _summary(reports) -> dict:
    one_shot = next(r for r in reports if "one_shot" in r.name)
    open_set = next(r for r in reports if "open_set" in r.name)
    tar = next(t for t in open_set.tar_at_far if t.target_far == 1e-3)
    return {
        "one_shot_hits": int(one_shot.cmc.hits[0]),
        "one_shot_trials": int(one_shot.cmc.n_probes),
        "auc": round(float(open_set.auc), 4),
        "eer": round(float(open_set.eer.eer), 4),
        "tar_at_far_1e-3": round(float(tar.tar.rate), 4),
    }


def evaluate_run(path: str, holdout: str, lambdas: list[float], batch_size: int = 512) -> dict:
    """The plain cosine and each ``λ``'s whitening of one trained model on the held-out
    alphabets ``holdout`` (a number N or comma-separated names, as the config key)."""
    from partialfc.backbone.embedder import Embedder
    from partialfc.data.loaders import load_omniglot
    from partialfc.data.omniglot_holdout import resolve_holdout_alphabets
    from partialfc.models.whitening import WithinClassWhitening
    from partialfc.train.evaluation import build_protocols

    spec = int(holdout) if holdout.isdigit() else holdout.split(",")
    held = resolve_holdout_alphabets(spec)
    if not held:
        raise ValueError("--holdout 0 holds out no alphabet: nothing to evaluate on")
    embedder = Embedder.load(path)
    size = int(embedder.spec.input_size[0])
    train = load_omniglot("background", size=size, exclude_alphabets=held)
    raw = embedder.embed_raw(train.images, batch_size=batch_size)
    rules = {"cosine": embedder.embed_raw}
    for lam in lambdas:
        projection = WithinClassWhitening(lam).fit(raw, train.labels).projection
        rules[f"wccn {lam:g}"] = whitened(embedder.embed_raw, projection)
    out = {"run": str(path), "holdout_alphabets": list(held), "train_drawings": len(raw)}
    for name, fn in rules.items():
        protocols = build_protocols(["omniglot_holdout"], size, None, batch_size, held)
        out[name] = _summary([r for p in protocols for r in p.run(fn)])
        print(f"{path}  {name:10s}  {out[name]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="trained run folders or exports")
    parser.add_argument("--holdout", default="5", help="held-out alphabets: N or names")
    parser.add_argument("--lambdas", default="0.3,1,3", help="WCCN ridges, comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    try:
        lambdas = [float(x) for x in args.lambdas.split(",") if x]
    except ValueError:
        parser.error(f"--lambdas must be comma-separated numbers, got {args.lambdas!r}")
    try:
        results = [evaluate_run(run, args.holdout, lambdas) for run in args.runs]
    except (ValueError, FileNotFoundError) as err:
        print(f"omniglot_whitening: {err}", file=sys.stderr)
        return 2
    from partialfc.atomic import atomic_write_bytes

    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, ensure_ascii=False) + "\n"
    atomic_write_bytes(args.out, text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
