"""Export a backbone (the classifier dropped) to ONNX and safetensors with its preprocessing spec.

``export_backbone(model, spec, out_dir)`` writes, each file atomically::

    out_dir/backbone.onnx           dynamic batch axis; input "images" (N, C, H, W) float32,
                                    output "embeddings" (N, d), unnormalised; the spec JSON is
                                    also in the ONNX metadata (key "partialfc.preprocessing"),
                                    with the weights' SHA-256 (key "partialfc.model_sha256",
                                    :mod:`partialfc.backbone.fingerprint`)
    out_dir/backbone.safetensors    the backbone state dict (spec JSON in its metadata too)
    out_dir/preprocessing.json      the PreprocessingSpec

and then runs onnxruntime and PyTorch on the same random images (a batch size different from
the one traced, so the dynamic axis is exercised) and reports the max absolute difference.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from partialfc.atomic import atomic_output
from partialfc.backbone.fingerprint import MODEL_HASH_KEY, state_sha256
from partialfc.backbone.io import METADATA_KEY, ONNX_FILENAME, WEIGHTS_FILENAME, save_weights
from partialfc.backbone.spec import SPEC_FILENAME, PreprocessingSpec

INPUT_NAME, OUTPUT_NAME = "images", "embeddings"


class ExportCheckError(RuntimeError):
    """onnxruntime and PyTorch disagree beyond the tolerance."""


class PReluAsRelu(nn.Module):
    """The function of an ``nn.PReLU`` written for inference graphs:
    ``PReLU(x) = a·x + (1 − a)·max(x, 0)`` per channel (He et al., ICCV 2015, Eq. 1 rearranged).

    The same values as ``PReLU`` (to float rounding), as ``Mul``/``Relu``/``Add`` nodes that
    onnxruntime keeps in its blocked convolution layout, where a ``PRelu`` node forces a layout
    round trip on every call (an exported ``iresnet_tiny`` runs about 30 % faster).
    """

    def __init__(self, prelu: nn.PReLU):
        super().__init__()
        slope = prelu.weight.detach().clone().float()
        self.register_buffer("slope", slope)
        self.register_buffer("relu_gain", 1.0 - slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # nn.PReLU applies its slopes along dimension 1
        shape = (-1,) + (1,) * (x.dim() - 2) if self.slope.numel() > 1 else (1,)
        return x * self.slope.view(shape) + torch.relu(x) * self.relu_gain.view(shape)


def inference_form(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``nn.PReLU`` replaced by :class:`PReluAsRelu` (the graph
    :func:`save_onnx` traces); ``model`` is not modified."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.PReLU):
                setattr(module, child_name, PReluAsRelu(child))
    return model


@dataclass(frozen=True)
class ExportResult:
    onnx_path: Path
    weights_path: Path
    spec_path: Path
    max_abs_diff: float | None  # onnxruntime vs PyTorch on the check batch (None: not checked)
    max_abs_output: float | None  # scale of the outputs the difference is measured against
    check_batch: int
    opset: int | None = None  # ai.onnx opset of the ONNX file
    ir_version: int | None = None  # its IR version (onnxruntime 1.16-1.17 load IR <= 9)
    model_sha256: str | None = None  # the weights' hash, recorded by calibrated thresholds

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


# The newest ONNX IR version each onnxruntime release loads (onnxruntime's compatibility
# table); the package declares onnxruntime>=1.16, so exports must stay at IR <= 9.
ORT_MAX_IR_VERSION = {"1.16": 9, "1.17": 9, "1.18": 10, "1.19": 10, "1.20": 10}
ORT_FLOOR = "1.16"
MIN_OPSET = 11
DYNAMO_MIN_OPSET = 18  # the torch.export-based exporter writes opset 18 and later natively


class _DropTorchvisionNotice(logging.Filter):
    """The exporter's op registry logs one warning per torchvision op when torchvision is not
    installed; backbones use none of them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("torchvision is not installed")


