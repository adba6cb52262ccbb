"""The training loop: a data-parallel backbone feeding a loss head (by default a
model-parallel Partial FC head).

One step on every rank::

    x  = (uint8 batch / 255 − 0.5) / 0.5
    e  = backbone(x)                      # DDP replica; autocast bf16 (CPU) / fp16 (GPU)
    e  = scale_gradient(e.float(), loss_scale)
    L  = w_cls · head(e, labels)          # fp32; Partial FC: mean over the global batch
       + Σ term(StepContext(x, e, labels, head, step)).loss   # extra terms (triplet, distill)
    L.backward(); clip(backbone); step backbone and head optimizers

Extra loss terms (:mod:`partialfc.train.extra_losses`) come from the ``loss`` config section
(triplet) and from the ``extra_losses`` argument (e.g. distillation); their diagnostics are
logged as window means under ``terms`` in the ``train`` records of ``metrics.jsonl``. With
``loss.classifier_weight = 0`` the head is neither run nor stepped.

The head is any :class:`partialfc.losses.contract.Head` (``head.kind``): the trainer asks it
for its optimizer, its checkpoint state, its diagnostics and its angular margin (for the
margin schedule), and tells it when a step is skipped; nothing here is specific to one kind.

Gradient scale across ranks: Partial FC returns each rank the full gradient of the global-mean
loss for its own rows, so the backbone update must be the *sum* of the ranks' gradients while
DDP averages them; Partial FC (``backbone_grad_reduction="mean"``) multiplies the embedding
gradient by the world size so that DDP's average is that sum (tested: 2 ranks × b gives the
update of 1 rank × 2b). The fp16 loss scale is applied to the embedding gradient rather than to
``L``: only the fp16 backbone needs it, and the head's centers receive unscaled fp32 gradients.

Gradient accumulation (``train.accumulate_steps = k``): one optimizer step consumes k loader
batches (micro-batches). Each micro-batch's loss is weighted by its share of the step's samples
and back-propagated at once (memory of one micro-batch); DDP synchronises only on the last one.
The sampled head draws its negatives once per optimizer step, from the union of the positives
of the k micro-batches (:meth:`Head.prepare_step`), so a step of k micro-batches of b is exactly
a step of one batch of k·b (tested), as long as the backbone has no batch statistics (batch
norm sees each micro-batch alone). Everything that counts steps counts optimizer steps: the
LR and margin schedules, ``log_every``, ``eval.every_steps``, ``checkpoint.every_steps``, grad
clipping (once, on the summed gradient). An epoch has ``floor(batches / k)`` steps (the last
``batches mod k`` batches are left out). Checkpoints are written between optimizer steps only,
so a resumed run never starts inside an accumulation: a run stopped mid-accumulation repeats
those micro-batches from its last checkpoint.

EMA (``train.ema_decay``, :mod:`partialfc.train.ema`): the average of the backbone weights is
updated after every optimizer step that moved the backbone, saved in each checkpoint
(``ema/``), restored on resume, evaluated next to the trained weights, and exported by default.

A non-finite loss (agreed on by all ranks) skips the step, logs the sample indices of the batch,
and stops training after ``train.max_nonfinite_steps`` in a row.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed
from torch import nn

from partialfc.autograd import scale_gradient
from partialfc.backbone import io as backbone_io
from partialfc.backbone.embedding import embed_array
from partialfc.backbone.io import EMA_DIRNAME
from partialfc.backbone.pixels import normalize_batch
from partialfc.eval.protocols.registry import DEFAULT_BATCH_SIZE
from partialfc.train import checkpoint as ckpt
from partialfc.train.builders import (
    build_backbone,
    build_backbone_optimizer,
    build_head,
    build_head_optimizer,
    build_margin_schedule,
)
from partialfc.train.config import Config, config_to_dict, save_config
from partialfc.train.data import EpochSeededDataset, build_augmentation, build_train_set
from partialfc.train.distributed import (
    DistContext,
    all_true,
    barrier,
    setup_distributed,
)
from partialfc.train.ema import BackboneEMA
from partialfc.train.evaluation import append_comparison
from partialfc.train.extra_losses import ExtraLoss, StepContext, TripletTerm
from partialfc.train.lr_schedule import WarmupLR, warmup_steps
from partialfc.train.metrics_log import (
    ConsoleLog,
    MetricsLog,
    Progress,
    drop_records_after,
    step_line,
)
from partialfc.train.run_folder import (
    RunFolderExistsError,
    RunLock,
    continues_in,
    prepare_run_dir,
)
from partialfc.train.threads import apply_num_threads


class NonFiniteLossError(RuntimeError):
    """Training stopped after too many consecutive non-finite losses."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    epochs_completed: float
    losses: list[float] = field(default_factory=list)  # per step run in this call (nan: skipped)
    last_checkpoint: Path | None = None
    skipped_steps: int = 0


