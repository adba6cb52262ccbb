"""arcface_torch backbone weights → a partialfc model directory.

InsightFace's ``arcface_torch`` saves a backbone as a bare state dict (``model.pt``,
``backbone.pth``) or inside a training checkpoint (``checkpoint_gpu_<rank>.pt``, key
``state_dict_backbone``), with ``module.`` in front of every key when it came from a
``DistributedDataParallel`` wrapper. :data:`NETWORKS` names the partialfc model that computes
the same function as each network ``arcface_torch``'s ``get_model`` builds:

* ``r18`` … ``r200``, ``r2060``: :mod:`partialfc.models.iresnet`, the same layers in the same
  order under other names (:func:`iresnet_key`: ``conv1`` → ``stem.0``,
  ``layer3.5.bn2`` → ``stages.2.5.residual.2``, ``features`` → ``head.features``, ...);
* ``mbf``, ``mbf_large``: :mod:`partialfc.models.arcface_mbf`, keys unchanged;
* ``vit_*``: :mod:`partialfc.models.arcface_vit`, keys unchanged but ``mask_token`` (used only
  by training-time token masking) is dropped.

The result is a directory ``embed``, ``eval``, ``export``, ``search`` and
``checkpoint.init_from`` read: ``backbone.safetensors`` + ``model.json`` (the training
checkpoint's form, :mod:`partialfc.backbone.io`) + ``preprocessing.json`` with InsightFace's
preprocessing, RGB 112×112 and ``(x − 127.5) / 127.5`` (mean = std = 0.5 on ``x / 255``).
Files are read with ``torch.load(weights_only=True)`` or safetensors: no code in them runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from partialfc.backbone.io import MODEL_CONFIG_FILENAME, WEIGHTS_FILENAME, save_weights
from partialfc.backbone.spec import SPEC_FILENAME, PreprocessingSpec
from partialfc.models import build_model

# arcface_torch network name (its get_model) -> partialfc model name
NETWORKS: dict[str, str] = {
    "r18": "iresnet18",
    "r34": "iresnet34",
    "r50": "iresnet50",
    "r100": "iresnet100",
    "r200": "iresnet200",
    "r2060": "iresnet2060",
    "mbf": "arcface_mbf",
    "mbf_large": "arcface_mbf_large",
    "vit_t": "arcface_vit_t",
    "vit_t_dp005_mask0": "arcface_vit_t_dp005",
    "vit_s": "arcface_vit_s",
    "vit_s_dp005_mask_0": "arcface_vit_s_dp005",
    "vit_b": "arcface_vit_b",
    "vit_b_dp005_mask_005": "arcface_vit_b_dp005",
    "vit_l_dp005_mask_005": "arcface_vit_l_dp005",
    "vit_h": "arcface_vit_h",
}
INPUT_SIZE = 112  # every arcface_torch network is built for 112×112 aligned crops
CHECKPOINT_KEY = "state_dict_backbone"  # the backbone inside checkpoint_gpu_<rank>.pt
DDP_PREFIX = "module."
DROPPED_KEYS = {"mask_token"}  # ViT: the filler of masked tokens, used only in training

_STEM = {"conv1": "stem.0", "bn1": "stem.1", "prelu": "stem.2"}
_HEAD = {"bn2": "head.bn", "fc": "head.fc", "features": "head.features"}
# IBasicBlock's layers in forward order = partialfc IRBlock.residual indices
_RESIDUAL = {"bn1": 0, "conv1": 1, "bn2": 2, "prelu": 3, "conv2": 4, "bn3": 5}
_BLOCK_KEY = re.compile(r"^layer([1-9])\.(\d+)\.(\w+)\.(\d+\.)?(\w+)$")
_TOP_KEY = re.compile(r"^(\w+)\.(\w+)$")


def iresnet_key(key: str) -> str | None:
    """The partialfc IResNet key of an arcface_torch IResNet key (None: not an IResNet key).

    ``conv1/bn1/prelu`` → ``stem.0/1/2``; ``layer{s}.{b}.{bn1,conv1,bn2,prelu,conv2,bn3}`` →
    ``stages.{s-1}.{b}.residual.{0..5}``; ``layer{s}.{b}.downsample.{0,1}`` →
    ``stages.{s-1}.{b}.shortcut.{0,1}``; ``bn2/fc/features`` → ``head.bn/fc/features``.
    """
    block = _BLOCK_KEY.match(key)
    if block:
        stage, index, layer, sub, leaf = block.groups()
        prefix = f"stages.{int(stage) - 1}.{index}"
        if layer == "downsample" and sub in ("0.", "1."):
            return f"{prefix}.shortcut.{sub}{leaf}"
        if layer in _RESIDUAL and sub is None:
            return f"{prefix}.residual.{_RESIDUAL[layer]}.{leaf}"
        return None
    top = _TOP_KEY.match(key)
    outer = {**_STEM, **_HEAD}
    if top and top.group(1) in outer:
        return f"{outer[top.group(1)]}.{top.group(2)}"
    return None


def arcface_iresnet_key(key: str) -> str | None:
    """Inverse of :func:`iresnet_key`: the arcface_torch name of a partialfc IResNet key."""
    stem_head = {v: k for k, v in {**_STEM, **_HEAD}.items()}
    head, _, leaf = key.rpartition(".")
    if head in stem_head:
        return f"{stem_head[head]}.{leaf}"
    parts = key.split(".")
    if len(parts) == 6 and parts[0] == "stages" and parts[3] in ("residual", "shortcut"):
        stage, index, kind, sub = int(parts[1]), parts[2], parts[3], int(parts[4])
        if kind == "shortcut" and sub in (0, 1):
            return f"layer{stage + 1}.{index}.downsample.{sub}.{leaf}"
        names = {i: name for name, i in _RESIDUAL.items()}
        if kind == "residual" and sub in names:
            return f"layer{stage + 1}.{index}.{names[sub]}.{leaf}"
    return None


def family(network: str) -> str:
    """``iresnet``, ``mbf`` or ``vit``: which key map ``network`` (a NETWORKS key) uses."""
    check_network(network)
    return "iresnet" if network.startswith("r") else network.split("_")[0]


def partialfc_key(network: str, key: str) -> str | None:
    """The partialfc key of ``network``'s arcface_torch ``key``; None: dropped or unknown."""
    kind = family(network)
    if kind == "iresnet":
        return iresnet_key(key)
    return None if kind == "vit" and key in DROPPED_KEYS else key


