"""The stored forms of a backbone: one weight format for checkpoints and exports.

A training checkpoint directory holds ``backbone.safetensors`` (the state dict) and
``model.json`` (``{"name": ..., "kwargs": {...}}``, the :func:`partialfc.models.build_model`
call that rebuilds it); an exported directory holds the same ``backbone.safetensors`` with a
``preprocessing.json`` (:class:`partialfc.backbone.spec.PreprocessingSpec`) instead. Weights are
safetensors everywhere, so loading never unpickles. Training checkpoints of a run are
``<run>/checkpoints/step-%08d`` directories; :func:`newest_checkpoint` finds the last one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from partialfc.atomic import atomic_output, atomic_write_bytes

if TYPE_CHECKING:
    from partialfc.backbone.spec import PreprocessingSpec

WEIGHTS_FILENAME = "backbone.safetensors"
MODEL_CONFIG_FILENAME = "model.json"
ONNX_FILENAME = "backbone.onnx"
METADATA_KEY = "partialfc.preprocessing"  # the spec JSON in ONNX / safetensors metadata
EMA_DIRNAME = "ema"  # a checkpoint's EMA weights (train.ema_decay): backbone + model.json
WEIGHT_CHOICES = ("auto", "ema", "raw")
CHECKPOINT_PATTERN = re.compile(r"^step-(\d{8})$")

__all__ = [
    "CHECKPOINT_PATTERN",
    "EMA_DIRNAME",
    "WEIGHT_CHOICES",
    "METADATA_KEY",
    "MODEL_CONFIG_FILENAME",
    "ONNX_FILENAME",
    "WEIGHTS_FILENAME",
    "build_backbone_from_model_config",
    "checkpoint_weights_file",
    "list_checkpoints",
    "load_backbone_from_checkpoint",
    "load_backbone_state",
    "load_weights",
    "newest_checkpoint",
    "read_model_config",
    "save_backbone",
    "save_weights",
]


def build_backbone_from_model_config(model_config: dict) -> nn.Module:
    """Rebuild a backbone from ``{"name": ..., "kwargs": {...}}`` (as stored in checkpoints)."""
    from partialfc.models import build_model

    return build_model(model_config["name"], **model_config["kwargs"])


def save_weights(model: nn.Module, path: Path, spec: PreprocessingSpec | None = None) -> None:
    """``model``'s state dict to the safetensors file ``path`` (atomic). With a ``spec`` (an
    export), the spec JSON and the weights' SHA-256 go into the file's metadata."""
    from safetensors.torch import save_file

    from partialfc.backbone.fingerprint import MODEL_HASH_KEY, state_sha256

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = None
    if spec is not None:
        metadata = {METADATA_KEY: spec.to_json(), MODEL_HASH_KEY: state_sha256(state)}
    with atomic_output(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)


def save_backbone(backbone: nn.Module, model_config: dict, directory: Path) -> None:
    """``backbone.safetensors`` + ``model.json`` in ``directory`` (each atomically)."""
    directory = Path(directory)
    save_weights(backbone, directory / WEIGHTS_FILENAME)
    atomic_write_bytes(
        directory / MODEL_CONFIG_FILENAME, json.dumps(model_config, indent=2).encode()
    )


def read_model_config(checkpoint: str | Path) -> dict:
    """The checkpoint's ``model.json``, checked (sizes against ``spec.SPEC_RANGES``) before a
    network is built from it."""
    from partialfc.backbone.spec import check_model_kwargs
    from partialfc.ranges import shown

    path = Path(checkpoint) / MODEL_CONFIG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint}: not a partialfc checkpoint (no model.json)")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read model config: {err}") from None
    if not isinstance(config, dict) or "name" not in config or "kwargs" not in config:
        raise ValueError(
            f"{path}: expected {{'name': ..., 'kwargs': {{...}}}}, got {shown(config)}"
        )
    check_model_kwargs(config["kwargs"], f"{path}: kwargs")
    return config


def load_backbone_state(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(checkpoint) / WEIGHTS_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint}: no backbone.safetensors")
    return load_file(str(path))


def load_weights(path: str | Path, model_name: str, model_kwargs: dict) -> nn.Module:
    """``build_model(model_name, **model_kwargs)`` with the safetensors state dict at ``path``
    (strict; in eval mode)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from partialfc.models import build_model

    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: cannot read weights: {err}") from None
    model = build_model(model_name, **model_kwargs)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match {model_name}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model.eval()


def list_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete checkpoints (``step-%08d`` directories) in ``checkpoint_dir``, oldest first."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    found = [p for p in checkpoint_dir.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


def newest_checkpoint(path: str | Path, marker: str = MODEL_CONFIG_FILENAME) -> Path | None:
    """``path`` itself when it holds ``marker``; else the newest checkpoint of the run folder
    ``path`` (``path/checkpoints/step-*``) or of the checkpoints folder ``path``; else None."""
    path = Path(path)
    if (path / marker).is_file():
        return path
    found = list_checkpoints(path / "checkpoints") or list_checkpoints(path)
    return found[-1] if found else None


def load_backbone_from_checkpoint(path: str | Path, weights: str = "raw") -> tuple[nn.Module, dict]:
    """Rebuild the backbone of a training checkpoint: ``(module in eval mode, model_config)``.

    ``path`` is a checkpoint directory (``.../checkpoints/step-...``) or a run folder (its newest
    checkpoint is used). ``model_config`` is ``{"name": ..., "kwargs": {...}}`` such that
    :func:`build_backbone_from_model_config` rebuilds it. ``weights``: ``raw`` (default, the
    trained weights), ``ema`` (their moving average, ``train.ema_decay``; an error when the
    checkpoint has none) or ``auto`` (the EMA weights when present).
    """
    found = newest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no checkpoint (model.json) found")
    model_config = read_model_config(found)
    chosen = found / checkpoint_weights_file(found, weights)
    return load_weights(chosen, **_as_weights_args(model_config)), model_config


def checkpoint_weights_file(checkpoint: Path, weights: str) -> str:
    """The weights file of ``checkpoint`` (relative) that ``weights`` (WEIGHT_CHOICES) picks."""
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"weights={weights!r}: choose one of {', '.join(WEIGHT_CHOICES)}")
    ema = f"{EMA_DIRNAME}/{WEIGHTS_FILENAME}"
    has_ema = (Path(checkpoint) / ema).is_file()
    if weights == "ema" and not has_ema:
        raise FileNotFoundError(f"{checkpoint}: no EMA weights (trained without train.ema_decay)")
    return ema if has_ema and weights != "raw" else WEIGHTS_FILENAME


def _as_weights_args(model_config: dict) -> dict:
    return {"model_name": model_config["name"], "model_kwargs": model_config["kwargs"]}