def resolve_precision(spec: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for the backbone (None = fp32).

    ``auto``: fp16 (+ GradScaler) on GPU, fp32 on CPU — bf16 autocast is available on CPU
    (``bf16``) but measured 4× slower than fp32 for the compact IResNet on this project's CPU.
    """
    if spec == "auto":
        spec = "fp16" if device.type == "cuda" else "fp32"
    if spec == "fp16" and device.type != "cuda":
        raise ValueError("train.precision='fp16' needs a GPU; use bf16 on CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[spec]


def steps_per_epoch(per_rank_samples: int, batch_size: int, drop_last: bool = True) -> int:
    """Optimizer steps in one epoch of ``per_rank_samples`` samples on each rank."""
    if drop_last:
        return per_rank_samples // batch_size
    return math.ceil(per_rank_samples / batch_size)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _window_means(window: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {key: float(np.mean(values)) for key, values in stats.items()}
        for name, stats in window.items()
    }


class Trainer:
    """Builds everything from a :class:`Config` and runs :meth:`fit`.

    ``backbone`` + ``model_config`` and ``train_set`` may be given to bypass the builders (tests,
    custom models); the checkpoint then records ``model_config`` as given. ``extra_losses`` are
    added to the terms the ``loss`` config section asks for (see
    :mod:`partialfc.train.extra_losses`).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        ctx: DistContext | None = None,
        run_dir: Path | None = None,
        backbone: nn.Module | None = None,
        model_config: dict | None = None,
        train_set=None,
        evaluator=None,
        extra_losses: list[ExtraLoss] | tuple = (),
    ):
        self.cfg = cfg
        self.ctx = ctx or setup_distributed(cfg.train.device)
        self.num_threads = apply_num_threads(cfg.train.num_threads, cfg.data.num_workers)
        seed_everything(cfg.train.seed + self.ctx.rank)
        device = self.ctx.device
        self.run_note = ""  # what choosing the run folder did (printed by the command)
        base = Path(cfg.run.output_dir) / cfg.run.name
        if run_dir is not None:
            self.run_dir = Path(run_dir)
        elif continues_in(base, cfg.checkpoint.resume):
            self.run_dir = base
        else:  # a new run never writes into an earlier run's checkpoints (run.on_exists)
            self.run_dir = self._new_run_dir(base)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        if self.ctx.is_main:  # trash and staging an interrupted run left behind
            ckpt.remove_leftovers(self.checkpoint_dir)
        barrier(self.ctx)

        # ---- data
        base_set = train_set if train_set is not None else build_train_set(cfg.data)
        transform = build_augmentation(cfg.data.augment, cfg.data.input_size)
        self.train_set = EpochSeededDataset(base_set, transform, seed=cfg.train.seed)
        num_classes = cfg.head.num_classes or int(base_set.num_classes)
        self.num_classes = num_classes
        self.sampler = self._build_sampler()
        per_rank = getattr(self.sampler, "num_samples", None) or len(self.sampler)
        bs = cfg.data.batch_size
        self.accumulate_steps = cfg.train.accumulate_steps
        batches = steps_per_epoch(per_rank, bs, cfg.data.drop_last)
        self.steps_per_epoch = batches // self.accumulate_steps
        if batches < 1:
            raise ValueError(
                f"data.batch_size={bs} is larger than this rank's share of the training set "
                f"({per_rank} samples)"
            )
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"train.accumulate_steps={self.accumulate_steps} is more than the {batches} "
                f"batches of data.batch_size={bs} in one epoch"
            )
        self.total_steps = max(1, round(cfg.train.epochs * self.steps_per_epoch))

        # ---- model
        if backbone is None:
            in_channels = int(base_set[0][0].shape[0])
            backbone, model_config = build_backbone(cfg.model, cfg.data.input_size, in_channels)
        elif model_config is None:
            raise ValueError("a custom backbone needs its model_config ({'name', 'kwargs'})")
        self.model_config = model_config
        self.backbone = backbone.to(device)
        if cfg.train.channels_last:
            self.backbone = self.backbone.to(memory_format=torch.channels_last)
        self.model = self.backbone
        if self.ctx.distributed:
            self.model = nn.parallel.DistributedDataParallel(
                self.backbone, device_ids=[device.index] if device.type == "cuda" else None
            )
        self.head, self.margin = build_head(
            cfg.head, cfg.model.embedding_dim, num_classes, cfg.train.seed, device
        )
        self.margin_schedule = (
            build_margin_schedule(cfg.head.margin, self.margin) if self.margin is not None else None
        )
        self.ema = BackboneEMA(self.backbone, cfg.train.ema_decay) if cfg.train.ema_decay else None
        self.last_ema_summary: dict | None = None  # the EMA weights' numbers of evaluate()
        self.optimizer = build_backbone_optimizer(cfg.optim, self.backbone)
        self.head_optimizer = build_head_optimizer(cfg.optim, self.head)
        self.optimizers = [self.optimizer, self.head_optimizer]
        WarmupLR.remember_base_lr(self.optimizers)
        sch = cfg.schedule
        self.lr_schedule = WarmupLR(
            sch.kind,
            total_steps=self.total_steps,
            warmup_steps=warmup_steps(
                sch.warmup_epochs, sch.warmup_fraction, self.steps_per_epoch, self.total_steps
            ),
            power=sch.power,
            milestone_steps=[round(m * self.steps_per_epoch) for m in sch.milestones],
            gamma=sch.gamma,
        )
        self.autocast_dtype = resolve_precision(cfg.train.precision, device)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=self.autocast_dtype == torch.float16 and device.type == "cuda"
        )
        # console lines; fit() copies them to training.log in the run folder (rank 0)
        self.console = ConsoleLog()
        self.evaluator = evaluator
        if getattr(evaluator, "log", None) is print:  # each set's lines off the bar's line
            evaluator.log = self.console
        self.classifier_weight = cfg.loss.classifier_weight
        self.extra_losses = list(extra_losses)
        if cfg.loss.triplet_weight > 0:
            self.extra_losses.insert(
                0,
                TripletTerm(
                    cfg.loss.triplet_weight, cfg.loss.triplet_margin, cfg.loss.triplet_mining
                ),
            )
        names = [term.name for term in self.extra_losses]
        if len(set(names)) != len(names) or "classifier" in names:
            raise ValueError(f"extra loss names must be unique and not 'classifier': {names}")
        self.last_terms: dict[str, dict[str, float]] = {}

        # ---- progress
        self.step = 0  # optimizer steps taken (including skipped non-finite ones)
        self.epoch = 0
        self.batches_in_epoch = 0  # batches of the current epoch already consumed
        self.consecutive_nonfinite = 0
        self.skipped_steps = 0
        self.log = MetricsLog(None)  # fit() opens the run's metrics.jsonl
        self.resumed_step: int | None = None  # set by load_checkpoint
        self.progress = Progress(self.total_steps, 0, enabled=False)
        if cfg.checkpoint.init_from:
            self._init_backbone_from(cfg.checkpoint.init_from)
            if self.ema is not None:  # the average starts from the weights fine-tuning starts from
                self.ema = BackboneEMA(self.backbone, cfg.train.ema_decay)
        if cfg.checkpoint.resume:
            path = ckpt.resolve_checkpoint(cfg.checkpoint.resume, self.run_dir)
            if path is not None:
                self.load_checkpoint(path)

    def _new_run_dir(self, base: Path) -> Path:
        """Rank 0 applies ``run.on_exists`` (:mod:`partialfc.train.run_folder`); all ranks get
        its folder, or its error."""
        choice = [None, "", None]  # folder, note, error
        if self.ctx.is_main:
            try:
                path, note = prepare_run_dir(base, self.cfg.run.on_exists)
                choice = [str(path), note, None]
            except RunFolderExistsError as err:
                choice = [None, "", str(err)]
        if self.ctx.distributed:
            torch.distributed.broadcast_object_list(choice, src=0)
        if choice[2] is not None:
            raise RunFolderExistsError(choice[2])
        self.run_note = choice[1]
        return Path(choice[0])

    # ------------------------------------------------------------------ data

    @property
    def uses_head(self) -> bool:
        """False for a run without the classifier (``loss.classifier_weight = 0``)."""
        return self.classifier_weight > 0

    def _build_sampler(self):
        from partialfc.data.sampler import ResumableDistributedSampler

        data = self.cfg.data
        if data.pk_identities:
            from partialfc.train.data import ResumablePKBatchSampler

            return ResumablePKBatchSampler(
                self.train_set.labels,
                data.pk_identities,
                data.pk_images,
                num_replicas=self.ctx.world_size,
                rank=self.ctx.rank,
                seed=self.cfg.train.seed,
            )
        return ResumableDistributedSampler(
            len(self.train_set),
            num_replicas=self.ctx.world_size,
            rank=self.ctx.rank,
            shuffle=True,
            seed=self.cfg.train.seed,
            drop_last=True,
        )

    @property
    def global_batch(self) -> int:
        return self.cfg.data.batch_size * self.ctx.world_size

    def _loader(self):
        """This epoch's loader, starting after the batches already consumed (mid-epoch resume)."""
        cfg = self.cfg.data
        self.train_set.epoch = self.epoch
        self.sampler.load_state_dict(
            {"epoch": self.epoch, "consumed_samples": self.batches_in_epoch * self.global_batch}
        )
        if cfg.pk_identities:  # the P×K sampler yields whole batches
            batching = {"batch_sampler": self.sampler}
        else:
            batching = {"batch_size": cfg.batch_size, "sampler": self.sampler}
            batching["drop_last"] = cfg.drop_last
        return torch.utils.data.DataLoader(
            self.train_set,
            **batching,
            num_workers=cfg.num_workers,
            pin_memory=self.ctx.device.type == "cuda",
            prefetch_factor=4 if cfg.num_workers > 0 else None,
        )

    # ------------------------------------------------------------------ one step

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        return normalize_batch(images.to(self.ctx.device, non_blocking=True))

    def train_step(self, images, labels, indices, diagnostics: bool = False) -> float | None:
        """One optimizer step on one batch; see :meth:`accumulated_step`."""
        return self.accumulated_step([(images, labels, indices)], diagnostics)

    def accumulated_step(self, batches, diagnostics: bool = False) -> float | None:
        """One optimizer step over the micro-batches ``[(images, labels, indices), ...]``;
        returns the loss (the sample-weighted mean over the micro-batches), or None when it
        was non-finite (step skipped).

        With ``diagnostics=True`` the head's statistics of this step (:meth:`Head.diagnostics`,
        e.g. APCS / AMNCS / MICS, on the last micro-batch) are left in :attr:`last_diagnostics`
        (computed before the optimizers move the centers).
        """
        device = self.ctx.device
        self.lr_schedule.apply(self.optimizers, self.step)
        if self.margin_schedule is not None:
            self.margin_schedule.update(self.step)
        k = len(batches)
        if k > 1 and self.uses_head:  # one negative sample for the whole step
            self.head.prepare_step(torch.cat([batch[1] for batch in batches]))
        sizes = [len(batch[1]) for batch in batches]
        total_loss, terms = 0.0, {}
        for j, (images, labels, indices) in enumerate(batches):
            weight = sizes[j] / sum(sizes)
            no_sync = k > 1 and j < k - 1 and self.ctx.distributed
            with self.model.no_sync() if no_sync else contextlib.nullcontext():
                x = self._normalize(images)
                labels = labels.to(device, non_blocking=True)
                with torch.autocast(
                    device.type,
                    dtype=self.autocast_dtype or torch.float32,
                    enabled=self.autocast_dtype is not None,
                ):
                    embeddings = self.model(x)
                embeddings = embeddings.float()
                if self.scaler.is_enabled():  # (also creates the scaler's scale tensor)
                    embeddings = scale_gradient(
                        embeddings, self.scaler.scale(torch.ones((), device=device))
                    )
                loss = self._total_loss(
                    StepContext(
                        x, embeddings, labels, self.head, self.step, torch.as_tensor(indices)
                    )
                )
                if not all_true(bool(torch.isfinite(loss.detach()).item()), self.ctx):
                    self._skip_step(indices)
                    return None
                (loss * weight if k > 1 else loss).backward()
            total_loss += weight * float(loss.detach())
            for name, values in self.last_terms.items():
                for key, value in values.items():
                    entry = terms.setdefault(name, {})
                    entry[key] = entry.get(key, 0.0) + weight * value
        if k > 1:
            self.last_terms = terms
        if diagnostics and self.uses_head:
            self.last_diagnostics = self.head.diagnostics(
                embeddings.detach(), labels, seed=self.cfg.train.seed + self.step
            )
        clip = self.cfg.optim.grad_clip_norm
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.backbone.parameters(), clip if clip is not None else float("inf")
        )
        grads_finite = bool(torch.isfinite(grad_norm).item())
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # skips by itself on inf/nan
            self.scaler.update()
        elif grads_finite:
            self.optimizer.step()
        if self.uses_head and grads_finite:
            self.head_optimizer.step()
        elif self.uses_head:  # the step does not happen for the head
            self.head.discard_step()
        if self.ema is not None and grads_finite:
            self.ema.update(self.backbone)
        self.optimizer.zero_grad(set_to_none=True)
        self.head_optimizer.zero_grad()
        self._last_grad_norm = float(grad_norm)
        return float(loss.detach()) if k == 1 else total_loss

    def _total_loss(self, ctx: StepContext) -> torch.Tensor:
        """``w_cls · head(e, y) + Σ term.loss``; per-term values go to :attr:`last_terms`."""
        self.last_terms = {}
        total = None
        if self.uses_head:
            total = self.head(ctx.embeddings, ctx.labels)
            if self.extra_losses:
                self.last_terms["classifier"] = {"loss": float(total.detach())}
            if self.classifier_weight != 1.0:
                total = self.classifier_weight * total
        for term in self.extra_losses:
            out = term(ctx)
            self.last_terms[term.name] = dict(out.diagnostics)
            total = out.loss if total is None else total + out.loss
        return total

    def _skip_step(self, indices) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.head_optimizer.zero_grad()
        if self.accumulate_steps > 1 and self.uses_head:  # drop the step's plan and gradients
            self.head.discard_step()
        self.consecutive_nonfinite += 1
        self.skipped_steps += 1
        ids = [int(i) for i in indices]
        self.log.write("nonfinite", self.step, sample_indices=ids, rank=self.ctx.rank)
        self.console(
            f"step {self.step}: non-finite loss on rank {self.ctx.rank}'s batch "
            f"(sample indices {ids[:16]}{' ...' if len(ids) > 16 else ''}); step skipped",
            error=True,
        )
        limit = self.cfg.train.max_nonfinite_steps
        if self.consecutive_nonfinite >= limit:
            raise NonFiniteLossError(
                f"stopping at step {self.step}: {self.consecutive_nonfinite} non-finite losses "
                f"in a row (train.max_nonfinite_steps={limit}). Lower optim.lr, enable "
                f"optim.grad_clip_norm, use train.precision=fp32, or check the data; the sample "
                f"indices of each skipped batch are in {self.log.path}"
            )

    # ------------------------------------------------------------------ loop

    def fit(self) -> TrainResult:
        """Train to ``total_steps``; rank 0 holds the run folder's lock meanwhile."""
        lock = RunLock(self.run_dir).acquire() if self.ctx.is_main else None
        try:
            return self._fit()
        finally:
            if lock is not None:
                lock.release()

    def _fit(self) -> TrainResult:
        cfg = self.cfg
        is_main = self.ctx.is_main
        if is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.yaml")
        if is_main and self.resumed_step is not None:  # the steps after it are trained again
            drop_records_after(self.run_dir / "metrics.jsonl", self.resumed_step)
        self.resumed_step = None
        barrier(self.ctx)
        self.log = MetricsLog(
            self.run_dir / "metrics.jsonl" if is_main else None,
            self.run_dir / "tensorboard" if (is_main and cfg.run.tensorboard) else None,
            mlflow=self._mlflow_log() if (is_main and cfg.run.mlflow) else None,
            config=config_to_dict(cfg),
        )
        if is_main:
            self.console.open(self.run_dir / "training.log")
        self.progress = Progress(self.total_steps, self.step, cfg.run.progress and is_main)
        plain_lines = is_main and not self.progress.active  # no bar: a line every log_every
        result = TrainResult(self.run_dir, self.step, self.step / self.steps_per_epoch)
        global_batch = self.global_batch * self.accumulate_steps  # samples per optimizer step
        window_t, window_steps, window_loss = time.perf_counter(), 0, []
        fit_t, fit_step = window_t, self.step  # for the ETA
        window_terms: dict[str, dict[str, list[float]]] = {}
        try:
            while self.step < self.total_steps:
                pending = []  # the micro-batches of the next optimizer step
                for batch in self._loader():
                    pending.append(batch)
                    if len(pending) < self.accumulate_steps:
                        continue
                    every = cfg.train.diagnostics_every
                    want_diag = bool(every) and (self.step + 1) % every == 0
                    loss = self.accumulated_step(pending, diagnostics=want_diag)
                    for _ in pending:
                        self.sampler.advance(self.global_batch)
                    self.step += 1
                    self.batches_in_epoch += len(pending)
                    pending = []
                    result.losses.append(float("nan") if loss is None else loss)
                    if loss is not None:
                        self.consecutive_nonfinite = 0
                        window_loss.append(loss)
                        for name, values in self.last_terms.items():
                            for key, value in values.items():
                                window_terms.setdefault(name, {}).setdefault(key, []).append(value)
                    window_steps += 1
                    lr = self.optimizer.param_groups[0]["lr"]
                    elapsed = time.perf_counter() - window_t
                    self.progress.update(
                        1,
                        loss=f"{loss:.3f}" if loss is not None else "nan",
                        lr=f"{lr:.2e}",
                        samples_s=f"{window_steps * global_batch / max(elapsed, 1e-9):.0f}",
                    )
                    if self.step % cfg.train.log_every == 0 or self.step == self.total_steps:
                        mean_loss = float(np.mean(window_loss)) if window_loss else float("nan")
                        rate = window_steps * global_batch / max(elapsed, 1e-9)
                        if plain_lines:
                            per_step = (time.perf_counter() - fit_t) / (self.step - fit_step)
                            eta = per_step * (self.total_steps - self.step)
                            epoch = self.step / self.steps_per_epoch
                            self.console(
                                step_line(
                                    self.step, self.total_steps, epoch, mean_loss, lr, rate, eta
                                )
                            )
                        self.log.write(
                            "train",
                            self.step,
                            epoch=self.step / self.steps_per_epoch,
                            loss=mean_loss,
                            lr=lr,
                            samples_per_s=rate,
                            grad_norm=getattr(self, "_last_grad_norm", float("nan")),
                            **({"margin": self._margin_state()} if self.margin is not None else {}),
                            **({"terms": _window_means(window_terms)} if window_terms else {}),
                        )
                        window_t, window_steps, window_loss = time.perf_counter(), 0, []
                        window_terms = {}
                    if want_diag and loss is not None and self.uses_head and self.last_diagnostics:
                        self.log.write("diagnostics", self.step, **self.last_diagnostics)
                    if cfg.eval.every_steps and self.step % cfg.eval.every_steps == 0:
                        self.evaluate(final=False)
                    end_of_epoch = (
                        self.batches_in_epoch == self.steps_per_epoch * self.accumulate_steps
                    )
                    if end_of_epoch:
                        self.epoch += 1
                        self.batches_in_epoch = 0
                    every_ckpt = cfg.checkpoint.every_steps
                    if (every_ckpt and self.step % every_ckpt == 0) or (
                        end_of_epoch and cfg.checkpoint.at_epoch_end
                    ):
                        result.last_checkpoint = self.save_checkpoint()
                    if end_of_epoch or self.step >= self.total_steps:
                        break
            final = self.checkpoint_dir / ckpt.checkpoint_name(self.step)
            if result.last_checkpoint != final:
                # the final state is always on disk (a finished run resumed again re-uses it)
                result.last_checkpoint = final if final.is_dir() else self.save_checkpoint()
        finally:
            self.progress.close()
        result.steps = self.step
        result.epochs_completed = self.step / self.steps_per_epoch
        result.skipped_steps = self.skipped_steps
        self.log.write(
            "done", self.step, epochs=result.epochs_completed, skipped=self.skipped_steps
        )
        return result

    def _mlflow_log(self):
        """An MLflow run named after the run folder (``run.mlflow``); the default store is
        ``run.output_dir/mlruns``."""
        from partialfc.train.metrics_log import MLflowLog

        run = self.cfg.run
        return MLflowLog(
            run.mlflow_tracking_uri,
            run.mlflow_experiment,
            self.run_dir.name,
            config_to_dict(self.cfg),
            Path(run.output_dir) / "mlruns",
        )

    def _margin_state(self) -> dict:
        """The head's angular margin now (schedules change it); ``{}`` without one."""
        m = self.margin
        if m is None:
            return {}
        return {"m1": m.m1, "m2_rad": m.m2_rad, "m3": m.m3, "scale": m.scale}

    # ------------------------------------------------------------------ evaluation

    def embed_fn(self, batch_size: int | None = None, ema: bool = False):
        """``uint8 images (N, [C,] H, W) → float32 (N, d)`` numpy, with the current backbone
        (:func:`partialfc.backbone.embedding.embed_array`, the training precision); ``ema``:
        with the EMA of its weights instead."""
        device = self.ctx.device
        backbone = self.ema.module if ema else self.backbone
        bs = batch_size or self.cfg.eval.batch_size or DEFAULT_BATCH_SIZE

        def embed(images: np.ndarray) -> np.ndarray:
            return embed_array(backbone, images, bs, device, self.autocast_dtype)

        return embed

    def evaluate(self, final: bool) -> dict | None:
        """Run the configured verification protocols on rank 0; log and return the summary.

        With ``train.ema_decay`` the EMA weights are evaluated too (report in ``ema/`` of the
        report folder, record ``eval_ema``, summary in :attr:`last_ema_summary`) and the
        report ends with both sets of numbers side by side.
        """
        if self.evaluator is None or not self.ctx.is_main:
            barrier(self.ctx)
            return None
        out_dir = self.run_dir / ("report" if final else f"eval/step-{self.step:08d}")
        meta = {
            "step": self.step,
            "epochs": round(self.step / self.steps_per_epoch, 3),
            "model": self.model_config,
            "num_classes": self.num_classes,
        }
        summary = self.evaluator(
            self.embed_fn(),
            out_dir,
            title=f"Verification of {self.run_dir.name} at step {self.step}",
            meta=meta,
        )
        self.log.write("eval", self.step, **summary)
        if self.ema is not None:
            self.last_ema_summary = self.evaluator(
                self.embed_fn(ema=True),
                out_dir / "ema",
                title=f"Verification of {self.run_dir.name} at step {self.step}, EMA weights",
                meta={**meta, "ema_decay": self.ema.decay},
            )
            self.log.write("eval_ema", self.step, **self.last_ema_summary)
            append_comparison(out_dir / "report.md", summary, self.last_ema_summary, self.ema.decay)
        barrier(self.ctx)
        return summary

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-N`` atomically (all ranks take part); keep the last K."""
        name = ckpt.checkpoint_name(self.step)
        final = self.checkpoint_dir / name
        tmp = self.checkpoint_dir / f".{name}.tmp"
        if self.ctx.is_main:
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        barrier(self.ctx)
        self.head.save_state(tmp / "head", self.head_optimizer)
        ckpt.atomic_torch_save(ckpt.capture_rng_state(), tmp / f"rng-rank{self.ctx.rank}.pt")
        if self.ctx.is_main:
            backbone_io.save_backbone(self.backbone, self.model_config, tmp)
            if self.ema is not None:
                backbone_io.save_backbone(self.ema.module, self.model_config, tmp / EMA_DIRNAME)
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "margin": self._margin_state(),
                "step": self.step,
                "epoch": self.epoch,
                "batches_in_epoch": self.batches_in_epoch,
                "global_batch": self.cfg.data.batch_size * self.ctx.world_size,
                "accumulate_steps": self.accumulate_steps,
                "ema_updates": self.ema.updates if self.ema is not None else 0,
            }
            ckpt.atomic_torch_save(state, tmp / "trainer.pt")
            meta = {
                "step": self.step,
                "epoch": self.epoch,
                "batches_in_epoch": self.batches_in_epoch,
                "world_size": self.ctx.world_size,
                "num_classes": self.num_classes,
                "config": config_to_dict(self.cfg),
            }
            ckpt.atomic_write_bytes(tmp / "meta.json", json.dumps(meta, indent=2).encode())
        barrier(self.ctx)
        if self.ctx.is_main:
            if final.exists():
                ckpt.discard_directory(final)
            tmp.rename(final)
            ckpt.prune_checkpoints(self.checkpoint_dir, self.cfg.checkpoint.keep_last)
        barrier(self.ctx)
        return final

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything to continue exactly where ``path`` was written (mid-epoch too)."""
        path = Path(path)
        meta = json.loads((path / "meta.json").read_text())
        if meta["num_classes"] != self.num_classes:
            raise ValueError(
                f"{path}: trained with {meta['num_classes']} classes, this config has "
                f"{self.num_classes}; to fine-tune on a new class set use checkpoint.init_from"
            )
        state = ckpt.safe_torch_load(path / "trainer.pt")
        global_batch = self.cfg.data.batch_size * self.ctx.world_size
        if state["global_batch"] != global_batch and state["batches_in_epoch"]:
            raise ValueError(
                f"{path}: saved mid-epoch with a global batch of {state['global_batch']}; resuming "
                f"mid-epoch needs the same global batch (now {global_batch} = "
                f"{self.ctx.world_size} ranks × data.batch_size={self.cfg.data.batch_size})"
            )
        accumulated = int(state.get("accumulate_steps", 1))
        if accumulated != self.accumulate_steps and state["batches_in_epoch"]:
            raise ValueError(
                f"{path}: saved mid-epoch with train.accumulate_steps={accumulated}; resuming "
                f"mid-epoch needs the same value (now {self.accumulate_steps})"
            )
        self.backbone.load_state_dict(backbone_io.load_backbone_state(path))
        if self.ema is not None:
            ema_path = path / EMA_DIRNAME
            # a checkpoint without EMA: the average starts from its weights
            source = ema_path if (ema_path / backbone_io.WEIGHTS_FILENAME).is_file() else path
            self.ema.load_state_dict(backbone_io.load_backbone_state(source))
            self.ema.updates = int(state.get("ema_updates", 0)) if source == ema_path else 0
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.head.load_state(path / "head", self.head_optimizer)
        WarmupLR.remember_base_lr(self.optimizers)
        for key, value in state["margin"].items():
            setattr(self.margin, key, value)
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self.resumed_step = self.step
        rng_file = path / f"rng-rank{self.ctx.rank}.pt"
        if rng_file.is_file() and meta["world_size"] == self.ctx.world_size:
            ckpt.restore_rng_state(ckpt.safe_torch_load(rng_file))

    def _init_backbone_from(self, spec: str) -> None:
        """Fine-tuning: the backbone weights of another run or of a model directory; a fresh
        head for this class set (:func:`partialfc.train.checkpoint.resolve_init_from`)."""
        path, model_config = ckpt.resolve_init_from(spec)
        key = f"checkpoint.init_from={spec!r}"
        if model_config["name"] != self.model_config["name"]:
            raise ValueError(
                f"{key} holds a {model_config['name']}, this config builds a "
                f"{self.model_config['name']} (set model.name: {model_config['name']})"
            )
        ours, theirs = self.model_config["kwargs"], model_config["kwargs"]
        for name in ("embedding_dim", "input_size", "in_channels"):
            if (
                name in theirs
                and name in ours
                and _same_size(theirs[name]) != _same_size(ours[name])
            ):
                raise ValueError(
                    f"{key} holds a {model_config['name']} with {name}={theirs[name]}, this "
                    f"config builds it with {name}={ours[name]}"
                )
        try:
            self.backbone.load_state_dict(backbone_io.load_backbone_state(path))
        except (RuntimeError, FileNotFoundError) as err:
            raise ValueError(f"{key}: its weights do not fit this backbone: {err}") from None


def _same_size(value):
    """``112`` and ``[112, 112]`` alike (an input size as an int or (H, W))."""
    return (value, value) if isinstance(value, int) else tuple(value)
