"""The committed equality results of ``benchmarks/arcface_torch_weights.py`` and the docs table
that quotes them."""

from __future__ import annotations

import json
import re

import torch
from torch import nn

from partialfc.tools.arcface_torch.weights import NETWORKS
from tests.benchmarks.scripts import ROOT, benchmark_script

RESULTS = ROOT / "benchmarks" / "results" / "arcface_torch_weights.json"
DOC = ROOT / "docs" / "migration" / "weights.md"


def test_every_network_has_a_row_and_every_run_one_meets_the_target():
    report = json.loads(RESULTS.read_text())
    rows = {row["network"]: row for row in report["networks"]}
    assert sorted(rows) == sorted(NETWORKS)
    for name, row in rows.items():
        assert row["partialfc_model"] == NETWORKS[name]
        if "not_run" in row:
            assert "parameters" in row["not_run"]  # says why, not skipped silently
            continue
        assert row["inputs"] >= 100
        assert row["min_cosine"] >= report["target_min_cosine"] == 0.99999
        assert row["max_abs_delta"] <= 1e-4 * row["max_abs_embedding"]
    assert report["all_run_passed"]


def test_the_docs_table_quotes_the_results():
    report = json.loads(RESULTS.read_text())
    text = DOC.read_text()
    for row in report["networks"]:
        line = re.search(rf"^\| `{row['network']}` \| `{row['partialfc_model']}` \|.*$", text, re.M)
        assert line, row["network"]
        if "min_cosine" in row:
            assert f"| 1 − {1 - row['min_cosine']:.0e} |" in line.group(0)
            assert f"| {row['tensors']} |" in line.group(0)


def test_randomised_batch_norm_statistics_change_the_function():
    with benchmark_script("arcface_torch_weights") as script:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
        x = torch.randn(2, 3, 6, 6)
        script.randomise(model, torch.Generator().manual_seed(0))
        bn = model[1]
        assert not torch.equal(bn.running_mean, torch.zeros(4))
        assert not torch.equal(bn.running_var, torch.ones(4))
        assert ((bn.running_var >= 0.5) & (bn.running_var <= 1.5)).all()
        plain = nn.functional.batch_norm(model[0](x), torch.zeros(4), torch.ones(4), eps=1e-5)
        assert not torch.allclose(model(x), plain)
