"""benchmarks/train_allocator.py: the same short training run with freed memory kept and with
glibc's default, through the real command; both end on the same loss (the option changes where
memory comes from, never the arithmetic)."""

from tests.benchmarks.scripts import ROOT, benchmark_script


def test_both_passes_train_to_the_same_loss(tmp_path, capsys):
    out = tmp_path / "allocator.json"
    with benchmark_script("train_allocator") as script:
        argv = ["--config", str(ROOT / "configs/omniglot_cpu.yaml"), "--epochs", "0.01"]
        assert script.main([*argv, "--repeat", "1", "--out", str(out)]) == 0
    import json

    report = json.loads(out.read_text())
    kept, default = report["passes"]["kept"][0], report["passes"]["default"][0]
    assert kept["last_logged_step"] == default["last_logged_step"] == 6  # 0.01 of 602 steps
    assert kept["last_logged_loss"] == default["last_logged_loss"]
    assert report["same_last_loss"] is True
    assert report["median"]["kept"]["wall_s"] == kept["wall_s"]  # one pass: its own median
