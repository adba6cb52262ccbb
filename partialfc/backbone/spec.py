"""The preprocessing spec stored next to an exported backbone, and the preprocessing itself.

``preprocessing.json`` says everything needed to turn a stored image into the network input
and to rebuild the network::

    {"format": "partialfc.preprocessing", "version": 1,
     "model_name": "iresnet50", "model_kwargs": {...}, "embedding_dim": 512,
     "input_size": [112, 112], "in_channels": 3, "colour_order": "RGB",
     "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
     "alignment_landmarks": [[x, y] × 5] or null}

``alignment_landmarks``: where the five face landmarks (left eye, right eye, nose tip, left and
right mouth corner, as seen in the image) sit in the input crop the model was trained on,
in input pixels; align a photo onto them with
``partialfc.data.align.align_face(image, landmarks, size, template=alignment_landmarks)``.
``null``: not stated (crops centred on the face, or the ArcFace 112×112 template).

Network input: ``x = (uint8 / 255 - mean) / std`` per channel, layout ``(N, C, H, W)``, the
same normalisation as training (:func:`partialfc.backbone.pixels.normalize_pixels`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from partialfc.atomic import atomic_write_bytes
from partialfc.backbone.pixels import normalize_pixels
from partialfc.ranges import Range, shown

SPEC_FORMAT = "partialfc.preprocessing"
SPEC_VERSION = 1
SPEC_FILENAME = "preprocessing.json"
# Ranges every spec (and every model.json) is checked against when it loads, before anything
# is allocated from it: an input side of 10^6 would make alignment ask for 3 TB.
SPEC_RANGES = {
    "input_size": Range(1, 4096, integer=True),  # each side, pixels
    "embedding_dim": Range(1, 65536, integer=True),
    "mean": Range(-255, 255),  # each channel, after x / 255
    "std": Range(0, 255, low_open=True),
}
# ITU-R BT.601 luma, used when a grey model is given RGB images
LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class PreprocessingSpec:
    """How images become network input, and which network it is."""

    model_name: str
    model_kwargs: dict = field(default_factory=dict)
    embedding_dim: int = 512
    input_size: tuple[int, int] = (112, 112)
    in_channels: int = 3
    colour_order: str = "RGB"  # "RGB" (3 channels) or "GREY" (1 channel)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    # (5, 2) landmark positions of the training crops, input pixels; None = not stated
    alignment_landmarks: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self):
        SPEC_RANGES["embedding_dim"].check("embedding_dim", self.embedding_dim)
        for name in ("input_size", "mean", "std"):
            for i, value in enumerate(getattr(self, name)):
                SPEC_RANGES[name].check(f"{name}[{i}]", value)
        check_model_kwargs(self.model_kwargs)
        if self.in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 or 3, got {self.in_channels}")
        expected_order = "GREY" if self.in_channels == 1 else "RGB"
        if self.colour_order != expected_order:
            raise ValueError(
                f"colour_order {self.colour_order!r} does not fit in_channels={self.in_channels}"
                f" (expected {expected_order!r})"
            )
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise ValueError(
                f"mean/std need {self.in_channels} values, got {shown(self.mean)}/{shown(self.std)}"
            )
        if len(self.input_size) != 2:
            raise ValueError(f"input_size must be (H, W), got {shown(self.input_size)}")
        if self.alignment_landmarks is not None:
            try:
                points = np.asarray(self.alignment_landmarks, dtype=np.float64)
            except (TypeError, ValueError):
                points = np.zeros(0)  # not numbers in a (5, 2) layout: refused below
            h, w = self.input_size
            # (x, y) within [0, w] x [0, h]; NaN compares false and is refused too
            if points.shape != (5, 2) or not ((points >= 0) & (points <= (w, h))).all():
                raise ValueError(
                    "alignment_landmarks must be five (x, y) points inside the "
                    f"{h}×{w} input, got {self.alignment_landmarks}"
                )
            object.__setattr__(
                self, "alignment_landmarks", tuple((float(x), float(y)) for x, y in points)
            )

    @classmethod
    def from_model_config(cls, model_config: dict) -> PreprocessingSpec:
        """Spec of a training checkpoint's ``{"name": ..., "kwargs": {...}}`` (training
        normalisation ``(x / 255 - 0.5) / 0.5``)."""
        kwargs = dict(model_config.get("kwargs", {}))
        size = kwargs.get("input_size", 112)
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        channels = int(kwargs.get("in_channels", 3))
        return cls(
            model_name=model_config["name"],
            model_kwargs=kwargs,
            embedding_dim=int(kwargs.get("embedding_dim", 512)),
            input_size=(int(h), int(w)),
            in_channels=channels,
            colour_order="GREY" if channels == 1 else "RGB",
            mean=(0.5,) * channels,
            std=(0.5,) * channels,
        )

    # -------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        d = asdict(self)
        d["input_size"] = list(self.input_size)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        if self.alignment_landmarks is None:
            del d["alignment_landmarks"]  # not stated: files stay as before the field existed
        else:
            d["alignment_landmarks"] = [list(p) for p in self.alignment_landmarks]
        return {"format": SPEC_FORMAT, "version": SPEC_VERSION, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict, source: str = "spec") -> PreprocessingSpec:
        if d.get("format") != SPEC_FORMAT or d.get("version") != SPEC_VERSION:
            raise ValueError(
                f"{source}: not a {SPEC_FORMAT} v{SPEC_VERSION} file "
                f"(format={d.get('format')!r}, version={d.get('version')!r})"
            )
        try:
            return cls(
                model_name=str(d["model_name"]),
                model_kwargs=dict(d["model_kwargs"]),
                embedding_dim=int(d["embedding_dim"]),
                input_size=tuple(int(v) for v in d["input_size"]),
                in_channels=int(d["in_channels"]),
                colour_order=str(d["colour_order"]),
                mean=tuple(float(v) for v in d["mean"]),
                std=tuple(float(v) for v in d["std"]),
                alignment_landmarks=d.get("alignment_landmarks"),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"{source}: invalid preprocessing spec: {err}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> PreprocessingSpec:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read preprocessing spec: {err}") from None
        return cls.from_dict(d, str(path))

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_bytes(Path(path), (self.to_json() + "\n").encode())

    # -------------------------------------------------------------- preprocessing
    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """uint8 ``(N, H, W)`` or ``(N, H, W, C)`` RGB → float32 ``(N, C, H, W)`` network input.

        Grey images given to an RGB model are replicated to 3 channels; RGB images given to a
        grey model are converted with BT.601 luma weights. Sizes must match ``input_size``
        (images are expected aligned and cropped already).
        """
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"images must be (N, H, W) or (N, H, W, 1|3), got {images.shape}")
        if tuple(images.shape[1:3]) != tuple(self.input_size):
            h, w = self.input_size
            raise ValueError(
                f"images are {images.shape[1]}×{images.shape[2]} but {self.model_name} expects "
                f"{h}×{w} aligned crops; align/resize them first"
            )
        x = images.astype(np.float32) / 255.0
        if self.in_channels == 3 and x.shape[-1] == 1:
            x = np.repeat(x, 3, axis=-1)
        elif self.in_channels == 1 and x.shape[-1] == 3:
            x = (x @ LUMA_WEIGHTS)[..., None]
        x = normalize_pixels(torch.from_numpy(np.ascontiguousarray(x)), self.mean, self.std)
        return np.ascontiguousarray(x.numpy().transpose(0, 3, 1, 2))


def check_model_kwargs(kwargs, source: str = "model_kwargs") -> None:
    """Raise ValueError naming ``source`` when the network arguments that size its tensors
    (``input_size``, ``in_channels``, ``embedding_dim``) are outside :data:`SPEC_RANGES` (checked
    before a network is built from them, e.g. from a checkpoint's ``model.json``)."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"{source}: expected a mapping of arguments, got {shown(kwargs)}")
    if "in_channels" in kwargs and kwargs["in_channels"] not in (1, 3):
        raise ValueError(f"{source}.in_channels must be 1 or 3, got {shown(kwargs['in_channels'])}")
    if "embedding_dim" in kwargs:
        SPEC_RANGES["embedding_dim"].check(f"{source}.embedding_dim", kwargs["embedding_dim"])
    size = kwargs.get("input_size")
    if size is not None:
        sides = size if isinstance(size, (list, tuple)) else [size]
        for side in sides:
            SPEC_RANGES["input_size"].check(f"{source}.input_size", side)
