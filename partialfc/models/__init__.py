"""Backbones that map images to identity embeddings, and their parameter / MAC counts.

Every constructor has the same signature::

    model = iresnet50(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0)
    model = build_model("iresnet50", embedding_dim=512, input_size=112, in_channels=3)

and returns an ``nn.Module`` mapping ``(B, in_channels, H, W)`` float images (normalised as
``(x / 255 - 0.5) / 0.5``) to ``(B, embedding_dim)`` unnormalised embeddings. Each model
records ``input_size`` (H, W), ``in_channels`` and ``embedding_dim`` as attributes.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from partialfc.models.arcface_mbf import ArcFaceMobileFaceNet, arcface_mbf, arcface_mbf_large
from partialfc.models.arcface_vit import ARCFACE_VITS, ArcFaceViT
from partialfc.models.complexity import Complexity, complexity, count_macs, count_parameters
from partialfc.models.iresnet import (
    IResNet,
    iresnet18,
    iresnet18_half,
    iresnet34,
    iresnet50,
    iresnet100,
    iresnet200,
    iresnet2060,
    iresnet_small,
    iresnet_small_narrow,
    iresnet_tiny,
)
from partialfc.models.ltp_fused import LtpFusedEmbedding, iresnet_tiny_ltp, iresnet_tiny_ltp_noflip
from partialfc.models.mobilefacenet import MobileFaceNet, mobilefacenet
from partialfc.models.vit import FaceViT, vit_b, vit_s, vit_t

MODELS: dict[str, Callable[..., nn.Module]] = {
    "iresnet18": iresnet18,
    "iresnet18_half": iresnet18_half,
    "iresnet34": iresnet34,
    "iresnet50": iresnet50,
    "iresnet100": iresnet100,
    "iresnet200": iresnet200,
    "iresnet2060": iresnet2060,
    "iresnet_small": iresnet_small,
    "iresnet_small_narrow": iresnet_small_narrow,
    "iresnet_tiny": iresnet_tiny,
    # iresnet_tiny + in-graph LTP descriptor, fused (the LFW one-file preset)
    "iresnet_tiny_ltp": iresnet_tiny_ltp,
    "iresnet_tiny_ltp_noflip": iresnet_tiny_ltp_noflip,
    "mobilefacenet": mobilefacenet,
    "vit_t": vit_t,
    "vit_s": vit_s,
    "vit_b": vit_b,
    # the layouts of InsightFace's arcface_torch (partialfc.tools.arcface_torch imports them)
    "arcface_mbf": arcface_mbf,
    "arcface_mbf_large": arcface_mbf_large,
    **ARCFACE_VITS,
}


def register_model(name: str):
    """Decorator adding a backbone builder to :data:`MODELS` under ``name`` (as timm's
    ``register_model``), so checkpoints that name it reload with :func:`build_model`.

    The builder takes ``build_model``'s keyword arguments (``embedding_dim``, ``input_size``,
    ``in_channels``, ``dropout``). Registering a taken name for another builder is an error.
    """

    def register(builder):
        if MODELS.get(name, builder) is not builder:
            raise ValueError(f"model name {name!r} is already registered")
        MODELS[name] = builder
        return builder

    return register


def build_model(
    name: str,
    embedding_dim: int = 512,
    input_size: int | tuple[int, int] = 112,
    in_channels: int = 3,
    dropout: float = 0.0,
) -> nn.Module:
    """Build the backbone ``name`` (a key of ``MODELS``); all share this signature."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name](
        embedding_dim=embedding_dim, input_size=input_size, in_channels=in_channels, dropout=dropout
    )


__all__ = [
    "MODELS",
    "ArcFaceMobileFaceNet",
    "ArcFaceViT",
    "Complexity",
    "FaceViT",
    "IResNet",
    "LtpFusedEmbedding",
    "MobileFaceNet",
    "build_model",
    "complexity",
    "count_macs",
    "count_parameters",
    "iresnet18",
    "iresnet18_half",
    "iresnet34",
    "iresnet50",
    "iresnet100",
    "iresnet200",
    "iresnet2060",
    "iresnet_small",
    "iresnet_small_narrow",
    "iresnet_tiny",
    "iresnet_tiny_ltp",
    "iresnet_tiny_ltp_noflip",
    "mobilefacenet",
    "register_model",
    "vit_b",
    "vit_s",
    "vit_t",
]
