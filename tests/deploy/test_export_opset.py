"""``export --opset`` is honoured, and every export loads on the oldest declared onnxruntime."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from partialfc.deploy import Embedder
from partialfc.deploy.export import ORT_FLOOR, ORT_MAX_IR_VERSION, export_backbone

REPO = Path(__file__).resolve().parents[2]


def test_ort_floor_matches_the_declared_dependency():
    text = (REPO / "pyproject.toml").read_text()
    declared = re.search(r'"onnxruntime>=([0-9.]+)"', text).group(1)
    assert ".".join(declared.split(".")[:2]) == ORT_FLOOR
    assert ORT_MAX_IR_VERSION[ORT_FLOOR] == 9


def test_default_export_reports_opset_and_an_ir_the_floor_loads(exported, caplog):
    report, out = exported
    proto = onnx.load(str(out / "backbone.onnx"))
    assert report["opset"] == 18 and report["ir_version"] == proto.ir_version == 8
    assert report["ir_version"] <= ORT_MAX_IR_VERSION[ORT_FLOOR]


@pytest.mark.parametrize(("opset", "ir_version"), [(11, 6), (18, 8)])
def test_requested_opset_is_written(
    small_model, omniglot_images, tmp_path, caplog, opset, ir_version
):
    model, spec = small_model
    with caplog.at_level(logging.WARNING):
        result = export_backbone(model, spec, tmp_path, opset=opset)
    assert not [r for r in caplog.records if "torchvision" in r.getMessage()]
    proto = onnx.load(str(result.onnx_path))
    assert [o.version for o in proto.opset_import if o.domain == ""] == [opset] == [result.opset]
    assert result.ir_version == proto.ir_version == ir_version
    assert result.max_abs_diff < 1e-4 * max(1.0, result.max_abs_output)
    images = omniglot_images[0][:5]
    onnx_e = Embedder.load(result.onnx_path).embed(images)
    torch_e = Embedder.from_module(model, spec).embed(images)
    np.testing.assert_allclose(onnx_e, torch_e, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 99])
def test_unsupported_opset_is_refused(small_model, tmp_path, opset):
    model, spec = small_model
    with pytest.raises(ValueError, match=f"--opset {opset} is not supported: choose 11-"):
        export_backbone(model, spec, tmp_path, opset=opset)
