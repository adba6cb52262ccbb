"""Model inversion: synthesise inputs from a trained backbone alone, no generator (ArcFace,
Deng et al., IEEE TPAMI 2022).

Start from noise ``x`` and run Adam on the *input*, minimising::

    L = L_id(f(x)) + λ_BN · Σ_l (‖μ̃_l − μ_l‖² + ‖σ̃_l − σ_l‖²) + λ_TV · TV(x) + λ_2 · mean(x²)

* ``L_id``: close-set, the softmax cross-entropy of ``s · cos(f(x), W)`` against a class of the
  center table ``W`` (:class:`ClassCenterTarget`); open-set, ``‖f̂(x) − t̂‖²`` to a given
  embedding ``t`` (:class:`EmbeddingTarget`), so identities never trained on can be inverted.
* BN prior: ``μ̃_l, σ̃_l`` are the batch mean / std of the input of every BatchNorm2d ``l``,
  ``μ_l, σ_l`` its running statistics (what the network saw in training). λ_BN = 0.05.
* ``TV(x)``: mean squared difference of neighbouring pixels (λ_TV = 1e-3); λ_2 = 1e-4.
* Seed hyper-parameters: Adam, lr 0.25, 20K steps, 256 images per batch.

Privacy: a stored template (embedding) is enough to synthesise an input the model matches
to that identity; templates must be protected like the images they came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EmbeddingTarget:
    """Open-set target: ``loss = mean_i ‖f̂(x_i) − t̂_i‖² = mean_i (2 − 2 cos_i)``."""

    def __init__(self, embeddings: Tensor):
        self.embeddings = F.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=1)

    @property
    def num_images(self) -> int:
        return self.embeddings.shape[0]

    def cosine(self, features: Tensor) -> Tensor:
        return (F.normalize(features, dim=1) * self.embeddings).sum(1)

    def loss(self, features: Tensor) -> Tensor:
        return (F.normalize(features, dim=1) - self.embeddings).square().sum(1).mean()


class ClassCenterTarget:
    """Close-set target: cross-entropy of ``scale · cos(f(x), centers)`` against ``labels``."""

    def __init__(self, centers: Tensor, labels, scale: float = 64.0):
        self.centers = F.normalize(torch.as_tensor(centers, dtype=torch.float32), dim=1)
        self.labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
        if self.labels.numel() and (
            self.labels.min() < 0 or self.labels.max() >= self.centers.shape[0]
        ):
            raise ValueError(f"labels must lie in [0, {self.centers.shape[0]}), got {self.labels}")
        self.scale = scale

    @property
    def num_images(self) -> int:
        return self.labels.numel()

    def cosine(self, features: Tensor) -> Tensor:
        return (F.normalize(features, dim=1) * self.centers[self.labels]).sum(1)

    def loss(self, features: Tensor) -> Tensor:
        logits = self.scale * F.normalize(features, dim=1) @ self.centers.T
        return F.cross_entropy(logits, self.labels)


@dataclass(frozen=True)
class InversionConfig:
    steps: int = 2000  # ArcFace (Deng et al., TPAMI 2022) runs 20K
    lr: float = 0.25
    bn_weight: float = 0.05
    tv_weight: float = 1e-3
    l2_weight: float = 1e-4
    init_std: float = 0.5  # noise in the normalised input space [-1, 1]
    seed: int = 0
    log_every: int = 100


@dataclass
class InversionResult:
    images: np.ndarray  # uint8 (n, H, W) grey or (n, H, W, 3) RGB
    cosine_start: np.ndarray  # (n,) cosine to the target at the initial noise
    cosine: np.ndarray  # (n,) cosine to the target at the end
    history: list[dict] = field(default_factory=list)  # logged loss terms

    def to_dict(self) -> dict:
        return {
            "cosine_start": self.cosine_start.tolist(),
            "cosine": self.cosine.tolist(),
            "history": self.history,
        }


class BatchNormPrior:
    """Collects ``Σ_l ‖μ̃_l − μ_l‖² + ‖σ̃_l − σ_l‖²`` over the BatchNorm2d layers of a model."""

    def __init__(self, model: nn.Module):
        self.terms: list[Tensor] = []
        self.handles = [
            m.register_forward_hook(self._hook)
            for m in model.modules()
            if isinstance(m, nn.BatchNorm2d) and m.track_running_stats
        ]
        if not self.handles:
            raise ValueError("the model has no BatchNorm2d with running statistics")

    def _hook(self, module: nn.BatchNorm2d, inputs, output) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.var(dim=(0, 2, 3), unbiased=False)
        std = torch.sqrt(var + module.eps)
        running_std = torch.sqrt(module.running_var + module.eps)
        self.terms.append(
            (mean - module.running_mean).square().sum() + (std - running_std).square().sum()
        )

    def pop(self) -> Tensor:
        total = torch.stack(self.terms).sum()
        self.terms = []
        return total

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def total_variation(x: Tensor) -> Tensor:
    """Mean squared difference between vertically and horizontally adjacent pixels."""
    return (x[..., 1:, :] - x[..., :-1, :]).square().mean() + (
        x[..., :, 1:] - x[..., :, :-1]
    ).square().mean()


def to_uint8(x: Tensor) -> np.ndarray:
    """Normalised ``(n, C, H, W)`` in [-1, 1] → uint8 ``(n, H, W)`` or ``(n, H, W, 3)``."""
    images = ((x.detach().clamp(-1, 1) * 0.5 + 0.5) * 255).round().to(torch.uint8).numpy()
    return images[:, 0] if images.shape[1] == 1 else images.transpose(0, 2, 3, 1)


def invert(
    model: nn.Module, target, config: InversionConfig = InversionConfig()
) -> InversionResult:
    """Optimise ``target.num_images`` inputs of the model's ``input_size``/``in_channels``.

    The model is run in eval mode (BatchNorm uses its running statistics) and its parameters
    receive no gradients; its training flag is restored afterwards.
    """
    h, w = model.input_size
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.randn(target.num_images, model.in_channels, h, w, generator=gen) * config.init_std
    x = x.clamp_(-1, 1).requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=config.lr)
    was_training = model.training
    model.eval()
    prior = BatchNormPrior(model)
    history = []
    try:
        with torch.no_grad():
            cosine_start = target.cosine(model(x)).numpy()
            prior.pop()
        for step in range(config.steps):
            features = model(x)
            identity = target.loss(features)
            bn = prior.pop()
            tv = total_variation(x)
            l2 = x.square().mean()
            loss = identity + config.bn_weight * bn + config.tv_weight * tv + config.l2_weight * l2
            (grad,) = torch.autograd.grad(loss, [x])
            x.grad = grad
            optimizer.step()
            with torch.no_grad():
                x.clamp_(-1, 1)
            if step % config.log_every == 0 or step == config.steps - 1:
                history.append(
                    {
                        "step": step,
                        "identity": float(identity.detach()),
                        "bn_prior": float(bn.detach()),
                        "tv": float(tv.detach()),
                        "l2": float(l2.detach()),
                        "mean_cosine": float(target.cosine(features.detach()).mean()),
                    }
                )
        with torch.no_grad():
            cosine = target.cosine(model(x)).numpy()
            prior.pop()
    finally:
        prior.remove()
        model.train(was_training)
    return InversionResult(to_uint8(x), cosine_start, cosine, history)


# ---------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("model", help="exported directory or training checkpoint/run (PyTorch)")
    parser.add_argument("--out", required=True, help="output directory for PNGs + result.json")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--target-image", nargs="+", help="open-set: invert these faces' embeddings"
    )
    target.add_argument("--centers", help="close-set: .npy / .safetensors center table (N, d)")
    parser.add_argument("--classes", type=int, nargs="+", help="close-set: class indices")
    parser.add_argument(
        "--steps", type=int, default=InversionConfig.steps, help="optimisation steps"
    )
    parser.add_argument(
        "--lr", type=float, default=InversionConfig.lr, help="Adam learning rate on the input"
    )
    parser.add_argument(
        "--bn-weight",
        type=float,
        default=InversionConfig.bn_weight,
        help="weight of the batch-norm statistics prior",
    )
    parser.add_argument(
        "--tv-weight",
        type=float,
        default=InversionConfig.tv_weight,
        help="weight of the total-variation prior",
    )
    parser.add_argument(
        "--l2-weight",
        type=float,
        default=InversionConfig.l2_weight,
        help="weight of the L2 prior on the input",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the starting noise")


def load_centers(path: str) -> Tensor:
    """A center table from ``.npy`` (no pickle) or ``.safetensors`` (key ``centers``)."""
    p = Path(path)
    if p.suffix == ".npy":
        return torch.from_numpy(np.load(p, allow_pickle=False)).float()
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        table = load_file(str(p))
        if "centers" not in table:
            raise ValueError(f"{p}: no tensor named 'centers' (has {sorted(table)})")
        return table["centers"].float()
    raise ValueError(f"{p}: expected a .npy or .safetensors center table")


def run(args: argparse.Namespace) -> int:
    import cv2

    from partialfc.atomic import atomic_write_bytes
    from partialfc.backbone.embedder import Embedder, TorchBackend
    from partialfc.deploy.command import read_images
    from partialfc.ranges import Range, check_options

    try:
        check_options(
            args,
            {
                "--steps": Range(1, integer=True),
                "--lr": Range(0, low_open=True),
                "--bn-weight": Range(0),
                "--tv-weight": Range(0),
                "--l2-weight": Range(0),
                "--seed": Range(0, 2**32 - 1, integer=True),
            },
        )
        embedder = Embedder.load(args.model, backend="torch")
        if not isinstance(embedder.backend, TorchBackend):
            raise ValueError(f"{args.model}: inversion needs PyTorch weights, not an ONNX file")
        model = embedder.backend.model
        if args.centers:
            if not args.classes:
                raise ValueError("--centers needs --classes")
            target = ClassCenterTarget(load_centers(args.centers), args.classes)
        else:
            images = read_images(args.target_image, embedder.spec.in_channels == 1)
            target = EmbeddingTarget(torch.from_numpy(embedder.embed_raw(images)))
    except (ValueError, FileNotFoundError) as err:
        print(f"partialfc invert: {err}", file=sys.stderr)
        return 2
    config = InversionConfig(
        steps=args.steps,
        lr=args.lr,
        bn_weight=args.bn_weight,
        tv_weight=args.tv_weight,
        l2_weight=args.l2_weight,
        seed=args.seed,
    )
    result = invert(model, target, config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(result.images):
        bgr = image if image.ndim == 2 else image[..., ::-1]
        ok, png = cv2.imencode(".png", np.ascontiguousarray(bgr))
        atomic_write_bytes(out / f"inverted_{i:03d}.png", png.tobytes())
    atomic_write_bytes(out / "result.json", json.dumps(result.to_dict(), indent=2).encode())
    for i, (c0, c1) in enumerate(zip(result.cosine_start, result.cosine, strict=True)):
        print(f"image {i}: cosine to target {c0:+.3f} -> {c1:+.3f}")
    return 0