def arcface_key(network: str, key: str) -> str | None:
    """The arcface_torch key of ``network``'s partialfc ``key`` (inverse of partialfc_key)."""
    return arcface_iresnet_key(key) if family(network) == "iresnet" else key


# the last BatchNorm1d (its length is the embedding size), arcface_torch names
EMBEDDING_BN = {
    "iresnet": "features.weight",
    "mbf": "features.layers.3.weight",
    "vit": "feature.3.weight",
}


class WeightsError(ValueError):
    """A weights file that cannot be imported; the message names the file and the key."""


def check_network(network: str) -> str:
    """The partialfc model name of an arcface_torch network name, or a clear error."""
    if network not in NETWORKS:
        raise WeightsError(
            f"--network {network!r}: not an arcface_torch network; choose one of "
            f"{', '.join(NETWORKS)}"
        )
    return NETWORKS[network]


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The backbone state dict in an arcface_torch file, read without unpickling objects.

    Accepts ``.safetensors``, a bare state dict (``model.pt``, ``backbone.pth``) and a training
    checkpoint (``checkpoint_gpu_<rank>.pt``: its ``state_dict_backbone``); drops a
    ``module.`` prefix (DistributedDataParallel) when every key has it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            loaded = load_file(str(path))
        except (OSError, SafetensorError) as err:
            raise WeightsError(f"{path}: not a readable safetensors file ({err})") from None
    else:
        loaded = _torch_load(path)
    if isinstance(loaded, dict) and isinstance(loaded.get(CHECKPOINT_KEY), dict):
        loaded = loaded[CHECKPOINT_KEY]
    if not isinstance(loaded, dict) or not loaded:
        raise WeightsError(
            f"{path}: expected a state dict (name -> tensor) or an arcface_torch checkpoint "
            f"with {CHECKPOINT_KEY!r}, got {type(loaded).__name__}"
        )
    bad = next(
        (k for k, v in loaded.items() if not isinstance(k, str) or not torch.is_tensor(v)), None
    )
    if bad is not None:
        raise WeightsError(f"{path}: entry {bad!r} is not a tensor; expected a state dict")
    if all(k.startswith(DDP_PREFIX) for k in loaded):
        loaded = {k[len(DDP_PREFIX) :]: v for k, v in loaded.items()}
    return loaded


def _torch_load(path: Path):
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():  # "pickle protocol N" notes on non-torch pickles
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        # torch names what it refused on a line like "Unsupported global: GLOBAL posix.system"
        reason = next((line for line in lines if "GLOBAL" in line or "nsupported" in line), "")
        raise WeightsError(
            f"{path}: refused: it holds Python objects other than tensors, which loading would "
            f"run as code (torch.load(weights_only=True) stopped"
            f"{': ' + reason if reason else ''})"
        ) from None
    except Exception as err:  # noqa: BLE001 - truncated / not a torch file, re-raised with path
        first = str(err).strip().split(". ")[0]
        raise WeightsError(
            f"{path}: cannot read it as a PyTorch weights file (truncated, or another format: "
            f"{type(err).__name__}: {first})"
        ) from None


