"""arcface_torch backbone weights → partialfc model directory (``partialfc import-weights``).

The key map is pinned without an InsightFace checkout: the arcface_torch key list of each
IResNet is generated here from its layer counts (IBasicBlock: bn1, conv1, bn2, prelu, conv2,
bn3, downsample on a stage's first block) and must map onto partialfc's state dict, name and
shape; an independent functional forward over the arcface_torch names gives the converted
model's embedding. With ``PARTIALFC_INSIGHTFACE`` set to a checkout, the networks are also
compared against InsightFace's own modules (``benchmarks/arcface_torch_weights.py``).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from partialfc.backbone.embedder import Embedder
from partialfc.cli import main
from partialfc.models import build_model
from partialfc.tools.arcface_torch.weights import (
    NETWORKS,
    WeightsError,
    arcface_key,
    convert_state_dict,
    import_weights,
    iresnet_key,
    partialfc_key,
    read_state_dict,
)

IRESNET_LAYERS = {
    "r18": (2, 2, 2, 2),
    "r34": (3, 4, 6, 3),
    "r50": (3, 4, 14, 3),
    "r100": (3, 13, 30, 3),
    "r200": (6, 26, 60, 6),
    "r2060": (3, 128, 896, 3),
}
BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def arcface_iresnet_keys(layers) -> list[str]:
    """arcface_torch's IResNet state-dict keys, in its order, written out from the layout."""
    keys = ["conv1.weight", *(f"bn1.{k}" for k in BN), "prelu.weight"]
    for stage, blocks in enumerate(layers, start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            keys += [*(f"{p}.bn1.{k}" for k in BN), f"{p}.conv1.weight"]
            keys += [*(f"{p}.bn2.{k}" for k in BN), f"{p}.prelu.weight", f"{p}.conv2.weight"]
            keys += [f"{p}.bn3.{k}" for k in BN]
            if b == 0:
                keys += [f"{p}.downsample.0.weight", *(f"{p}.downsample.1.{k}" for k in BN)]
    keys += [*(f"bn2.{k}" for k in BN), "fc.weight", "fc.bias"]
    return keys + [f"features.{k}" for k in BN]


def on_meta(name: str, **kwargs):
    with torch.device("meta"):
        return build_model(name, **kwargs)


def arcface_state(network: str, seed: int = 0, embedding_size: int = 512) -> dict:
    """Random weights (random BN statistics too) under arcface_torch's names."""
    torch.manual_seed(seed)
    model = build_model(NETWORKS[network], embedding_dim=embedding_size)
    state = {}
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            value = torch.randn_like(value) * 0.05 + (1.0 if "running_var" in key else 0.0)
            value = value.abs() if "running_var" in key else value
        state[arcface_key(network, key)] = value
    return state


# ------------------------------------------------------------------------- the key map


def test_r50_has_475_keys_and_explicit_pairs():
    keys = arcface_iresnet_keys(IRESNET_LAYERS["r50"])
    assert len(keys) == 475
    pairs = {
        "conv1.weight": "stem.0.weight",
        "bn1.running_var": "stem.1.running_var",
        "prelu.weight": "stem.2.weight",
        "layer1.0.bn1.weight": "stages.0.0.residual.0.weight",
        "layer1.0.conv1.weight": "stages.0.0.residual.1.weight",
        "layer3.13.bn2.running_mean": "stages.2.13.residual.2.running_mean",
        "layer3.13.prelu.weight": "stages.2.13.residual.3.weight",
        "layer4.2.conv2.weight": "stages.3.2.residual.4.weight",
        "layer4.2.bn3.bias": "stages.3.2.residual.5.bias",
        "layer2.0.downsample.0.weight": "stages.1.0.shortcut.0.weight",
        "layer2.0.downsample.1.num_batches_tracked": "stages.1.0.shortcut.1.num_batches_tracked",
        "bn2.weight": "head.bn.weight",
        "fc.bias": "head.fc.bias",
        "features.weight": "head.features.weight",
    }
    for theirs, ours in pairs.items():
        assert iresnet_key(theirs) == ours
        assert arcface_key("r50", ours) == theirs


@pytest.mark.parametrize("network", sorted(IRESNET_LAYERS))
def test_every_iresnet_key_maps_onto_partialfc_by_name_and_shape(network):
    ours = on_meta(NETWORKS[network]).state_dict()
    theirs = arcface_iresnet_keys(IRESNET_LAYERS[network])
    mapped = [partialfc_key(network, k) for k in theirs]
    assert sorted(mapped) == sorted(ours)  # one to one, nothing left over
    assert mapped == list(ours)  # and the same order: the networks are the same
    assert [arcface_key(network, k) for k in ours] == theirs  # the inverse, round trip
    assert ours["stem.0.weight"].shape == (64, 3, 3, 3)
    assert ours["head.fc.weight"].shape == (512, 512 * 7 * 7)


def test_iresnet_keys_outside_the_layout_are_not_mapped():
    for key in ("layer1.0.bn4.weight", "layer1.0.downsample.2.weight", "head.weight", "x"):
        assert iresnet_key(key) is None


@pytest.mark.parametrize(
    "network,keys",
    # hand counts: ConvUnit 7 (conv, BN ×5, PReLU) or 6 (linear); bottleneck 7 + 7 + 6 = 20;
    # mbf 7 + 7 + 20 + 4·20 + 20 + 6·20 + 20 + 2·20 + conv_sep 7 + GDC (6 + FC 1 + BN 5) = 333;
    # mbf_large 7 + 2·20 + 20 + 8·20 + 20 + 12·20 + 20 + 4·20 + 7 + 12 = 606;
    # ViT: patch 2 + pos 1 + blocks × 11 + norm 2 + feature 12 (+ mask_token in arcface_torch)
    [
        ("mbf", 333),
        ("mbf_large", 606),
        ("vit_t", 149),
        ("vit_s_dp005_mask_0", 149),
        ("vit_b", 281),
        ("vit_h", 545),
    ],
)
def test_mbf_and_vit_keys_are_arcface_torch_names(network, keys):
    state = on_meta(NETWORKS[network]).state_dict()
    assert len(state) == keys
    assert all(partialfc_key(network, k) == k for k in state)
    if network.startswith("vit"):
        assert partialfc_key(network, "mask_token") is None
        assert {"patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "feature.3.bias"} <= set(
            state
        )
        assert "blocks.0.attn.qkv.bias" not in state  # arcface_torch: qkv_bias=False
    elif network == "mbf":
        assert {"layers.1.layers.0.weight", "conv_sep.layers.2.weight"} <= set(state)
        assert state["layers.1.layers.0.weight"].shape == (128, 2, 3, 3)  # 64 groups
    else:  # mbf_large: a stride-1 stage of two bottlenecks (256 -> 128 -> 256) after the stem
        assert state["layers.1.layers.1.layers.0.layers.0.weight"].shape == (128, 256, 1, 1)


# --------------------------------------------------------------- the converted function


def arcface_iresnet_forward(state: dict, x: torch.Tensor, layers) -> torch.Tensor:
    """arcface_torch's IResNet, eval mode, written as functions over its own key names."""

    def bn(t, p):
        args = (state[f"{p}.running_mean"], state[f"{p}.running_var"], state[f"{p}.weight"])
        return F.batch_norm(t, *args, state[f"{p}.bias"], training=False, eps=1e-5)

    x = F.prelu(bn(F.conv2d(x, state["conv1.weight"], padding=1), "bn1"), state["prelu.weight"])
    for stage, blocks in enumerate(layers, start=1):
        for b in range(blocks):
            p, stride = f"layer{stage}.{b}", 2 if b == 0 else 1
            out = F.conv2d(bn(x, f"{p}.bn1"), state[f"{p}.conv1.weight"], padding=1)
            out = F.prelu(bn(out, f"{p}.bn2"), state[f"{p}.prelu.weight"])
            out = bn(
                F.conv2d(out, state[f"{p}.conv2.weight"], stride=stride, padding=1), f"{p}.bn3"
            )
            if b == 0:
                shortcut = F.conv2d(x, state[f"{p}.downsample.0.weight"], stride=stride)
                x = out + bn(shortcut, f"{p}.downsample.1")
            else:
                x = out + x
    x = F.linear(bn(x, "bn2").flatten(1), state["fc.weight"], state["fc.bias"])
    return bn(x, "features")


def test_converted_r18_computes_arcface_torch_r18():
    state = arcface_state("r18", seed=3)
    model = build_model("iresnet18").eval()
    model.load_state_dict(convert_state_dict("r18", state, 512))
    x = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = arcface_iresnet_forward(state, x, IRESNET_LAYERS["r18"])
        got = model(x)
    assert expected.abs().max() > 0.1  # a real signal, not a vanishing one
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------ reading files


def test_bare_state_dict_checkpoint_dict_ddp_prefix_and_safetensors_read_alike(tmp_path):
    from safetensors.torch import save_file

    state = arcface_state("mbf")
    torch.save(state, tmp_path / "backbone.pth")
    ddp = {f"module.{k}": v for k, v in state.items()}
    torch.save({"epoch": 3, "state_dict_backbone": ddp, "global_step": 9}, tmp_path / "ckpt.pt")
    save_file(state, str(tmp_path / "model.safetensors"))
    for name in ("backbone.pth", "ckpt.pt", "model.safetensors"):
        loaded = read_state_dict(tmp_path / name)
        assert sorted(loaded) == sorted(state)  # safetensors stores keys sorted
        assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_half_precision_weights_become_float32():
    state = {k: v.half() if v.is_floating_point() else v for k, v in arcface_state("mbf").items()}
    converted = convert_state_dict("mbf", state, 512)
    assert converted["conv_sep.layers.0.weight"].dtype == torch.float32
    assert converted["conv_sep.layers.1.num_batches_tracked"].dtype == torch.int64


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this-must-not-run",))


def _refused(tmp_path, capsys, weights, network, match, *extra):
    out = tmp_path / "out"
    assert (
        main(["import-weights", str(weights), "--network", network, "--output", str(out), *extra])
        == 2
    )
    err = capsys.readouterr().err
    assert match in err, err
    assert str(weights) in err or "--output" in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging
    return err


def test_pickle_with_code_is_refused_and_never_run(tmp_path, capsys):
    weights = tmp_path / "evil.pth"
    torch.save({"conv1.weight": torch.zeros(1), "payload": _RunsCode()}, weights)
    err = _refused(tmp_path, capsys, weights, "r18", "refused")
    assert "weights_only=True" in err and "GLOBAL" in err
    assert "this-must-not-run" not in capsys.readouterr().out
    with open(tmp_path / "raw.pkl", "wb") as f:  # a plain pickle, not a torch zip
        pickle.dump({"x": _RunsCode()}, f, protocol=2)
    _refused(tmp_path, capsys, tmp_path / "raw.pkl", "r18", "refused")


def test_truncated_missing_and_non_state_dict_files_are_clear_errors(tmp_path, capsys):
    torch.save(arcface_state("mbf"), tmp_path / "full.pth")
    data = (tmp_path / "full.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    _refused(tmp_path, capsys, tmp_path / "cut.pth", "mbf", "truncated")
    _refused(tmp_path, capsys, tmp_path / "none.pth", "mbf", "no such weights file")
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    _refused(tmp_path, capsys, tmp_path / "list.pth", "mbf", "expected a state dict")
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}junk")
    _refused(tmp_path, capsys, tmp_path / "bad.safetensors", "mbf", "not a readable safetensors")


def test_weights_of_another_network_name_the_first_wrong_key(tmp_path, capsys):
    torch.save(arcface_state("r18"), tmp_path / "r18.pth")
    err = _refused(
        tmp_path, capsys, tmp_path / "r18.pth", "r34", "missing key 'layer1.2.bn1.weight'"
    )
    assert "is --network right?" in err
    torch.save(arcface_state("r34"), tmp_path / "r34.pth")
    _refused(tmp_path, capsys, tmp_path / "r34.pth", "r18", "unexpected key 'layer1.2.bn1.weight'")
    _refused(tmp_path, capsys, tmp_path / "r18.pth", "mbf", "unexpected key 'conv1.weight'")


def test_a_mis_shaped_key_is_named_with_both_shapes(tmp_path, capsys):
    torch.save(arcface_state("mbf", embedding_size=128), tmp_path / "mbf128.pth")
    err = _refused(
        tmp_path,
        capsys,
        tmp_path / "mbf128.pth",
        "mbf",
        "key 'features.layers.2.weight' has shape (128, 512)",
        "--embedding-size",
        "512",
    )
    assert "expects (512, 512)" in err and "--embedding-size 128" in err


def test_unknown_network_and_a_used_output_are_refused(tmp_path, capsys):
    torch.save(arcface_state("mbf"), tmp_path / "w.pth")
    with pytest.raises(WeightsError, match="'r101': not an arcface_torch network; choose"):
        import_weights(tmp_path / "w.pth", "r101", tmp_path / "x")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(WeightsError, match="exists and is not an empty directory"):
        import_weights(tmp_path / "w.pth", "mbf", used)
    assert [p.name for p in used.iterdir()] == ["keep.txt"]


# ------------------------------------------------------------- the model directory, used


@pytest.fixture(scope="module")
def imported_mbf(tmp_path_factory):
    """An arcface_torch mbf (64-d) imported with the command; its arcface-named weights."""
    root = tmp_path_factory.mktemp("mbf")
    state = arcface_state("mbf", seed=5, embedding_size=64)
    torch.save(state, root / "backbone.pth")
    args = ["import-weights", str(root / "backbone.pth"), "--network", "mbf"]
    assert main([*args, "--output", str(root / "model")]) == 0
    return root / "model", state


def test_the_directory_holds_insightface_preprocessing(imported_mbf):
    model_dir, _ = imported_mbf
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "backbone.safetensors", "model.json", "preprocessing.json"
    ]  # fmt: skip
    config = json.loads((model_dir / "model.json").read_text())
    assert config == {"name": "arcface_mbf", "kwargs": {"embedding_dim": 64, "input_size": 112}}
    spec = json.loads((model_dir / "preprocessing.json").read_text())
    assert (spec["input_size"], spec["colour_order"], spec["mean"], spec["std"]) == (
        [112, 112], "RGB", [0.5] * 3, [0.5] * 3
    )  # fmt: skip