def save_onnx(model: nn.Module, spec: PreprocessingSpec, path: Path, opset: int = 18) -> None:
    """Trace ``model`` (eval, CPU, fp32) to ONNX with a dynamic batch axis (atomic), in its
    :func:`inference_form` (PReLU as ``Mul``/``Relu``/``Add``).

    Opset 18 and later use the ``torch.export`` exporter; opsets 11-17 the TorchScript
    exporter, which writes them natively. The file's opset is checked to be ``opset``, and its
    IR version is the lowest one that opset needs (IR 8 for opset 18), so the export loads on
    every onnxruntime the package supports.
    """
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ValueError(f"--opset {opset} is not supported: choose {MIN_OPSET}-{newest}")
    model_sha256 = state_sha256(model.state_dict())
    model = inference_form(model)
    example = torch.zeros(2, spec.in_channels, *spec.input_size)
    registry_logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    notice = _DropTorchvisionNotice()
    registry_logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if opset >= DYNAMO_MIN_OPSET:
                program = torch.onnx.export(
                    model,
                    (example,),
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
                    opset_version=opset,
                    dynamo=True,
                    verbose=False,
                )
                proto = program.model_proto
            else:
                buffer = io.BytesIO()
                torch.onnx.export(
                    model,
                    (example,),
                    buffer,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                    opset_version=opset,
                    dynamo=False,
                )
                proto = onnx.load_from_string(buffer.getvalue())
    finally:
        registry_logger.removeFilter(notice)
    written = onnx_opset(proto)
    if written != opset:
        raise ValueError(f"the exporter wrote opset {written}, not the requested {opset}")
    proto.ir_version = onnx.helper.find_min_ir_version_for(list(proto.opset_import))
    for node in proto.graph.node:  # the exporter's debug notes (stack traces): not for running
        del node.metadata_props[:]
    onnx.checker.check_model(proto)
    for key, value in (
        (METADATA_KEY, spec.to_json()),
        (MODEL_HASH_KEY, model_sha256),
    ):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    with atomic_output(path) as tmp:
        onnx.save_model(proto, str(tmp))


def onnx_opset(proto) -> int:
    """The default-domain (``ai.onnx``) opset of a ModelProto."""
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def check_onnx(model: nn.Module, spec: PreprocessingSpec, onnx_path: Path, batch: int = 3):
    """``(max |ORT − torch|, max |torch|)`` on ``batch`` random uint8 images."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    shape = (batch, *spec.input_size) + ((3,) if spec.in_channels == 3 else ())
    x = spec.preprocess(rng.integers(0, 256, size=shape, dtype=np.uint8))
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    if got.shape != expected.shape:
        raise ExportCheckError(f"{onnx_path}: output shape {got.shape} != {expected.shape}")
    return float(np.abs(got - expected).max()), float(np.abs(expected).max())


def export_backbone(
    model: nn.Module,
    spec: PreprocessingSpec,
    out_dir: str | os.PathLike,
    opset: int = 18,
    check: bool = True,
    rtol: float = 1e-4,
) -> ExportResult:
    """Write ONNX + safetensors + preprocessing.json to ``out_dir`` and check ORT vs torch.

    ``model`` is not modified (a CPU eval-mode copy is exported). Raises ExportCheckError if
    ``max |ORT − torch| > rtol · max(1, max |torch|)``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(model).cpu().float().eval()
    model = model.to(memory_format=torch.contiguous_format)
    embedding_dim = getattr(model, "embedding_dim", spec.embedding_dim)
    if embedding_dim != spec.embedding_dim:
        raise ValueError(f"spec embedding_dim {spec.embedding_dim} != model's {embedding_dim}")

    weights_path, onnx_path = out_dir / WEIGHTS_FILENAME, out_dir / ONNX_FILENAME
    spec_path = out_dir / SPEC_FILENAME
    save_weights(model, weights_path, spec)
    save_onnx(model, spec, onnx_path, opset)
    spec.save(spec_path)
    diff = scale = None
    batch = 3
    if check:
        diff, scale = check_onnx(model, spec, onnx_path, batch)
        if diff > rtol * max(1.0, scale):
            raise ExportCheckError(
                f"{onnx_path}: onnxruntime differs from PyTorch by {diff:.3g} "
                f"(outputs up to {scale:.3g}; tolerance {rtol:g} relative)"
            )
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    return ExportResult(
        onnx_path,
        weights_path,
        spec_path,
        diff,
        scale,
        batch,
        onnx_opset(proto),
        proto.ir_version,
        state_sha256(model.state_dict()),
    )


def export_checkpoint(
    checkpoint: str | os.PathLike, out_dir: str | os.PathLike, weights: str = "auto", **kwargs
):
    """Export the backbone of a training checkpoint (or the newest one of a run folder).

    ``weights``: ``auto`` (default: the EMA weights when the run kept them, ``train.ema_decay``,
    else the trained ones), ``ema`` or ``raw``.
    """
    from partialfc.backbone.io import load_backbone_from_checkpoint

    model, model_config = load_backbone_from_checkpoint(checkpoint, weights)
    spec = PreprocessingSpec.from_model_config(model_config)
    return export_backbone(model, spec, out_dir, **kwargs)


def read_onnx_spec(onnx_path: str | os.PathLike) -> PreprocessingSpec | None:
    """The spec stored in an exported ONNX file's metadata, or None if it has none."""
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    for entry in proto.metadata_props:
        if entry.key == METADATA_KEY:
            return PreprocessingSpec.from_dict(json.loads(entry.value), str(onnx_path))
    return None
