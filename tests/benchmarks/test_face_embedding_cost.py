"""benchmarks/face_embedding_cost.py: sizes and per-face costs of an export, with and without
a fused descriptor (the numbers' consistency, not their speed)."""

import json

import numpy as np
import pytest
import torch

from partialfc.backbone.spec import PreprocessingSpec
from partialfc.deploy.export import export_backbone
from partialfc.models import build_model
from partialfc.models.lbp import LbpGrid, LbpWccnEmbedder
from tests.benchmarks.scripts import benchmark_script

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@pytest.fixture
def cost(monkeypatch):
    for name in THREAD_VARIABLES:  # the script caps them; restore them after the test
        monkeypatch.setenv(name, "2")
    threads = torch.get_num_threads()
    with benchmark_script("face_embedding_cost") as module:
        yield module
    torch.set_num_threads(threads)


@pytest.fixture
def export(tmp_path):
    torch.manual_seed(0)
    kwargs = {"embedding_dim": 16, "input_size": 32, "in_channels": 1}
    model = build_model("iresnet_tiny", **kwargs)
    spec = PreprocessingSpec(
        "iresnet_tiny", kwargs, 16, (32, 32), 1, "GREY", mean=(0.5,), std=(0.5,)
    )
    export_backbone(model, spec, tmp_path / "export")
    rng = np.random.default_rng(0)
    faces = rng.integers(0, 256, (12, 96, 96), np.uint8)
    grid = LbpGrid(scales_px=(40,), radii_px=(1,), cell_px=20, stride_px=20)
    lbp = LbpWccnEmbedder(grid, num_components=5).fit(faces, np.repeat(np.arange(4), 3))
    return tmp_path / "export", lbp.save(tmp_path / "lbp_wccn.npz")


def test_network_alone_and_fused(cost, export, tmp_path, capsys):
    folder, lbp = export
    out = tmp_path / "cost.json"
    args = ["--export", str(folder), "--faces", "6", "--batch", "4", "--repeat", "1"]
    assert cost.main([*args, "--lbp", str(lbp), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    onnx_bytes = (folder / "backbone.onnx").stat().st_size
    assert result["threads"] == 1 and result["network_input"] == [32, 32]
    assert result["flip_test_in_graph"] is False
    assert result["backbone_onnx_bytes"] == onnx_bytes
    assert result["descriptor_bytes"] == lbp.stat().st_size
    assert result["deployed_bytes"] == onnx_bytes + lbp.stat().st_size
    assert result["descriptor_mirror_averaged"] is True
    network, descriptor = result["network_with_flip_ms_per_face"], result["descriptor_ms_per_face"]
    assert network > 0 and descriptor > 0
    assert result["fused_ms_per_face"] == pytest.approx(network + descriptor, abs=2e-3)
    capsys.readouterr()
    assert cost.main(args) == 0  # the network alone: no descriptor keys, its own size
    alone = json.loads(capsys.readouterr().out)
    assert alone["deployed_bytes"] == onnx_bytes and "descriptor_bytes" not in alone


def test_bad_arguments_are_refused(cost, export, tmp_path, capsys):
    folder, _ = export
    with pytest.raises(SystemExit):
        cost.main(["--export", str(folder), "--lbp", str(tmp_path / "missing.npz")])
    with pytest.raises(SystemExit):
        cost.main(["--export", str(folder), "--threads", "0"])
    assert cost.main(["--export", str(tmp_path), "--faces", "2"]) == 2
    assert f"{tmp_path}: no backbone.onnx" in capsys.readouterr().err


def test_a_network_with_its_flip_test_in_the_graph_runs_once_a_batch(
    cost, tmp_path, capsys, monkeypatch
):
    import onnxruntime as ort

    torch.manual_seed(0)
    kwargs = {"embedding_dim": 256 + 4, "input_size": 96, "in_channels": 1}
    model = build_model("iresnet_tiny_ltp", **kwargs).eval()
    faces = np.random.default_rng(1).integers(0, 256, (12, 1, 96, 96)) / 127.5 - 1
    model.fit_texture(torch.from_numpy(faces).float(), np.repeat(np.arange(4), 3))
    spec = PreprocessingSpec("iresnet_tiny_ltp", kwargs, 260, (96, 96), 1, "GREY", (0.5,), (0.5,))
    export_backbone(model, spec, tmp_path / "one")
    runs = []
    real_run = ort.InferenceSession.run

    def counted(self, *args, **kw):
        runs.append(1)
        return real_run(self, *args, **kw)

    monkeypatch.setattr(ort.InferenceSession, "run", counted)
    args = ["--export", str(tmp_path / "one"), "--faces", "6", "--batch", "4", "--repeat", "1"]
    assert cost.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["flip_test_in_graph"] is True and result["network_input"] == [96, 96]
    assert len(runs) == 4  # (warm-up + 1 timed pass) × 2 batches, one run each: no mirror run


def test_a_baseline_is_timed_in_the_same_passes_alternating(cost, export, tmp_path, monkeypatch):
    folder, _ = export
    order = []
    real = cost._network_runner

    def tagged(path, threads):  # record which export each timed call ran
        run, facts = real(path, threads)

        def tagged_run(b):
            order.append(path.name)
            run(b)

        return tagged_run, facts

    monkeypatch.setattr(cost, "_network_runner", tagged)
    import shutil

    shutil.copytree(folder, tmp_path / "other")
    out = tmp_path / "cost.json"
    args = ["--export", str(folder), "--baseline", str(tmp_path / "other"), "--faces", "4"]
    assert cost.main([*args, "--batch", "4", "--repeat", "3", "--out", str(out)]) == 0
    # one warm-up each, then three passes alternating (one batch a pass)
    assert order == ["export", "other"] * 4
    result = json.loads(out.read_text())
    base = result["baseline"]
    assert base["export"] == str(tmp_path / "other")
    assert base["backbone_onnx_bytes"] == result["backbone_onnx_bytes"]
    # the ratio comes from unrounded times; the reported ms are rounded to 0.001 and the ratio to
    # 0.001, so it must lie in the interval those roundings allow
    b, e = base["network_with_flip_ms_per_face"], result["network_with_flip_ms_per_face"]
    half = 5e-4
    low, high = (b - half) / (e + half) - half, (b + half) / (e - half) + half
    assert low <= result["baseline_ms_over_export_ms"] <= high
