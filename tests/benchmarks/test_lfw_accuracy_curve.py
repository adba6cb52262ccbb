"""benchmarks/lfw_accuracy_curve.py: the runs file, its checks and the seed means."""

import pytest

from tests.benchmarks.scripts import ROOT, benchmark_script


@pytest.fixture(scope="module")
def curve():
    with benchmark_script("lfw_accuracy_curve") as module:
        yield module


def _record(**changes):
    record = {
        "label": "preset",
        "change": "none",
        "steps": 3200,
        "seed": 0,
        "pair_accuracy": 0.8467,
        "fold_accuracies": [0.8475, 0.8459],
        "pair_auc": 0.921,
        "train_min": 15.3,
        "load": "1-2",
        "machine": "2 cores",
    }
    record.update(changes)
    return record


def test_the_recorded_runs_are_the_recipe_tables(curve):
    runs = curve.load_runs(ROOT / "benchmarks" / "results" / "lfw_accuracy_runs.json")
    # docs/face_recipe.md: the results table (grey pairs) and the bfloat16 table
    by_label = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(round(100 * r.pair_accuracy, 2))
    assert by_label["preset (48x48, 40 epochs, fp32)"] == [84.67, 83.15]
    assert by_label["preset at 10 epochs"] == [77.94]
    assert by_label["64x64, 60 epochs, bf16 autocast"] == [85.77, 85.58]
    assert by_label["every person as a class (40 epochs, fp32)"] == [82.60]
    groups = {g.label: g for g in curve.seed_groups(runs)}
    new = groups["64x64, 60 epochs, bf16 autocast"]
    assert new.seeds == (0, 1)
    assert 100 * new.mean == pytest.approx(85.68, abs=0.006)  # the docs round 85.675 up
    assert 100 * new.sd == pytest.approx(0.13, abs=0.006)
    preset = groups["preset (48x48, 40 epochs, fp32)"]
    assert 100 * preset.mean == pytest.approx(83.91, abs=0.006)
    assert 100 * preset.sd == pytest.approx(1.07, abs=0.006)
    # docs/face_recipe.md, "One network: the descriptor inside the graph"
    one = groups["one network: iresnet_tiny + LTP in one graph (lfw_dev_val_onefile.yaml)"]
    assert one.seeds == (0, 1, 2) and by_label[one.label] == [90.89, 89.90, 89.64]
    assert 100 * one.mean == pytest.approx(90.14, abs=0.006)
    assert 100 * one.sd == pytest.approx(0.66, abs=0.006)
    # the same section, "Each cell its own basis, half the grid": the preset's descriptor now
    cells = groups[
        "one network, a basis a cell and half the grid, 20:600 (lfw_dev_val_onefile.yaml now)"
    ]
    assert cells.seeds == (0, 1, 2) and by_label[cells.label] == [90.19, 90.26, 89.31]
    assert 100 * cells.mean == pytest.approx(89.92, abs=0.006)
    assert 100 * cells.sd == pytest.approx(0.53, abs=0.006)


@pytest.mark.parametrize(
    "record, message",
    [
        ({k: v for k, v in _record().items() if k != "steps"}, "run 0: missing 'steps'"),
        (_record(pair_accuracy=0.9), "must be the mean of the two folds"),
        (_record(fold_accuracies=[0.8467]), "two folds or null"),
        (_record(pair_auc=1.5, fold_accuracies=None), "are fractions"),
        (_record(accuracy=0.9), r"unknown keys \['accuracy'\]"),
        (_record(train_min=0), "train_min > 0"),
        (_record(steps="3200"), "'steps' must be int"),
    ],
)
def test_bad_records_are_refused_naming_the_run_and_key(curve, record, message):
    with pytest.raises(ValueError, match=message):
        curve.parse_runs([record], "runs.json")


def test_runs_without_fold_values_plot(curve, tmp_path):
    runs = curve.parse_runs([_record(fold_accuracies=None), _record(seed=1, pair_accuracy=0.8315,
                             fold_accuracies=[0.8403, 0.8227])])  # fmt: skip
    assert runs[0].fold_accuracies is None and runs[1].fold_accuracies == (0.8403, 0.8227)
    out = curve.plot(runs, tmp_path / "curve.png")
    assert out.stat().st_size > 10_000
