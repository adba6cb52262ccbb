"""The training console's pieces: the plain step line, the duration format, the copy of every
line in the log file, the bar shown only on a terminal, and the 10-fold accuracy in the
headline and in each set's line."""

from __future__ import annotations

import io
import re

import numpy as np

from partialfc.eval.report_writer import summary_line
from partialfc.eval.reports import verification_report
from partialfc.train.command import headline
from partialfc.train.metrics_log import ConsoleLog, Progress, format_duration, step_line


def test_durations_are_hours_minutes_seconds():
    assert format_duration(0.4) == "0:00:00"
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(3725.2) == "1:02:05"
    assert format_duration(100 * 3600 + 1) == "100:00:01"


def test_the_plain_step_line_names_step_epoch_loss_lr_rate_and_eta():
    line = step_line(1200, 45000, 0.52, 12.34567, 0.0999, 2345.6, 3725.0)
    assert line == (
        "step 1,200/45,000 (epoch 0.52): loss 12.3457, lr 9.990e-02, 2,346 samples/s, ETA 1:02:05"
    )


def test_console_lines_go_to_the_stream_and_are_appended_to_the_file(tmp_path, capsys):
    console = ConsoleLog()
    console("before the file")
    console.open(tmp_path / "run" / "training.log")
    console("two\nlines")
    console("a warning", error=True)
    captured = capsys.readouterr()
    assert captured.out == "before the file\ntwo\nlines\n"
    assert captured.err == "a warning\n"
    lines = (tmp_path / "run" / "training.log").read_text().splitlines()
    assert [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", x) for x in lines] == [
        "two",
        "lines",
        "a warning",
    ]
    ConsoleLog(tmp_path / "run" / "training.log")("resumed")  # a new process appends
    assert (tmp_path / "run" / "training.log").read_text().splitlines()[-1].endswith(" resumed")


def test_the_step_bar_needs_a_terminal(monkeypatch):
    assert not Progress(10, 0, enabled=True).active  # pytest's stderr is not a terminal
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    monkeypatch.setattr("sys.stderr", terminal)
    bar = Progress(10, 0, enabled=True)
    assert bar.active
    bar.close()
    assert not Progress(10, 0, enabled=False).active


def test_pair_sets_print_their_10_fold_accuracy_beside_auc():
    # 20 pairs, 2 per fold: genuine pairs score 0.9, impostors 0.1, except one impostor at
    # 0.95 (pair 0, fold 0). Fold 0 is then 1/2 right, every other fold 2/2:
    # mean 0.95, population std sqrt(0.0225) = 0.15; AUC: 9 of the 10 impostors rank below all
    # 10 genuine pairs, the tenth above all of them -> 90 / 100
    same = np.array([k % 2 == 1 for k in range(20)])
    scores = np.where(same, 0.9, 0.1)
    scores[0] = 0.95
    report = verification_report(
        "lfw", scores=scores, is_genuine=same, n_folds=10, notes=["flip test: True"]
    )
    line = summary_line(report)
    assert line.startswith("lfw: 10-fold accuracy 95.00 ± 15.00% (20 pairs, flip), AUC 0.9000,")
    summary = {"lfw": {"kfold_accuracy": 0.95, "kfold_accuracy_std": 0.15, "auc": 0.95}}
    summary["lfw"]["eer"] = 0.1
    assert headline(summary, 60.0).splitlines()[1] == (
        "  lfw: 10-fold accuracy 95.00 ± 15.00%, ROC AUC 0.9500, EER 10.00%"
    )
