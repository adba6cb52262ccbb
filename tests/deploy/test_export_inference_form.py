"""The exported graph writes PReLU as ``a·x + (1 − a)·relu(x)``: the same function, no ``PRelu``
node, the original weights' hash."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

from partialfc.backbone.fingerprint import MODEL_HASH_KEY, state_sha256
from partialfc.deploy.export import PReluAsRelu, export_backbone, inference_form


def _prelu_reference(x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """max(x, 0) + a · min(x, 0), slopes along dimension 1."""
    a = slope.view((-1,) + (1,) * (x.dim() - 2)) if slope.numel() > 1 else slope
    return torch.where(x > 0, x, a * x)


@pytest.mark.parametrize("shape", [(3, 5, 4, 4), (6, 5), (2, 5, 7)])
@pytest.mark.parametrize("num_parameters", [1, 5])
def test_prelu_as_relu_is_prelu(shape, num_parameters):
    torch.manual_seed(0)
    prelu = nn.PReLU(num_parameters)
    with torch.no_grad():  # slopes outside [0, 1] too: max(x, a·x) would not be PReLU there
        prelu.weight.copy_(torch.linspace(-1.2, 1.6, num_parameters))
    x = torch.randn(shape, dtype=torch.float64)
    x[0].flatten()[0] = 0.0
    expected = _prelu_reference(x, prelu.weight.detach().double())
    got = PReluAsRelu(prelu).double()(x)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(prelu.double()(x), expected, rtol=1e-12, atol=1e-12)


def test_inference_form_replaces_every_prelu_and_leaves_the_model_alone():
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.PReLU(4), nn.Sequential(nn.Conv2d(4, 4, 1), nn.PReLU())
    )
    before = state_sha256(model.state_dict())
    converted = inference_form(model)
    assert sum(isinstance(m, nn.PReLU) for m in model.modules()) == 2
    assert not any(isinstance(m, nn.PReLU) for m in converted.modules())
    assert sum(isinstance(m, PReluAsRelu) for m in converted.modules()) == 2
    assert state_sha256(model.state_dict()) == before
    x = torch.randn(2, 1, 9, 9)
    torch.testing.assert_close(converted(x), model(x), rtol=0, atol=1e-6)


def test_export_has_no_prelu_node_and_records_the_original_hash(small_model, tmp_path):
    model, spec = small_model
    assert any(isinstance(m, nn.PReLU) for m in model.modules())
    result = export_backbone(model, spec, tmp_path)
    proto = onnx.load(str(result.onnx_path))
    ops = {node.op_type for node in proto.graph.node}
    assert "PRelu" not in ops and "Relu" in ops
    metadata = {p.key: p.value for p in proto.metadata_props}
    assert metadata[MODEL_HASH_KEY] == state_sha256(model.state_dict()) == result.model_sha256
    assert result.max_abs_diff < 1e-5 * max(1.0, result.max_abs_output)
