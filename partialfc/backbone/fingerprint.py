"""The identity of a backbone's weights, so that a threshold is used only with its model.

``state_sha256(state)`` is a SHA-256 over the state dict, entry by entry in sorted name order:
a header line ``["<name>", "<dtype>", [shape...]]\\n`` then the tensor's raw little-endian
bytes. It depends only on the weights (names, dtypes, shapes, values), not on where they are
stored: the module in memory (on any device), its training checkpoint and its export's
``backbone.safetensors`` give the same value. ``export`` writes it into the ONNX metadata
(key ``partialfc.model_sha256``), so the ONNX backend reports it too; an ONNX file without
that key is identified by the SHA-256 of its bytes (:func:`file_sha256`) instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping

import torch

MODEL_HASH_KEY = "partialfc.model_sha256"  # ONNX / safetensors metadata key


def state_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 of a state dict (see the module docstring); device and storage agnostic."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        digest.update((json.dumps([name, dtype, list(tensor.shape)]) + "\n").encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