def embedding_size_of(network: str, state: dict[str, torch.Tensor]) -> int | None:
    """The embedding size stored in ``state`` (the last BatchNorm1d's length), or None."""
    tensor = state.get(EMBEDDING_BN[family(network)])
    return int(tensor.shape[0]) if tensor is not None and tensor.ndim == 1 else None


def convert_state_dict(
    network: str, state: dict[str, torch.Tensor], embedding_size: int, source: str = "weights"
) -> dict[str, torch.Tensor]:
    """``state`` (arcface_torch names) as the state dict of the partialfc model for ``network``.

    Strict: the first missing, unexpected or mis-shaped key is an error naming ``source``.
    Floating tensors become float32 (a half-precision save loads the same).
    """
    model_name = check_network(network)
    with torch.device("meta"):
        target = build_model(model_name, embedding_dim=embedding_size, input_size=INPUT_SIZE)
    expected = target.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = partialfc_key(network, key)
        if name is None and key in DROPPED_KEYS and family(network) == "vit":
            continue
        if name is None or name not in expected:
            raise WeightsError(
                f"{source}: unexpected key {key!r} for arcface_torch {network} "
                f"({len(state)} keys in the file, {len(expected)} expected); "
                "is --network right?"
            )
        if tuple(value.shape) != tuple(expected[name].shape):
            hint = ""
            stored = embedding_size_of(network, state)
            if stored is not None and stored != embedding_size:
                hint = f"; the file holds {stored}-d embeddings: --embedding-size {stored}"
            raise WeightsError(
                f"{source}: key {key!r} has shape {tuple(value.shape)}, arcface_torch {network} "
                f"with {embedding_size}-d embeddings expects {tuple(expected[name].shape)}{hint}"
            )
        out[name] = value.float() if value.is_floating_point() else value
    missing = [k for k in expected if k not in out]
    if missing:
        raise WeightsError(
            f"{source}: missing key {arcface_key(network, missing[0])!r} for arcface_torch "
            f"{network} ({len(missing)} of {len(expected)} missing); is --network right?"
        )
    return out


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_weights` wrote."""

    output: Path
    network: str
    model_name: str
    embedding_size: int
    num_tensors: int

    def to_dict(self) -> dict:
        return {
            "output": str(self.output),
            "network": self.network,
            "model_name": self.model_name,
            "embedding_size": self.embedding_size,
            "num_tensors": self.num_tensors,
        }


def insightface_spec(model_name: str, embedding_size: int) -> PreprocessingSpec:
    """InsightFace's preprocessing: RGB 112×112, ``(x − 127.5) / 127.5``."""
    return PreprocessingSpec(
        model_name=model_name,
        model_kwargs={"embedding_dim": embedding_size, "input_size": INPUT_SIZE},
        embedding_dim=embedding_size,
        input_size=(INPUT_SIZE, INPUT_SIZE),
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
    )


def import_weights(
    weights: str | os.PathLike,
    network: str,
    output: str | os.PathLike,
    embedding_size: int | None = None,
) -> ImportResult:
    """Convert the arcface_torch backbone ``weights`` of ``network`` into the model directory
    ``output`` (``backbone.safetensors``, ``model.json``, ``preprocessing.json``).

    ``embedding_size``: None reads it from the weights. ``output`` must not exist or be empty;
    it is written under a temporary name and renamed into place, so any error leaves it as it
    was. Raises ``FileNotFoundError`` / :class:`WeightsError` (a ``ValueError``).
    """
    model_name = check_network(network)
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise WeightsError(f"--output {output}: exists and is not an empty directory")
    state = read_state_dict(weights)
    if embedding_size is None:
        embedding_size = embedding_size_of(network, state) or 512
    converted = convert_state_dict(network, state, embedding_size, source=str(weights))
    model = build_model(model_name, embedding_dim=embedding_size, input_size=INPUT_SIZE)
    model.load_state_dict(converted)
    spec = insightface_spec(model_name, embedding_size)
    model_config = {"name": model_name, "kwargs": dict(spec.model_kwargs)}
    _write_directory(output, model.eval(), model_config, spec)
    return ImportResult(output, network, model_name, embedding_size, len(converted))


def _write_directory(output: Path, model, model_config: dict, spec: PreprocessingSpec) -> None:
    """All files into a hidden sibling directory, then one rename onto ``output``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.{secrets.token_hex(4)}.tmp")
    staging.mkdir()
    try:
        save_weights(model, staging / WEIGHTS_FILENAME, spec)
        (staging / MODEL_CONFIG_FILENAME).write_text(json.dumps(model_config, indent=2) + "\n")
        spec.save(staging / SPEC_FILENAME)
        if output.is_dir():
            output.rmdir()  # empty (checked above)
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