def test_embedder_gives_the_converted_network_on_insightface_input(imported_mbf):
    model_dir, state = imported_mbf
    model = build_model("arcface_mbf", embedding_dim=64).eval()
    model.load_state_dict(convert_state_dict("mbf", state, 64))
    images = np.random.default_rng(0).integers(0, 256, (3, 112, 112, 3), dtype=np.uint8)
    x = (torch.from_numpy(images).permute(0, 3, 1, 2).float() - 127.5) / 127.5  # insightface
    with torch.no_grad():
        expected = model(x).numpy()
    got = Embedder.load(model_dir).embed_raw(images)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_embed_and_export_commands_accept_the_directory(imported_mbf, tmp_path):
    from PIL import Image

    model_dir, _ = imported_mbf
    rng = np.random.default_rng(1)
    for identity in ("a", "b"):
        (tmp_path / "faces" / identity).mkdir(parents=True)
        for i in range(2):
            image = rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / "faces" / identity / f"{i}.png")
    out = tmp_path / "e.npz"
    assert main(["embed", str(model_dir), str(tmp_path / "faces"), "--out", str(out)]) == 0
    assert np.load(out)["embeddings"].shape == (4, 64)
    assert main(["export", str(model_dir), str(tmp_path / "onnx")]) == 0
    onnx_dir = Embedder.load(tmp_path / "onnx", backend="onnx")
    images = rng.integers(0, 256, (2, 112, 112, 3), dtype=np.uint8)
    np.testing.assert_allclose(
        onnx_dir.embed_raw(images), Embedder.load(model_dir).embed_raw(images), atol=1e-4
    )
    gallery = tmp_path / "g.npz"
    assert main(["search", str(model_dir), str(gallery), "--enroll", str(tmp_path / "faces")]) == 0
    assert gallery.is_file()


