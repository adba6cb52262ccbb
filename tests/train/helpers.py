"""Small real-data training set-ups shared by the training tests (module level: picklable)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from partialfc.models import MODELS, register_model
from partialfc.train.config import load_config

TINY_MODEL_CONFIG = {
    "name": "test_mlp",
    "kwargs": {"embedding_dim": 16, "input_size": 28, "in_channels": 1},
}


def register_test_model(name: str):
    """``register_model`` that lets this module be imported a second time (another name,
    ``importlib.reload``): ``name`` then keeps its first builder, a function of the same name."""

    def register(builder):
        if getattr(MODELS.get(name), "__qualname__", None) == builder.__qualname__:
            return builder
        return register_model(name)(builder)

    return register


class TinyMLP(nn.Module):
    """28×28 → 16-d; no batch norm or dropout, so a 2-rank step equals a 1-rank step exactly."""

    def __init__(self, in_features: int = 784, embedding_dim: int = 16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, 64), nn.PReLU(64), nn.Linear(64, embedding_dim)
        )

    def forward(self, x):
        return self.net(x)


@register_test_model("test_mlp")
def build_tiny_mlp(embedding_dim=16, input_size=28, in_channels=1, dropout=0.0) -> nn.Module:
    """TinyMLP under the model registry: its checkpoints reload with ``build_model``."""
    height, width = (input_size, input_size) if isinstance(input_size, int) else input_size
    return TinyMLP(in_channels * height * width, embedding_dim)


class TinyCNN(nn.Module):
    """28×28 → 32-d: two conv–BN–ReLU–pool stages, a linear embedding and BN."""

    def __init__(self, embedding_dim: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, embedding_dim), nn.BatchNorm1d(embedding_dim),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


TINY_CNN_CONFIG = {"name": "test_cnn", "kwargs": {"embedding_dim": 32}}


@register_test_model("test_cnn")
def build_tiny_cnn(embedding_dim=32, input_size=28, in_channels=1, dropout=0.0) -> nn.Module:
    """TinyCNN under the model registry: its checkpoints reload with ``build_model``."""
    return TinyCNN(embedding_dim)


def tiny_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyCNN()


def tiny_backbone(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyMLP()


def omniglot_subset(num_classes: int):
    """The first ``num_classes`` Omniglot background classes (20 real drawings each)."""
    from partialfc.data.datasets import ArrayDataset
    from partialfc.data.loaders import load_omniglot

    data = load_omniglot("background")
    keep = data.labels < num_classes
    return ArrayDataset(data.images[keep], data.labels[keep])


def tiny_config(run_dir: Path, *overrides: str):
    """fp32, no workers, no eval; tests add what they need through ``overrides``."""
    base = [
        "data.source=omniglot",
        "data.input_size=28",
        "data.num_workers=0",
        "data.augment.hflip=false",
        "model.embedding_dim=16",
        "head.margin.scale=16.0",
        "head.margin.m2_rad=0.3",
        "optim.grad_clip_norm=null",
        "train.precision=fp32",
        "train.log_every=1",
        "train.diagnostics_every=0",
        "train.num_threads=1",
        "checkpoint.every_steps=0",
        "checkpoint.at_epoch_end=false",
        "checkpoint.keep_last=10",
        "run.progress=false",
        f"run.output_dir={run_dir}",
        "run.name=run",
    ]
    return load_config(None, base + list(overrides))


def flat_params(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def as_numpy(losses) -> np.ndarray:
    return np.asarray(losses, dtype=np.float64)


class NaNOnCalls(nn.Module):
    """Wraps a backbone; its output is NaN on the given (1-based) forward calls."""

    def __init__(self, inner: nn.Module, bad_calls):
        super().__init__()
        self.inner = inner
        self.bad_calls = bad_calls
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.inner(x)
        return out * float("nan") if self.calls in self.bad_calls else out
