"""Thresholds carry the SHA-256 of the weights they were calibrated on, and are refused for
other weights."""

from __future__ import annotations

import hashlib
import json
import warnings

import cv2
import numpy as np
import onnx
import pytest
import torch

from partialfc.backbone.fingerprint import MODEL_HASH_KEY, file_sha256, state_sha256
from partialfc.backbone.io import save_backbone
from partialfc.cli import main
from partialfc.deploy import (
    CalibratedThreshold,
    Embedder,
    ModelMismatchError,
    Verifier,
    check_threshold_model,
)
from partialfc.models import build_model
from tests.deploy.conftest import MODEL_CONFIG


def test_state_hash_is_the_documented_digest():
    state = {
        "b": torch.tensor([1.5, -2.0], dtype=torch.float32),
        "a": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "c": torch.tensor(3, dtype=torch.int64),  # 0-dim, like num_batches_tracked
    }
    expected = hashlib.sha256()
    for name, dtype, shape, array in (
        ("a", "int64", [2, 3], np.arange(6, dtype="<i8")),
        ("b", "float32", [2], np.array([1.5, -2.0], dtype="<f4")),
        ("c", "int64", [], np.array([3], dtype="<i8")),
    ):
        expected.update((json.dumps([name, dtype, shape]) + "\n").encode())
        expected.update(array.tobytes())
    assert state_sha256(state) == expected.hexdigest()
    changed = dict(state, b=torch.tensor([1.5, -2.0000002]))
    assert state_sha256(changed) != expected.hexdigest()
    renamed = {"x" if k == "a" else k: v for k, v in state.items()}
    assert state_sha256(renamed) != expected.hexdigest()


def test_every_stored_form_of_the_same_weights_has_the_same_hash(small_model, checkpoint, exported):
    model, _ = small_model
    expected = state_sha256(model.state_dict())
    report, out = exported
    assert report["model_sha256"] == expected
    assert Embedder.load(checkpoint).model_sha256 == expected
    assert Embedder.load(out).model_sha256 == expected
    assert Embedder.load(out, backend="onnx").model_sha256 == expected  # from the metadata
    meta = {p.key: p.value for p in onnx.load(str(out / "backbone.onnx")).metadata_props}
    assert meta[MODEL_HASH_KEY] == expected


def test_onnx_without_the_hash_is_identified_by_its_bytes(exported, tmp_path):
    proto = onnx.load(str(exported[1] / "backbone.onnx"))
    kept = [p for p in proto.metadata_props if p.key != MODEL_HASH_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    path = tmp_path / "plain.onnx"
    onnx.save_model(proto, str(path))
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert Embedder.load(path).model_sha256 == file_sha256(path)


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    """Same architecture, other (random) weights."""
    torch.manual_seed(1)
    model = build_model(MODEL_CONFIG["name"], **MODEL_CONFIG["kwargs"]).eval()
    path = tmp_path_factory.mktemp("other")
    save_backbone(model, MODEL_CONFIG, path)
    return path


@pytest.fixture(scope="module")
def folder(omniglot_images, tmp_path_factory):
    images, _ = omniglot_images
    root = tmp_path_factory.mktemp("faces")
    for c in range(4):
        (root / f"char{c}").mkdir()
        for j in range(4):
            cv2.imwrite(str(root / f"char{c}" / f"{j}.png"), images[c * 20 + j])
    return root


def test_verify_refuses_a_threshold_of_another_model(
    checkpoint, exported, other_checkpoint, folder, tmp_path, capsys
):
    t = tmp_path / "t.json"
    a, b = folder / "char0" / "0.png", folder / "char1" / "0.png"
    calibrate = ["verify", str(checkpoint), "--calibrate", str(folder), "--far", "0.1"]
    assert main([*calibrate, "--save-threshold", str(t)]) == 0
    recorded = json.loads(t.read_text())["model_sha256"]
    assert recorded == Embedder.load(checkpoint).model_sha256
    capsys.readouterr()

    # the same weights in their exported form (PyTorch and onnxruntime) are accepted
    for backend in ("torch", "onnx"):
        args = ["verify", str(exported[1]), "--backend", backend, "--threshold", str(t)]
        assert main([*args, "--pair", str(a), str(b)]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["a"] == str(a) and "warning" not in captured.err

    other_hash = Embedder.load(other_checkpoint).model_sha256
    assert other_hash != recorded
    args = ["verify", str(other_checkpoint), "--threshold", str(t), "--pair", str(a), str(b)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{t} was calibrated on the model with sha256 {recorded}" in captured.err
    assert f"{other_checkpoint} has sha256 {other_hash}" in captured.err
    assert "--allow-other-model" in captured.err

    assert main([*args, "--allow-other-model"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["b"] == str(b)
    assert "warning" in captured.err and "used anyway" in captured.err

    gallery = tmp_path / "g.npz"
    search = ["search", str(other_checkpoint), str(gallery), "--enroll", str(folder)]
    assert main([*search, "--threshold", str(t)]) == 2
    assert other_hash in capsys.readouterr().err
    assert not gallery.exists()  # refused before anything was enrolled


def test_a_threshold_without_a_hash_is_used_with_a_warning(checkpoint, folder, tmp_path, capsys):
    t = tmp_path / "old.json"
    saved = CalibratedThreshold(0.5, 0.01, 0, 0, 100, (0.0, 0.03)).to_dict()
    del saved["model_sha256"]
    saved["version"] = 1
    t.write_text(json.dumps(saved))
    a = folder / "char0" / "0.png"
    assert main(["verify", str(checkpoint), "--threshold", str(t), "--pair", str(a), str(a)]) == 0
    assert "old.json records no model hash" in capsys.readouterr().err


def test_verifier_checks_the_model(small_model, other_checkpoint):
    model, spec = small_model
    embedder = Embedder.from_module(model, spec)
    own = CalibratedThreshold(0.5, 0.01, 0, 0, 100, (0.0, 0.03), embedder.model_sha256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Verifier(embedder, own)
    other = Embedder.load(other_checkpoint)
    with pytest.raises(ModelMismatchError, match=embedder.model_sha256):
        Verifier(other, own)
    with pytest.warns(UserWarning, match="used anyway"):
        Verifier(other, own, allow_other_model=True)
    assert check_threshold_model(own, None) == (
        "the model has no hash; threshold cannot be checked against it"
    )


def test_threshold_file_with_a_malformed_hash_is_refused(tmp_path):
    t = tmp_path / "t.json"
    saved = CalibratedThreshold(0.5, 0.01, 0, 0, 100, (0.0, 0.03), "ab" * 32).to_dict()
    t.write_text(json.dumps(saved))
    assert CalibratedThreshold.load(t).model_sha256 == "ab" * 32
    t.write_text(json.dumps(dict(saved, model_sha256="xyz")))
    with pytest.raises(ValueError, match="t.json: not a calibrated threshold file: model_sha256"):
        CalibratedThreshold.load(t)
