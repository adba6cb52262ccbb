"""``Embedder``: images in, L2-normalised embeddings out, from any saved form of a backbone.

    embedder = Embedder.load(path)      # exported dir, .onnx file, training checkpoint/run,
                                        # or an InsightFace model pack folder
    e = embedder.embed(images, flip=True, batch_size=256)   # (N, d) float32, unit rows

``images`` are uint8 ``(N, H, W)`` (grey) or ``(N, H, W, C)`` RGB, aligned and cropped to the
model's ``spec.input_size``. With ``flip=True`` the embedding is
``normalize(f(x) + f(mirror(x)))`` (the flip test). ``embedder.model_sha256`` identifies the
weights (:mod:`partialfc.backbone.fingerprint`); calibrated thresholds record it.

``preprocessing`` says where the preprocessing spec comes from (:data:`PREPROCESSING`):
``stored`` (the spec saved with the model: ONNX metadata, ``preprocessing.json``, a
checkpoint's ``model.json``), ``insightface`` (InsightFace's rule for a model-zoo recognition
ONNX, read from its graph: :mod:`partialfc.backbone.model_zoo`) or ``auto`` (the stored spec
when there is one, else InsightFace's rule when the graph is a recognition graph).
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

PREPROCESSING = ("auto", "stored", "insightface")
PREPROCESSING_HELP = (
    "where the image preprocessing comes from: stored (the spec saved with the model), "
    "insightface (InsightFace's ArcFaceONNX rule for a model-zoo ONNX: RGB, (x - 127.5) / 127.5, "
    "or raw pixels when the graph normalises itself), auto (default: stored, else insightface "
    "when the ONNX graph is an InsightFace recognition model)"
)


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

    def __init__(
        self,
        backend: Callable[[np.ndarray], np.ndarray],
        spec: PreprocessingSpec,
        preprocessing_source: str = "stored",
    ):
        self.backend = backend
        self.spec = spec
        # "stored": the spec saved with the model; "insightface": InsightFace's rule
        self.preprocessing_source = preprocessing_source

    @classmethod
    def from_module(cls, model: nn.Module, spec: PreprocessingSpec, device=None) -> Embedder:
        return cls(TorchBackend(model, device), spec)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        backend: str = "auto",
        device=None,
        preprocessing: str = "auto",
    ) -> Embedder:
        """Load from

        * an exported directory (``preprocessing.json`` + ``backbone.safetensors`` [+ ONNX]);
          ``backend="onnx"`` uses its ``backbone.onnx`` with onnxruntime instead of PyTorch;
        * an ``.onnx`` file (spec from its metadata or a ``preprocessing.json`` beside it, or
          InsightFace's rule, see ``preprocessing``);
        * a training checkpoint directory or run folder (``model.json`` + weights);
        * an InsightFace model pack folder (``*.onnx`` only): its recognition ONNX
          (:func:`partialfc.backbone.model_zoo.find_recognition_onnx`).

        ``device``: ``cpu`` (default), ``cuda`` or ``cuda:N`` (see ``partialfc.backbone.devices``).
        ``preprocessing``: ``auto``, ``stored`` or ``insightface`` (module docstring).
        """
        if backend not in ("auto", "torch", "onnx"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'onnx', got {backend!r}")
        if preprocessing not in PREPROCESSING:
            raise ValueError(
                f"preprocessing must be one of {', '.join(PREPROCESSING)}, got {preprocessing!r}"
            )
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such model file or directory")
        if path.is_file():
            if path.suffix != ".onnx":
                raise ValueError(f"{path}: expected an .onnx file or a model directory")
            return cls._load_onnx(path, device=device, preprocessing=preprocessing)
        if _is_model_pack(path):
            if backend == "torch":
                raise ValueError(f"{path}: backend 'torch' cannot run a folder of ONNX models")
            from partialfc.backbone.model_zoo import find_recognition_onnx

            onnx_path = find_recognition_onnx(path)
            return cls._load_onnx(onnx_path, device=device, preprocessing=preprocessing)
        if preprocessing == "insightface":
            raise ValueError(
                f"{path}: preprocessing 'insightface' applies to ONNX files and InsightFace "
                "model pack folders; this model states its own preprocessing"
            )
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
    def _load_onnx(
        cls,
        path: Path,
        spec: PreprocessingSpec | None = None,
        device=None,
        preprocessing: str = "auto",
    ) -> Embedder:
        session = OnnxBackend(path, device)
        if preprocessing == "insightface":
            return cls(session, _insightface_spec(path, session), "insightface")
        spec = spec or session.spec()
        if spec is None and (path.parent / SPEC_FILENAME).is_file():
            spec = PreprocessingSpec.load(path.parent / SPEC_FILENAME)
        if spec is not None:
            return cls(session, spec)
        if preprocessing == "auto":
            from partialfc.backbone.model_zoo import recognition_problem
            from partialfc.onnx_layout import read_onnx_layout

            problem = recognition_problem(read_onnx_layout(path))
            if problem is None:
                return cls(session, _insightface_spec(path, session), "insightface")
            raise ValueError(
                f"{path}: no preprocessing spec in its metadata or beside it, and the graph is "
                f"not an InsightFace recognition model ({problem}); put a {SPEC_FILENAME} "
                "beside it"
            )
        raise ValueError(
            f"{path}: no preprocessing spec in its metadata or beside it (an InsightFace "
            "model-zoo ONNX: use preprocessing 'insightface')"
        )

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


def _is_model_pack(path: Path) -> bool:
    """A folder of ONNX files with no partialfc spec or checkpoint in it."""
    from partialfc.backbone.io import newest_checkpoint

    return (
        not (path / SPEC_FILENAME).is_file()
        and newest_checkpoint(path) is None
        and any(path.glob("*.onnx"))
    )


def _insightface_spec(path: Path, session: OnnxBackend) -> PreprocessingSpec:
    """InsightFace's spec for the graph at ``path``; an output width the graph leaves free is
    measured on one zero image."""
    from partialfc.backbone.model_zoo import insightface_spec, recognition_problem
    from partialfc.onnx_layout import read_onnx_layout

    layout = read_onnx_layout(path)
    dim = None
    if recognition_problem(layout) is None and not isinstance(layout.outputs[0][1][1], int):
        side = int(layout.inputs[0][1][2])
        dim = int(session(np.zeros((1, 3, side, side), np.float32)).shape[1])
    return insightface_spec(layout, embedding_dim=dim)
