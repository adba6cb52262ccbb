"""Config sections → objects: backbone, margin and its schedule, the loss head, optimizers.

Each builder takes one typed config section; all construction arguments are explicit fields of
that section (no free-form keyword bags except the model's own ``kwargs``).
"""

from __future__ import annotations

import torch
from torch import nn

from partialfc.backbone.io import build_backbone_from_model_config
from partialfc.train.config import HeadConfig, MarginConfig, ModelConfig, OptimConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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


def _partial_fc(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """Partial FC (An et al., CVPR 2022): sharded over the ranks, ``sample_rate`` of the
    negatives per step; the default kind."""
    from partialfc.classifier import PartialFC

    return PartialFC(
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        margin=build_margin(cfg.margin),
        sample_rate=cfg.sample_rate,
        num_subcenters=cfg.num_subcenters,
        negative_cos_threshold=cfg.negative_cos_threshold,
        storage_dtype=_DTYPES[cfg.storage_dtype],
        compute_dtype=_compute_dtype(cfg, device),
        device=device,
        storage_device=None if cfg.storage_device == "compute" else cfg.storage_device,
        seed=seed,
        process_group=pg,
        chunk_rows=cfg.chunk_rows,
    )


def _compute_dtype(cfg: HeadConfig, device) -> str:
    """``head.compute_dtype``, refused where it cannot run (float16 on a CPU)."""
    if cfg.compute_dtype == "float16" and torch.device(device).type == "cpu":
        raise ValueError(
            "head.compute_dtype='float16' needs a GPU (CPUs have no fast float16 GEMM); "
            "use head.compute_dtype=bfloat16 on CPU"
        )
    return cfg.compute_dtype


def _seeded_centers(num_classes: int, embedding_dim: int, num_subcenters: int, seed: int):
    """The initial table Partial FC draws for the same seed (so the kinds start alike)."""
    from partialfc.classifier import init_center_rows

    return init_center_rows(num_classes, embedding_dim, num_subcenters, seed, 0, num_classes)


def _margin_softmax(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """Dense margin-softmax (ArcFace, Deng et al., CVPR 2019; sub-centers with
    ``num_subcenters`` > 1), initialised like Partial FC with the same seed."""
    from partialfc.losses.heads import MarginSoftmaxHead

    head = MarginSoftmaxHead(
        num_classes,
        embedding_dim,
        build_margin(cfg.margin),
        num_subcenters=cfg.num_subcenters,
        compute_dtype=_compute_dtype(cfg, device),
    )
    with torch.no_grad():
        head.weight.copy_(_seeded_centers(num_classes, embedding_dim, cfg.num_subcenters, seed))
    return head.to(device)


def _softmax(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """Plain softmax, ``W x + b`` on the un-normalised embeddings (the baseline)."""
    from partialfc.losses.heads import SoftmaxHead

    return SoftmaxHead(num_classes, embedding_dim).to(device)


def _proxy_nca(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """ProxyNCA (Movshovitz-Attias et al., ICCV 2017), one proxy per class."""
    from partialfc.losses.proxy_nca import ProxyNCALoss

    return ProxyNCALoss(num_classes, embedding_dim, scale=cfg.proxy_scale).to(device)


def _triplet(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """Triplet loss (FaceNet, Schroff et al., CVPR 2015) on P×K batches, no parameters."""
    from partialfc.losses.triplet import TripletLoss

    return TripletLoss(margin=cfg.triplet_margin, mining=cfg.triplet_mining)


def _contrastive(cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, pg):
    """Contrastive loss (Hadsell, Chopra & LeCun, CVPR 2006) over the batch's pairs."""
    from partialfc.losses.contrastive import ContrastiveLoss

    return ContrastiveLoss(margin=cfg.contrastive_margin)


# ``head.kind`` -> builder; every builder takes (cfg, embedding_dim, num_classes, seed, device,
# process_group) and returns a :class:`partialfc.losses.contract.Head`.
HEAD_BUILDERS = {
    "partial_fc": _partial_fc,
    "margin_softmax": _margin_softmax,
    "softmax": _softmax,
    "proxy_nca": _proxy_nca,
    "triplet": _triplet,
    "contrastive": _contrastive,
}


def build_head(
    cfg: HeadConfig, embedding_dim: int, num_classes: int, seed: int, device, process_group=None
):
    """The loss head of ``cfg.kind`` over ``num_classes`` and its angular margin (or None).

    Only Partial FC shards its parameters over several ranks; a dense head with parameters
    (``margin_softmax``, ``softmax``, ``proxy_nca``) trains in one process.
    """
    if cfg.kind not in HEAD_BUILDERS:
        raise ValueError(f"head.kind={cfg.kind!r}: choose one of {', '.join(HEAD_BUILDERS)}")
    head = HEAD_BUILDERS[cfg.kind](cfg, embedding_dim, num_classes, seed, device, process_group)
    if cfg.kind != "partial_fc" and any(True for _ in head.parameters()):
        from partialfc.classifier.collectives import world_info

        _, world_size = world_info(process_group)
        if world_size > 1:
            raise ValueError(
                f"head.kind={cfg.kind!r} keeps all its parameters in one process; train it on "
                f"one rank (now {world_size}) or use head.kind=partial_fc"
            )
    return head, head.angular_margin()


def load_trained_head(checkpoint, device="cpu"):
    """``(head, cfg)`` of a training checkpoint directory (``meta.json`` + ``head/``): the head
    that ``head.kind`` of its config builds, holding the saved state (written on any number of
    ranks). Tools read what they need through the head contract, e.g. ``head.class_centers()``.
    """
    import json
    from pathlib import Path

    from partialfc.train.config import config_from_dict

    path = Path(checkpoint)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path}: not a training checkpoint (no meta.json)")
    meta = json.loads(meta_path.read_text())
    try:
        cfg = config_from_dict(meta["config"], str(meta_path))
        num_classes = int(meta["num_classes"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{meta_path}: incomplete, no {err}") from None
    head, _ = build_head(cfg.head, cfg.model.embedding_dim, num_classes, 0, torch.device(device))
    head.load_state(path / "head")
    return head, cfg


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
    """The head's own optimizer (:meth:`partialfc.losses.contract.Head.make_optimizer`): the
    row-sparse SGD / AdamW of Partial FC, a torch optimizer for a dense head. ``head_lr``
    (default: ``lr``) is its learning rate."""
    from partialfc.losses.contract import OptimizerSettings

    settings = OptimizerSettings(
        name=cfg.name,
        lr=cfg.head_lr if cfg.head_lr is not None else cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
    )
    return head.make_optimizer(settings)