# ----------------------------------------------------- against InsightFace's own modules


INSIGHTFACE = os.environ.get("PARTIALFC_INSIGHTFACE")


@pytest.mark.skipif(not INSIGHTFACE, reason="set PARTIALFC_INSIGHTFACE to an insightface checkout")
@pytest.mark.parametrize("network", ["r18", "mbf", "vit_t"])
def test_equal_to_insightface_modules(network, tmp_path):
    from tests.benchmarks.scripts import benchmark_script

    with benchmark_script("arcface_torch_weights") as script:
        get_model = script.import_get_model(Path(INSIGHTFACE))
        row = script.compare(get_model, network, inputs=4, batch=4, workdir=tmp_path, seed=0)
    assert row["min_cosine"] >= 0.99999, row


def test_eval_command_accepts_the_directory(imported_mbf, tmp_path):
    import io

    from PIL import Image

    from partialfc.data.verification_bin import write_verification_bin

    model_dir, _ = imported_mbf
    rng = np.random.default_rng(2)
    images = []
    for _ in range(40):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)).save(buffer, "PNG")
        images.append(buffer.getvalue())
    write_verification_bin(tmp_path / "tiny.bin", images, [True, False] * 10)
    out = tmp_path / "report"
    assert (
        main(["eval", str(model_dir), "--bin", str(tmp_path / "tiny.bin"), "--out", str(out)]) == 0
    )
    assert "tiny" in (out / "results.json").read_text()
