"""``Embedder``: images in, L2-normalised embeddings out, from any saved form of a backbone.

    embedder = Embedder.load(path)      # exported dir, .onnx file, or training checkpoint/run
    e = embedder.embed(images, flip=True, batch_size=256)   # (N, d) float32, unit rows

``images`` are uint8 ``(N, H, W)`` (grey) or ``(N, H, W, C)`` RGB, aligned and cropped to the
model's ``spec.input_size``. With ``flip=True`` the embedding is
``normalize(f(x) + f(mirror(x)))`` (the flip test). ``embedder.model_sha256`` identifies the
weights (:mod:`partialfc.backbone.fingerprint`); calibrated thresholds record it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from partialfc.backbone.embedding import embed_in_batches, l2_normalize, run_backbone
from partialfc.backbone.io import METADATA_KEY, WEIGHTS_FILENAME, load_weights
from partialfc.backbone.spec import SPEC_FILENAME, PreprocessingSpec


class TorchBackend:
    """Runs an ``nn.Module`` in eval mode, fp32, without gradients."""

    def __init__(self, model: nn.Module, device: str | torch.device | None = None):
        from partialfc.backbone.devices import parse_device

        self.device = parse_device(device)
        self.model = model.eval().to(self.device)
        self._sha256: str | None = None

    @property
    def model_sha256(self) -> str:
        """SHA-256 of the module's state dict (computed once)."""
        if self._sha256 is None:
            from partialfc.backbone.fingerprint import state_sha256

            self._sha256 = state_sha256(self.model.state_dict())
        return self._sha256

    def __call__(self, x: np.ndarray) -> np.ndarray:
        (out,) = run_backbone(self.model, [torch.from_numpy(x)], self.device, preprocess=None)
        return out.numpy()


class OnnxBackend:
    """Runs an ONNX file with onnxruntime (CPU provider, or CUDA on ``cuda[:N]``)."""

    def __init__(self, path: str | os.PathLike, device: str | None = None):
        import onnxruntime as ort

        from partialfc.backbone.devices import ort_providers

        self.path = Path(path)
        providers = ort_providers(device)
        try:
            self.session = ort.InferenceSession(str(path), providers=providers)
        except Exception as err:  # noqa: BLE001 - ORT raises several types; name the file
            raise ValueError(f"{path}: cannot load ONNX model: {err}") from None
        self.input_name = self.session.get_inputs()[0].name

    @property
    def model_sha256(self) -> str:
        """The weights' hash written by ``export`` into the metadata, else the file's SHA-256."""
        from partialfc.backbone.fingerprint import MODEL_HASH_KEY, file_sha256

        meta = self.session.get_modelmeta().custom_metadata_map
        return meta.get(MODEL_HASH_KEY) or file_sha256(self.path)

    def spec(self) -> PreprocessingSpec | None:
        meta = self.session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in meta:
            return None
        return PreprocessingSpec.from_dict(json.loads(meta[METADATA_KEY]), str(self.path))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]


class Embedder:
    """A backbone plus its preprocessing. ``backend`` maps network input to raw embeddings."""

    def __init__(self, backend: Callable[[np.ndarray], np.ndarray], spec: PreprocessingSpec):
        self.backend = backend
        self.spec = spec

    @classmethod
    def from_module(cls, model: nn.Module, spec: PreprocessingSpec, device=None) -> Embedder:
        return cls(TorchBackend(model, device), spec)

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str = "auto", device=None) -> Embedder:
        """Load from

        * an exported directory (``preprocessing.json`` + ``backbone.safetensors`` [+ ONNX]);
          ``backend="onnx"`` uses its ``backbone.onnx`` with onnxruntime instead of PyTorch;
        * an ``.onnx`` file (spec from its metadata or a ``preprocessing.json`` beside it);
        * a training checkpoint directory or run folder (``model.json`` + weights).

        ``device``: ``cpu`` (default), ``cuda`` or ``cuda:N`` (see ``partialfc.backbone.devices``).
        """
        if backend not in ("auto", "torch", "onnx"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'onnx', got {backend!r}")
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such model file or directory")
        if path.is_file():
            if path.suffix != ".onnx":
                raise ValueError(f"{path}: expected an .onnx file or a model directory")
            return cls._load_onnx(path, device=device)
        if (path / SPEC_FILENAME).is_file():
            spec = PreprocessingSpec.load(path / SPEC_FILENAME)
            if backend == "onnx":
                return cls._load_onnx(path / "backbone.onnx", spec, device)
            model = load_weights(path / WEIGHTS_FILENAME, spec.model_name, spec.model_kwargs)
            return cls.from_module(model, spec, device)
        if backend == "onnx":
            raise ValueError(f"{path}: backend 'onnx' needs an exported directory or .onnx file")
        from partialfc.backbone.io import load_backbone_from_checkpoint

        model, model_config = load_backbone_from_checkpoint(path)
        return cls.from_module(model, PreprocessingSpec.from_model_config(model_config), device)

    @classmethod
    def _load_onnx(cls, path: Path, spec: PreprocessingSpec | None = None, device=None):
        session = OnnxBackend(path, device)
        spec = spec or session.spec()
        if spec is None and (path.parent / SPEC_FILENAME).is_file():
            spec = PreprocessingSpec.load(path.parent / SPEC_FILENAME)
        if spec is None:
            raise ValueError(f"{path}: no preprocessing spec in its metadata or beside it")
        return cls(session, spec)

    @property
    def embedding_dim(self) -> int:
        return self.spec.embedding_dim

    @property
    def model_sha256(self) -> str | None:
        """SHA-256 identifying the weights (None for a backend that cannot say)."""
        return getattr(self.backend, "model_sha256", None)

    def _raw(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self.backend(self.spec.preprocess(images)), dtype=np.float32)

    def embed(self, images: np.ndarray, flip: bool = False, batch_size: int = 256) -> np.ndarray:
        """L2-normalised ``(N, d)`` float32 embeddings (see module docstring)."""
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        return l2_normalize(self.embed_raw(images, flip=flip, batch_size=batch_size))

    def embed_raw(self, images: np.ndarray, flip: bool = False, batch_size: int = 256):
        """Unnormalised ``(N, d)`` float32 embeddings (``f(x) [+ f(mirror(x))]``).

        The norm carries quality; templates average these before normalising.
        """
        return embed_in_batches(self._raw, images, flip=flip, batch_size=batch_size)
