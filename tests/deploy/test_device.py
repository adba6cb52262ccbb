"""``--device``: cpu, cuda, cuda:N for the torch and ONNX backends, with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partialfc.backbone.devices import ort_providers, parse_device
from partialfc.cli import main
from partialfc.deploy import Embedder

NO_CUDA = "no CUDA device on this machine"


def test_parse_device():
    assert parse_device(None) == parse_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "cpu:1", "CUDA"):
        with pytest.raises(ValueError, match="--device"):
            parse_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_missing_cuda_is_a_clear_error(checkpoint, tmp_path, capsys):
    with pytest.raises(ValueError, match="--device cuda:1: CUDA is not available"):
        parse_device("cuda:1")
    code = main(["embed", str(checkpoint), str(tmp_path), "--out", "x.npz", "--device", "cuda"])
    assert code == 2
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err


def test_onnx_cuda_needs_the_gpu_package():
    import onnxruntime as ort

    assert ort_providers("cpu") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert ort_providers("cuda:0")[0] == ("CUDAExecutionProvider", {"device_id": 0})
    else:
        with pytest.raises(ValueError, match="install onnxruntime-gpu"):
            ort_providers("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_embeddings_match_cpu(checkpoint, exported, omniglot_images):
    images = omniglot_images[0][:64]
    cpu = Embedder.load(checkpoint).embed(images, flip=True)
    gpu = Embedder.load(checkpoint, device="cuda").embed(images, flip=True)
    np.testing.assert_allclose(gpu, cpu, atol=1e-3)
    assert next(Embedder.load(checkpoint, device="cuda:0").backend.model.parameters()).is_cuda
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        onnx_gpu = Embedder.load(exported[1], backend="onnx", device="cuda").embed(images)
        np.testing.assert_allclose(onnx_gpu, Embedder.load(checkpoint).embed(images), atol=1e-3)
