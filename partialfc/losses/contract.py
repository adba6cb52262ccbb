"""The head contract: what the trainer and the tools may ask of any loss head.

A *head* turns a batch of embeddings and their labels into a scalar loss and owns whatever
it learns along the way (class centers, proxies, nothing at all)::

    loss = head(embeddings, labels)                  # (B, d) float, (B,) long -> scalar
    optimizer = head.make_optimizer(OptimizerSettings(name="sgd", lr=0.1))
    margin = head.angular_margin()                   # CombinedMargin, or None
    head.prepare_step(labels)                        # labels of all micro-batches of a step
    head.discard_step()                              # the step was skipped after backward
    head.save_state(directory, optimizer)            # and head.load_state(directory, optimizer)
    stats = head.diagnostics(embeddings, labels)     # {name: float}, may be empty
    centers = head.class_centers()                   # (C * K, d) float32, or None

:class:`Head` implements every method but ``forward`` for a dense head (all parameters on
one process, a standard ``torch.optim`` optimizer, one ``head.safetensors`` file). Partial FC
(:class:`partialfc.classifier.PartialFC`) overrides the optimizer (row-sparse), the state
(sharded, reshardable), the step hand-shake and the diagnostics; heads without parameters
(triplet, contrastive) need no override at all.

Members of the family: :class:`~partialfc.classifier.PartialFC`,
:class:`~partialfc.losses.heads.MarginSoftmaxHead` (with sub-centers),
:class:`~partialfc.losses.heads.SoftmaxHead`, :class:`~partialfc.losses.proxy_nca.ProxyNCALoss`,
:class:`~partialfc.losses.triplet.TripletLoss` and
:class:`~partialfc.losses.contrastive.ContrastiveLoss`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Head", "OptimizerSettings", "center_diagnostics", "stats_as_floats"]

HEAD_STATE_FILE = "head.safetensors"
OPTIMIZER_STATE_FILE = "optimizer.pt"


@dataclass(frozen=True)
class OptimizerSettings:
    """Hyper-parameters of a head's optimizer (the same fields for every head).

    Defaults: ``sgd``, lr 0.1, momentum 0.9, weight decay 5e-4, AdamW betas (0.9, 0.999) and
    eps 1e-8.
    """

    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class Head(nn.Module):
    """Base class of the loss heads; subclasses implement ``forward(embeddings, labels)``.

    ``num_subcenters`` is K of :meth:`class_centers` (default 1).
    """

    num_subcenters: int = 1

    def angular_margin(self):
        """The :class:`~partialfc.losses.margins.CombinedMargin` on the logits, which margin
        schedules drive and checkpoints record; None for a head without one (default)."""
        return None

    # ------------------------------------------------------------------ optimizer
    def make_optimizer(self, settings: OptimizerSettings) -> torch.optim.Optimizer:
        """``torch.optim.SGD`` or ``AdamW`` over the head's parameters.

        A head without parameters gets an optimizer with one empty parameter group, so a
        learning-rate schedule and ``step()`` work unchanged.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": params}]
        if settings.name == "sgd":
            return torch.optim.SGD(
                groups,
                lr=settings.lr,
                momentum=settings.momentum,
                weight_decay=settings.weight_decay,
            )
        if settings.name == "adamw":
            return torch.optim.AdamW(
                groups,
                lr=settings.lr,
                betas=tuple(settings.betas),
                eps=settings.eps,
                weight_decay=settings.weight_decay,
            )
        raise ValueError(f"optimizer name={settings.name!r}: choose sgd or adamw")

    def prepare_step(self, labels: Tensor) -> None:
        """An optimizer step of several micro-batches (gradient accumulation) begins; ``labels``
        are this rank's labels of all of them. A head that samples classes draws once per
        optimizer step, from their union (Partial FC); a dense head has nothing to plan (its
        parameter gradients add up in autograd). Default: nothing."""

    def discard_step(self) -> None:
        """Forget what the last forward/backward prepared for an optimizer step that will not
        happen (the trainer skipped it). Nothing to forget for a dense head."""

    # ------------------------------------------------------------------ state
    def save_state(self, directory: str | Path, optimizer=None) -> None:
        """``head.safetensors`` (the state dict) [+ ``optimizer.pt``] in ``directory``."""
        from safetensors.torch import save_file

        from partialfc.atomic import atomic_output

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        with atomic_output(directory / HEAD_STATE_FILE) as tmp:
            save_file(state, str(tmp))
        if optimizer is not None:
            with atomic_output(directory / OPTIMIZER_STATE_FILE) as tmp:
                torch.save(optimizer.state_dict(), tmp)

    def load_state(self, directory: str | Path, optimizer=None) -> None:
        """Restore what :meth:`save_state` wrote (tensors only; nothing is unpickled)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        path = directory / HEAD_STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: no {HEAD_STATE_FILE} (head state)")
        self.load_state_dict(load_file(str(path)))
        if optimizer is not None:
            opt_path = directory / OPTIMIZER_STATE_FILE
            if not opt_path.is_file():
                raise FileNotFoundError(f"{directory}: no {OPTIMIZER_STATE_FILE}")
            optimizer.load_state_dict(torch.load(opt_path, map_location="cpu", weights_only=True))

    # ------------------------------------------------------------------ read-outs
    def diagnostics(self, embeddings: Tensor, labels: Tensor, seed: int = 0) -> dict[str, float]:
        """Statistics of the last step, ``{name: float}``; ``{}`` when the head has none.

        Heads with class centers report APCS / AMNCS / MICS (:func:`center_diagnostics`).
        """
        centers = self.class_centers()
        if centers is None:
            return {}
        return center_diagnostics(embeddings, labels, centers, self.num_subcenters, seed)

    def class_centers(self) -> Tensor | None:
        """The whole ``(C * K, d)`` float32 center table (class-major sub-centers), a copy;
        None for a head without centers (pair losses)."""
        return None


@torch.no_grad()
def center_diagnostics(
    embeddings: Tensor,
    labels: Tensor,
    centers: Tensor,
    num_subcenters: int = 1,
    seed: int = 0,
    mics_classes: int = 512,
) -> dict[str, float]:
    """APCS, AMNCS and MICS (Partial FC, An et al., CVPR 2022, §3.3) over all classes.

    * APCS  = mean_i cos(x_i, w_{y_i})                   (intra-class compactness)
    * AMNCS = mean_i max_{j != y_i} cos(x_i, w_j)         (hardest negative)
    * MICS  = max_{i != j} cos(w_i, w_j) over up to ``mics_classes`` sampled classes

    A class's cosine is the max over its ``num_subcenters`` rows (for MICS too: the largest
    cosine between any sub-centers of two different classes).
    """
    k = int(num_subcenters)
    x = F.normalize(embeddings.float(), dim=1)
    w = F.normalize(centers.float().to(x.device), dim=1)
    cos = x @ w.t()
    if k > 1:
        cos = cos.reshape(cos.shape[0], -1, k).amax(dim=2)
    labels = labels.long().to(x.device)
    positive = cos.gather(1, labels.unsqueeze(1)).squeeze(1)
    negative = cos.scatter(1, labels.unsqueeze(1), -float("inf")).amax(dim=1)
    num_classes = w.shape[0] // k
    gen = torch.Generator().manual_seed(int(seed) * 7919)
    picked = torch.randperm(num_classes, generator=gen)[: min(mics_classes, num_classes)]
    rows = (picked.unsqueeze(1) * k + torch.arange(k)).reshape(-1).to(w.device)
    sample = w[rows]
    owner = torch.arange(sample.shape[0], device=w.device) // k  # same class <=> same slot
    gram = sample @ sample.t()
    gram.masked_fill_(owner.unsqueeze(0) == owner.unsqueeze(1), -float("inf"))
    return {
        "apcs": float(positive.mean()),
        "amncs": float(negative.mean()),
        "mics": float(gram.max()) if picked.numel() > 1 else float("nan"),
        "mics_classes": int(picked.numel()),
    }


def stats_as_floats(stats) -> dict[str, float]:
    """A ``*Stats`` dataclass of a pair/proxy loss as ``{field: float}`` ({} for None)."""
    if stats is None:
        return {}
    return {key: float(value) for key, value in dataclasses.asdict(stats).items()}
