"""Row-sparse optimizers for :class:`~partialfc.classifier.PartialFC` (sparse update mode).

Only the rows that were active in the last forward move, and only their optimizer state
changes; every other center and its momentum / moments stay bit-identical (Partial FC, An et al.,
arXiv 2010.05222, Eq. 4:
"unsampled centers remain in optimizer state"). The handshake is explicit: ``forward`` records
the active rows, ``backward`` fills the softmax coefficients, ``step()`` consumes the record,
walking the active rows a chunk at a time (the layer's ``chunk_rows``):
read the rows and their state, rebuild their gradient (one GEMM,
:meth:`ActiveRows.center_grad`, with the coupled weight decay folded in), update, write back.
The working memory is a few chunk buffers, independent of the number of classes.

On the active rows the arithmetic is exactly torch's (per row):

* :class:`RowSparseSGD`: ``g = grad + wd * w``; ``buf = momentum * buf + g``
  (zero-initialised, so the first update is ``buf = g`` as in ``torch.optim.SGD``);
  ``w -= lr * (g + momentum * buf if nesterov else buf)``.
* :class:`RowSparseAdamW`: ``w *= 1 - lr * wd``; ``m = b1 m + (1-b1) g``;
  ``v = b2 v + (1-b2) g^2``; ``w -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)`` with a
  per-row step count ``t`` (a row's bias correction counts only the steps it was active).

Both subclass ``torch.optim.Optimizer`` so LR schedulers drive ``param_groups[0]["lr"]``.
State tensors live in :class:`~partialfc.classifier.storage.RowTable` s next to the centers, in
``state_dtype`` (default: the center storage dtype; bfloat16 with stochastic rounding).
``state_dict()`` / ``load_state_dict()`` hold this rank's block; see
:mod:`partialfc.classifier.checkpoint` for sharded, reshardable checkpoints.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from partialfc.classifier.sampling import sampling_generator
from partialfc.classifier.shard import ShardedCenters
from partialfc.classifier.storage import ReusableBuffer, RowTable

__all__ = ["RowSparseSGD", "RowSparseAdamW", "RowSparseOptimizer"]


class RowSparseOptimizer(torch.optim.Optimizer):
    """Base: owns per-row state tables and the consume-the-record step loop."""

    #: names of the per-row float state tables, in order
    state_names: tuple[str, ...] = ()

    def __init__(self, partial_fc: ShardedCenters, defaults: dict, state_dtype=None) -> None:
        if not callable(getattr(partial_fc, "consume_active_rows", None)):  # the ActiveRows source
            raise ValueError(f"expected a PartialFC, got {type(partial_fc).__name__}")
        if partial_fc.update != "sparse":
            raise ValueError(
                'row-sparse optimizers need PartialFC(update="sparse"); for update="dense" use '
                "a torch optimizer on partial_fc.parameters()"
            )
        lr = defaults.get("lr")
        if not (isinstance(lr, (int, float)) and lr >= 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
        self.partial_fc = partial_fc
        centers = partial_fc.centers
        super().__init__([centers.data], defaults)
        self.state_dtype = state_dtype or centers.dtype
        self.tables: dict[str, RowTable] = {
            name: RowTable(
                centers.shape[0],
                centers.shape[1],
                self.state_dtype,
                centers.storage_device,
                centers.compute_device,
                chunk_rows=partial_fc.chunk_rows,
            )
            for name in self._active_state_names()
        }
        self._scratch = {name: ReusableBuffer(centers.compute_device) for name in self.tables}
        self._weight_scratch = ReusableBuffer(centers.compute_device)
        self._grad_scratch = ReusableBuffer(centers.compute_device)
        self._radial_scratch = ReusableBuffer(centers.compute_device)  # center_grad temporaries
        self.num_steps = 0

    def _active_state_names(self) -> tuple[str, ...]:
        return self.state_names

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: center gradients live in the forward's record, consumed by step()."""

    @torch.no_grad()
    def step(self, closure=None):
        """Update the rows recorded by the last forward (no-op when there is none)."""
        if closure is not None:
            raise ValueError("row-sparse optimizers do not support closures")
        record = self.partial_fc.consume_active_rows()
        if record is None:
            return None
        pfc = self.partial_fc
        # stochastic rounding: a host generator draws each chunk's noise offset, so the host
        # never waits for the device to learn it
        gen = sampling_generator(pfc.seed + 1, self.num_steps, pfc.rank)
        group = self.param_groups[0]
        step = pfc.chunk_rows  # bounded scratch (the layer's setting)
        for lo in range(0, record.rows.numel(), step):
            hi = min(lo + step, record.rows.numel())
            rows = record.rows[lo:hi]
            weight = record.read_weight(lo, hi, self._weight_scratch)
            decay = self._coupled_weight_decay(group)
            grad = record.center_grad(
                lo, hi, weight, self._grad_scratch, decay, self._radial_scratch
            )
            state = {n: t.read(rows, self._scratch[n]) for n, t in self.tables.items()}
            self._update_rows(rows, weight, grad, state, group)
            for name, table in self.tables.items():
                table.write(rows, state[name], gen)
            pfc.centers.write(rows, weight, gen)
        self.num_steps += 1
        return None

    def _coupled_weight_decay(self, group) -> float:
        """L2 coefficient folded into the gradient (``g + wd * w``); 0 when decay is decoupled."""
        return 0.0

    def _update_rows(self, rows, weight, grad, state, group) -> None:
        """Update ``weight`` and ``state`` of one chunk in place; ``grad`` may be overwritten."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def _hyperparameters(self) -> dict:
        return {k: v for k, v in self.param_groups[0].items() if k != "params"}

    def state_dict(self) -> dict:
        """This rank's state: hyper-parameters, step count and row tables (storage dtype)."""
        pfc = self.partial_fc
        return {
            "type": type(self).__name__,
            "param_groups": [self._hyperparameters()],
            "num_steps": self.num_steps,
            "class_start": pfc.block.start,
            "class_stop": pfc.block.stop,
            "state": {name: t.data.clone() for name, t in self.tables.items()},
            **self._extra_state(),
        }

    def _extra_state(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict` of the same block (use checkpoint.load_* to reshard)."""
        if state_dict.get("type") != type(self).__name__:
            raise ValueError(
                f"optimizer state is for {state_dict.get('type')!r}, not {type(self).__name__}"
            )
        pfc = self.partial_fc
        block = (state_dict.get("class_start"), state_dict.get("class_stop"))
        if block != (pfc.block.start, pfc.block.stop):
            raise ValueError(
                f"optimizer state covers classes {block}, this rank owns "
                f"{(pfc.block.start, pfc.block.stop)}; use partialfc.classifier.checkpoint"
            )
        self.load_hyperparameters(state_dict["param_groups"][0], state_dict["num_steps"])
        for name in self.tables:
            self.load_rows(name, 0, state_dict["state"][name])
        self._load_extra_state(state_dict, 0)

    def load_hyperparameters(self, hyper: dict, num_steps: int) -> None:
        for key, value in hyper.items():
            if key in self.param_groups[0]:
                self.param_groups[0][key] = value
        self.num_steps = int(num_steps)

    def load_rows(self, name: str, first_row: int, values: Tensor) -> None:
        """Copy ``values`` into rows ``[first_row, first_row + len(values))`` of a state table."""
        table = self.tables[name]
        if values.shape[1:] != table.shape[1:] or first_row + values.shape[0] > table.shape[0]:
            raise ValueError(
                f"optimizer state {name!r} of shape {tuple(values.shape)} does not fit"
            )
        table.data[first_row : first_row + values.shape[0]].copy_(values)

    def _load_extra_state(self, state_dict: dict, first_row: int) -> None:
        pass


class RowSparseSGD(RowSparseOptimizer):
    """SGD with momentum and (coupled) weight decay on the active rows only.

    Args:
        partial_fc: a ``PartialFC(update="sparse")``.
        lr: learning rate.
        momentum: default 0.9 (0 keeps no state: 0 extra bytes per class).
        weight_decay: L2 coefficient added to the gradient, default 5e-4.
        nesterov: default False.
        state_dtype: momentum storage dtype (default: the center storage dtype).
    """

    state_names = ("momentum_buffer",)

    def __init__(
        self,
        partial_fc: ShardedCenters,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        nesterov: bool = False,
        state_dtype=None,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("nesterov needs momentum > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        self._has_momentum = momentum > 0
        super().__init__(partial_fc, defaults, state_dtype)

    def _active_state_names(self) -> tuple[str, ...]:
        return self.state_names if self._has_momentum else ()

    def _coupled_weight_decay(self, group) -> float:
        return group["weight_decay"]

    def _update_rows(self, rows, weight, grad, state, group) -> None:
        lr, mom = group["lr"], group["momentum"]  # grad already holds + weight_decay * w
        if self._has_momentum:
            buf = state["momentum_buffer"]
            torch.add(grad, buf, alpha=mom, out=buf)  # buf = mom * buf + g, one pass
            if group["nesterov"]:
                grad.add_(buf, alpha=mom)
            else:
                grad = buf
        weight.add_(grad, alpha=-lr)


class RowSparseAdamW(RowSparseOptimizer):
    """AdamW (decoupled weight decay) on the active rows, per-row bias correction.

    Args:
        partial_fc: a ``PartialFC(update="sparse")``.
        lr: learning rate. betas: default (0.9, 0.999). eps: default 1e-8.
        weight_decay: decoupled, default 1e-2 (torch's default).
        state_dtype: storage dtype of both moments (default: the center storage dtype).
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        partial_fc: ShardedCenters,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        state_dtype=None,
    ) -> None:
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps <= 0 or weight_decay < 0:
            raise ValueError(f"need eps > 0 and weight_decay >= 0, got {eps}, {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(partial_fc, defaults, state_dtype)
        self.row_steps = torch.zeros(
            partial_fc.centers.shape[0], dtype=torch.int32, device=partial_fc.centers.data.device
        )

    def _update_rows(self, rows, weight, grad, state, group) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        rows_s = rows.to(self.row_steps.device)
        self.row_steps.index_add_(0, rows_s, torch.ones_like(rows_s, dtype=torch.int32))
        t = self.row_steps.index_select(0, rows_s).to(weight.device, torch.float64)
        bias1 = (1.0 - b1**t).float().unsqueeze(1)
        bias2_sqrt = (1.0 - b2**t).sqrt().float().unsqueeze(1)
        weight.mul_(1.0 - lr * wd)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(grad, alpha=1.0 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
        denom = (v.sqrt() / bias2_sqrt).add_(eps)
        weight.addcdiv_(m / bias1, denom, value=-lr)

    def _extra_state(self) -> dict:
        return {"row_steps": self.row_steps.clone()}

    def _load_extra_state(self, state_dict: dict, first_row: int) -> None:
        steps = state_dict["row_steps"]
        self.row_steps[first_row : first_row + steps.shape[0]].copy_(steps)
