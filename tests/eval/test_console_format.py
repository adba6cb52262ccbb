"""Console numbers follow one rule: a measured rate is a percentage with two decimals (with its
interval and counts when it is a Proportion); paths are joined, never concatenated."""

from __future__ import annotations

import numpy as np

from partialfc.eval.intervals import Proportion, percent, proportion
from partialfc.train.command import headline


def test_percent_has_two_decimals():
    assert percent(0.0004472) == "0.04%"
    assert percent(0.945) == "94.50%"
    assert percent(1.0) == "100.00%"


def test_proportion_prints_rate_and_interval_in_percent():
    p = proportion(1, 2236)
    lower, upper = 100 * p.lower, 100 * p.upper
    assert str(p) == f"0.04% [{lower:.2f}, {upper:.2f}] (1/2236)"
    assert str(Proportion(378, 400, 0.945, 0.918, 0.965, 0.95)) == (
        "94.50% [91.80, 96.50] (378/400)"
    )


def test_training_headline_has_no_stray_comma_and_no_quoted_literature():
    summary = {
        "omniglot_open_set": {
            "auc": 0.99234,
            "eer": 0.038,
            "tar@far=0.001": 0.6331,
            "k@far=0.001": 86724,
        },
        "omniglot_one_shot": {"rank1": 0.28, "rank5": 0.6},
    }
    text = headline(summary, 90.0)
    assert text.splitlines() == [
        "trained and evaluated in 1.5 min",
        "  omniglot_open_set: ROC AUC 0.9923, EER 3.80%, TAR@FAR=0.001 63.31% (k=86724)",
        "  omniglot_one_shot: rank-1 28.00%",
    ]


def test_eval_report_path_has_no_double_slash(tmp_path, monkeypatch, capsys):
    import partialfc.backbone.embedder as embedder_module
    import partialfc.eval.evaluate as evaluate_module
    from partialfc.cli import main

    class Dummy:
        def embed(self, images):
            return np.ones((len(images), 4), np.float32)

    monkeypatch.setattr(embedder_module.Embedder, "load", staticmethod(lambda *a, **k: Dummy()))
    monkeypatch.setattr(evaluate_module, "evaluate_model", lambda *a, **k: [])
    out = f"{tmp_path}/report/"
    assert main(["eval", "model", "--out", out, "--omniglot-one-shot"]) == 0
    assert capsys.readouterr().out == f"report written to {tmp_path}/report/report.md\n"
