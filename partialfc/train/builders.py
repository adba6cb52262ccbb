"""Config sections → objects: backbone, margin and its schedule, Partial FC head, optimizers.

Each builder takes one typed config section; all construction arguments are explicit fields of
that section (no free-form keyword bags except the model's own ``kwargs``).
"""

from __future__ import annotations

import torch
from torch import nn

from partialfc.train.config import HeadConfig, MarginConfig, ModelConfig, OptimConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_backbone_from_model_config(model_config: dict) -> nn.Module:
    """Rebuild a backbone from ``{"name": ..., "kwargs": {...}}`` (as stored in checkpoints)."""
    from partialfc.models import build_model

    return build_model(model_config["name"], **model_config["kwargs"])


def build_backbone(cfg: ModelConfig, input_size: int, in_channels: int) -> tuple[nn.Module, dict]:
    """The backbone and the ``model_config`` that rebuilds it."""
    kwargs = {
        "embedding_dim": cfg.embedding_dim,
        "input_size": input_size,
        "in_channels": in_channels,
        **cfg.kwargs,
    }
    model_config = {"name": cfg.name, "kwargs": kwargs}
    return build_backbone_from_model_config(model_config), model_config


def build_margin(cfg: MarginConfig):
    from partialfc.losses.margins import CombinedMargin

    return CombinedMargin(
        m1=cfg.m1, m2_rad=cfg.m2_rad, m3=cfg.m3, scale=cfg.scale, easy_margin=cfg.easy_margin
    )


def build_margin_schedule(cfg: MarginConfig, margin):
    """No margin for ``warmup_steps``, then the full margin (or a linear ramp over
    ``ramp_steps``); None when both are 0. Drive it with ``schedule.update(step)``."""
    from partialfc.losses.schedules import MarginRamp, MarginWarmup

    if cfg.ramp_steps:
        return MarginRamp(margin, ramp_steps=cfg.ramp_steps, start_step=cfg.warmup_steps)
    if cfg.warmup_steps:
        return MarginWarmup(margin, warmup_steps=cfg.warmup_steps)
    return None


def build_head(
    cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, process_group=None
):
    """The Partial FC head over ``num_classes`` (sharded over the ranks) and its margin."""
    from partialfc.classifier import PartialFC

    margin = build_margin(cfg.margin)
    head = PartialFC(
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        margin=margin,
        sample_rate=cfg.sample_rate,
        num_subcenters=cfg.num_subcenters,
        negative_cos_threshold=cfg.negative_cos_threshold,
        storage_dtype=_DTYPES[cfg.storage_dtype],
        device=device,
        storage_device=None if cfg.storage_device == "compute" else cfg.storage_device,
        seed=seed,
        process_group=process_group,
    )
    return head, margin


def _split_decay(backbone: nn.Module):
    """Weight decay on weights of conv/linear layers only (not on biases, norms, PReLU slopes)."""
    decay, no_decay = [], []
    for name, p in backbone.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim > 1 and not name.endswith("bias") else no_decay).append(p)
    return decay, no_decay


def build_backbone_optimizer(cfg: OptimConfig, backbone: nn.Module) -> torch.optim.Optimizer:
    decay, no_decay = _split_decay(backbone)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    raise ValueError(f"optim.name={cfg.name!r}: choose sgd or adamw")


def build_head_optimizer(cfg: OptimConfig, head):
    """Row-sparse optimizer of the Partial FC centers (only active rows and their state move)."""
    from partialfc.classifier import RowSparseAdamW, RowSparseSGD

    lr = cfg.head_lr if cfg.head_lr is not None else cfg.lr
    if cfg.name == "sgd":
        return RowSparseSGD(head, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return RowSparseAdamW(
        head, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
