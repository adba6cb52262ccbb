"""Typed training configuration: dataclasses loaded from YAML, overridable from the command line.

A config file is a nested mapping whose sections and keys are exactly the fields below; an
unknown key is an error that names it (with close matches), and every value is type-checked::

    cfg = load_config("configs/omniglot_cpu.yaml", overrides=["train.epochs=3", "optim.lr=0.05"])

Overrides are ``dotted.key=value`` strings (``partialfc train --set train.epochs=3``); the value
is parsed as YAML, so ``null``, ``true``, ``[8, 14]`` and ``{embedding_dim: 128}`` work.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from partialfc.ranges import Range, shown

# The values of every key with a fixed set of choices; :data:`_CHOICES` is read off these types.
# Where the library defines the same set (head kinds, dtypes, triplet mining, optimizers,
# precisions), tests/train/test_config.py and test_head_kinds.py check that the two agree.
DataSource = Literal["omniglot", "recordio", "folder", "npz"]
RotationClasses = Literal[1, 2, 4]
HeadKind = Literal["partial_fc", "margin_softmax", "softmax", "proxy_nca", "triplet", "contrastive"]
StorageDtype = Literal["float32", "bfloat16"]
StorageDevice = Literal["compute", "cpu"]
ComputeDtype = Literal["float32", "bfloat16", "float16"]
TripletMining = Literal["semihard", "batch_hard", "all"]
OptimizerName = Literal["sgd", "adamw"]
ScheduleKind = Literal["poly", "step", "constant"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Device = Literal["auto", "cpu", "cuda"]
OnExists = Literal["error", "new", "overwrite"]


@dataclass
class ModelConfig:
    """Backbone: a model of ``partialfc.models`` by name, built with ``kwargs``."""

    name: str = "iresnet50"
    embedding_dim: int = 512
    kwargs: dict = field(default_factory=dict)


@dataclass
class AugmentConfig:
    """Training-time augmentation, applied in the DataLoader workers."""

    hflip: bool = True
    crop_padding: int = 0  # random crop after zero-padding by this many pixels (0 = off)
    max_rotation_deg: float = 0.0  # random affine: rotation in degrees (0 = off)
    max_shift_frac: float = 0.0  # random affine: translation as a fraction of the side
    max_scale_delta: float = 0.0  # random affine: scale in [1 - d, 1 + d]
    color_jitter: float = 0.0  # brightness/contrast jitter strength (0 = off)
    # random erasing (Zhong et al., AAAI 2020): probability of replacing one random rectangle
    # (2-40 % of the image, aspect 0.3-3.3) by random pixels, applied last (0 = off)
    erase_prob: float = 0.0


@dataclass
class DataConfig:
    """Training set. ``source`` is ``omniglot`` (bundled), ``recordio``, ``folder`` or ``npz``."""

    source: DataSource = "recordio"
    path: str = ""  # .rec file, image folder or .npz, as ``source`` requires
    input_size: int = 112
    batch_size: int = 128  # per rank
    num_workers: int = 2
    drop_last: bool = True
    # P×K batches (P identities × K images each; needed by a triplet loss); 0 = uniform batches.
    # With P×K batches, batch_size must equal pk_identities · pk_images.
    pk_identities: int = 0
    pk_images: int = 0
    # 4 = every image turned by 90°, 180° and 270° is an image of a new class (Omniglot's
    # standard class augmentation: 964 -> 3,856 classes); 2 = 180° only; 1 = off
    rotation_classes: RotationClasses = 1
    # Omniglot only: background alphabets left out of training for choosing recipe levers on
    # them (eval protocol omniglot_holdout); a list of names, or N = the last N of
    # partialfc.data.omniglot_holdout.holdout_candidates(); 0 = none (docs/omniglot_recipe.md)
    holdout_background_alphabets: int | list[str] = 0
    augment: AugmentConfig = field(default_factory=AugmentConfig)


@dataclass
class MarginConfig:
    """Combined margin ``cos(m1·θ + m2) − m3`` at scale ``s`` (radians; ArcFace: m2_rad=0.5)."""

    m1: float = 1.0
    m2_rad: float = 0.5
    m3: float = 0.0
    scale: float = 64.0
    easy_margin: bool = False
    # margin warm-up: train with zero margin for ``warmup_steps``, then ramp linearly to the
    # target over ``ramp_steps`` (both 0 = the margin from the first step)
    warmup_steps: int = 0
    ramp_steps: int = 0


@dataclass
class HeadConfig:
    """The loss head over all training classes; ``kind`` picks it (default Partial FC).

    ``partial_fc`` (sharded, sampled margin-softmax), ``margin_softmax`` (dense, with
    ``num_subcenters``), ``softmax`` (plain linear layer), ``proxy_nca``, ``triplet`` (needs
    P×K batches) or ``contrastive``. ``sample_rate``, ``negative_cos_threshold`` and the
    storage fields are Partial FC's; ``margin`` belongs to the two margin-softmax kinds.
    """

    kind: HeadKind = "partial_fc"
    num_classes: int = 0  # 0 = take it from the dataset
    sample_rate: float = 1.0
    num_subcenters: int = 1
    negative_cos_threshold: float | None = None  # PFC* filter (paper: 0.4); None = off
    storage_dtype: StorageDtype = "float32"
    storage_device: StorageDevice = "compute"
    # operand precision of the head's GEMMs (float32 accumulation; the softmax stays float32):
    # "float32", "bfloat16" or "float16" (GPU only); partial_fc and margin_softmax
    compute_dtype: ComputeDtype = "float32"
    # active rows Partial FC walks at a time (null = the device's default: 2048 on CPUs, 2^20
    # on GPUs); fewer, larger chunks launch fewer ops per step, each chunk costs about
    # 5 * chunk_rows * embedding_dim * 4 bytes of float32 scratch
    chunk_rows: int | None = None
    margin: MarginConfig = field(default_factory=MarginConfig)
    triplet_margin: float = 0.2  # kind=triplet: alpha in squared unit-sphere distance
    triplet_mining: TripletMining = "semihard"  # kind=triplet
    contrastive_margin: float = 1.0  # kind=contrastive: distance negatives must exceed
    proxy_scale: float = 1.0  # kind=proxy_nca: multiplies the squared distances


@dataclass
class LossConfig:
    """``L = classifier_weight · L_PartialFC + triplet_weight · L_triplet`` (weights ≥ 0).

    ``classifier_weight=0`` trains with the triplet loss alone (the head is neither run nor
    stepped). The triplet loss (FaceNet, Schroff et al., CVPR 2015) works on L2-normalised
    embeddings with a margin in squared-distance units and needs P×K batches
    (``data.pk_identities``, ``data.pk_images``).
    """

    classifier_weight: float = 1.0
    triplet_weight: float = 0.0  # 0 = off
    triplet_margin: float = 0.2
    triplet_mining: TripletMining = "semihard"


@dataclass
class OptimConfig:
    """Optimizer of backbone and head. ``name``: ``sgd`` or ``adamw``."""

    name: OptimizerName = "sgd"
    lr: float = 0.1
    head_lr: float | None = None  # None = same as lr
    momentum: float = 0.9
    weight_decay: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    grad_clip_norm: float | None = 5.0  # backbone gradient norm clip; None = off


@dataclass
class ScheduleConfig:
    """Learning rate per step: linear warm-up, then ``poly`` decay or ``step`` drops."""

    kind: ScheduleKind = "poly"
    # linear warm-up: warmup_epochs, or (when that is 0) warmup_fraction of all training steps;
    # a fraction follows train.epochs, so short trial runs keep the same shape
    warmup_epochs: float = 0.0
    warmup_fraction: float = 0.0
    power: float = 2.0  # poly: lr = base · (1 − progress)^power
    milestones: list[float] = field(default_factory=list)  # step: epochs where lr ÷= 1/gamma
    gamma: float = 0.1


@dataclass
class TrainConfig:
    """The loop."""

    epochs: float = 20.0
    seed: int = 0
    precision: Precision = "auto"  # "auto" = fp16 on GPU, fp32 on CPU
    device: Device = "auto"
    max_nonfinite_steps: int = 10  # stop after this many non-finite losses in a row
    # a metrics.jsonl record every N steps, and a console line when no progress bar is shown
    log_every: int = 50
    diagnostics_every: int = 200  # APCS / AMNCS / MICS; 0 = off
    # torch intra-op threads per process: "auto" = the free cores (partialfc.train.threads),
    # N = exactly N, 0 = leave torch's default
    num_threads: int | str = "auto"
    # gradient accumulation: micro-batches of data.batch_size per optimizer step (1 = off);
    # one step of k micro-batches equals one step of a k-times larger batch (see engine)
    accumulate_steps: int = 1
    # exponential moving average of the backbone weights, updated after every optimizer step
    # (e.g. 0.999); evaluated next to the trained weights and exported by default. None = off
    ema_decay: float | None = None
    # keep the backbone's weights and activations in channels-last memory (NHWC): on CPU the
    # oneDNN convolutions run about 1.2x faster (benchmarks/bench_models.py); checkpoints and
    # exports stay in the plain layout, so the option changes speed and rounding, not the format
    channels_last: bool = False
    # keep the memory a step frees for the next step (glibc's malloc thresholds, set once per
    # process: partialfc.train.allocator); the same numbers, fewer page faults, faster steps
    keep_freed_memory: bool = True


@dataclass
class CheckpointConfig:
    every_steps: int = 2000  # 0 = only at epoch ends
    at_epoch_end: bool = True
    keep_last: int = 3
    resume: str | None = None  # a checkpoint dir, or "auto" = the newest in the run folder
    init_from: str | None = None  # fine-tune: load only the backbone from this checkpoint


@dataclass
class EvalConfig:
    """Verification sets, named as in ``partialfc.eval.protocols.registry.PROTOCOLS``."""

    protocols: list[str] = field(default_factory=list)
    every_steps: int = 0  # periodic verification; 0 = only at the end
    at_end: bool = True
    batch_size: int | None = None  # None = each protocol's default (256)
    flip_test: bool | None = None  # None = each protocol's default (faces on, Omniglot off)
    # test-time augmentation: average the embeddings of each image and of its copies moved
    # this many pixels up/down/left/right (0 = off; 5x the embedding cost)
    shift_average_px: int = 0


@dataclass
class RunConfig:
    output_dir: str = "runs"
    name: str = "run"  # the run folder is output_dir/name
    # when output_dir/name already holds a run: "error", "new" (name-2, name-3, ...) or
    # "overwrite"; --resume continues it (partialfc.train.run_folder)
    on_exists: OnExists = "error"
    progress: bool = True  # a step bar when stderr is a terminal; else plain log_every lines
    tensorboard: bool = False
    # MLflow (pip install 'partialfc[mlflow]'): the same scalars as metrics.jsonl, config as params
    mlflow: bool = False
    mlflow_tracking_uri: str = ""  # "" = $MLFLOW_TRACKING_URI, else a file store in output_dir
    mlflow_experiment: str = "partialfc"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)


class ConfigError(ValueError):
    """A config file or override that does not fit the schema. Messages are cut to
    :data:`MESSAGE_CHARS` characters (values in them are shown with :func:`ranges.shown`)."""

    def __init__(self, message: str):
        if len(message) > MESSAGE_CHARS:
            message = message[: MESSAGE_CHARS - 3] + "..."
        super().__init__(message)


MESSAGE_CHARS = 2000
# Nodes a config may hold once YAML aliases are expanded: a real config has a few hundred; an
# alias bomb ("billion laughs": 9 aliases of 9 aliases of ...) reaches 10^9 from 100 lines.
MAX_CONFIG_NODES = 100_000


def check_expanded_size(data, source: str, budget: int = MAX_CONFIG_NODES) -> None:
    """Raise ConfigError naming ``source`` when ``data`` (as loaded from YAML, where an alias is
    the same object again) holds more than ``budget`` nodes with every alias expanded, or
    refers to itself. Stops as soon as the budget is spent, so the check costs at most
    ``budget`` steps."""
    count, stack = 0, [(data, ())]
    while stack:
        node, ancestors = stack.pop()
        count += 1
        if count > budget:
            raise ConfigError(
                f"{source}: the YAML expands to more than {budget} values once its aliases "
                "(*name) are expanded; refused (an alias bomb?)"
            )
        if isinstance(node, (dict, list)):
            if id(node) in ancestors:
                raise ConfigError(f"{source}: a YAML alias refers to its own anchor; refused")
            inner = (*ancestors, id(node))
            if isinstance(node, dict):
                stack += [(key, ()) for key in node]
            stack += [
                (child, inner) for child in (node.values() if isinstance(node, dict) else node)
            ]


def _suggest(key: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(choices), n=3, cutoff=0.6)
    if not close:
        return f"; valid keys here: {', '.join(choices)}"
    return f"; did you mean {', '.join(repr(prefix + c) for c in close)}?"


def _is_optional(tp) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp, where: str):
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed (expected {_type_name(inner)})")
    origin = typing.get_origin(inner)
    if origin in (Union, types.UnionType):  # e.g. int | list[str]: the first that fits
        for option in typing.get_args(inner):
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {shown(value)}")
    if origin is Literal:  # a value of the choices' type; validate() checks the choice
        return _coerce(value, type(typing.get_args(inner)[0]), where)
    if inner is bool:
        if isinstance(value, bool):
            return value
    elif inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif inner is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif inner is str:
        if isinstance(value, str):
            return value
    elif inner is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif inner is list or origin is list:
        if isinstance(value, (list, tuple)):
            (item_tp,) = typing.get_args(inner) or (Any,)
            if item_tp is Any:
                return list(value)
            return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {shown(value)}")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {shown(data)}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            prefix = f"{where}." if where else ""
            raise ConfigError(
                f"unknown config key {shown(path)}{_suggest(str(key), names, prefix)}"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, path)
        else:
            kwargs[key] = _coerce(value, tp, path)
    return cls(**kwargs)


def config_from_dict(data: dict, source: str = "config") -> Config:
    """Build a :class:`Config` from a nested mapping; missing keys take the defaults."""
    try:
        return _build(Config, data or {}, "")
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def _set_dotted(data: dict, dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    cls = Config
    node = data
    for i, key in enumerate(keys):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(
                f"{source}: {shown('.'.join(keys[:i]))} is a value, not a section "
                f"(in {shown(dotted)})"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        if key not in names:
            where = ".".join(keys[: i + 1])
            prefix = "".join(k + "." for k in keys[:i])
            raise ConfigError(
                f"{source}: unknown config key {shown(where)}{_suggest(key, names, prefix)}"
            )
        tp = _hints(cls)[key]
        if i == len(keys) - 1:
            node[key] = value
        else:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node, cls = child, tp


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``dotted.key=value`` strings (values parsed as YAML) to a nested mapping in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {shown(item)}: expected dotted.key=value, e.g. train.epochs=3"
            )
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {shown(item)}: value is not valid YAML ({err})") from None
        check_expanded_size(value, f"override {shown(item)}")
        _set_dotted(data, key.strip(), value, f"override {shown(item)}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply overrides."""
    data = read_config_file(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return validate(config_from_dict(data, str(path) if path is not None else "defaults"))


def read_config_file(path: str | Path) -> dict:
    """The YAML mapping of sections in ``path``, unchecked (:func:`load_config` checks it;
    a script with sections of its own pops them first)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    check_expanded_size(data, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def _literal_choices(cls, prefix: str = "") -> dict[str, tuple]:
    """``{"data.source": ("omniglot", ...), ...}``: the values of every ``Literal`` field."""
    choices = {}
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            choices.update(_literal_choices(tp, f"{prefix}{name}."))
        elif typing.get_origin(tp) is Literal:
            choices[prefix + name] = typing.get_args(tp)
    return choices


_CHOICES = _literal_choices(Config)


def allowed_values(dotted: str) -> tuple:
    """The values the config accepts for a key with a fixed set of choices, e.g.
    ``allowed_values("data.source")`` (for command-line options that set the same thing)."""
    return _CHOICES[dotted]


_INT_0 = Range(0, integer=True)
_INT_1 = Range(1, integer=True)
_NONNEGATIVE = Range(0)
_POSITIVE = Range(0, low_open=True)
_FRACTION = Range(0, 1, high_open=True)  # [0, 1)

_RANGES = {
    "model.embedding_dim": _INT_1,
    "data.input_size": Range(1, 4096, integer=True),
    "data.batch_size": _INT_1,
    "data.num_workers": _INT_0,
    "data.pk_identities": _INT_0,
    "data.pk_images": _INT_0,
    "data.augment.crop_padding": _INT_0,
    "data.augment.max_rotation_deg": Range(0, 180),
    "data.augment.max_shift_frac": Range(0, 1),
    "data.augment.max_scale_delta": _FRACTION,
    "data.augment.color_jitter": Range(0, 1),
    "data.augment.erase_prob": Range(0, 1),
    "head.num_classes": _INT_0,
    "head.sample_rate": Range(0, 1, low_open=True),
    "head.num_subcenters": _INT_1,
    "head.chunk_rows": Range(1, integer=True, optional=True),
    "head.negative_cos_threshold": Range(-1, 1, optional=True),
    "head.margin.m1": _POSITIVE,
    "head.margin.m2_rad": Range(0, math.pi, high_open=True),
    "head.margin.m3": _FRACTION,
    "head.margin.scale": _POSITIVE,
    "head.margin.warmup_steps": _INT_0,
    "head.margin.ramp_steps": _INT_0,
    "loss.classifier_weight": _NONNEGATIVE,
    "loss.triplet_weight": _NONNEGATIVE,
    "loss.triplet_margin": _NONNEGATIVE,
    "optim.lr": _POSITIVE,
    "optim.head_lr": Range(0, low_open=True, optional=True),
    "optim.momentum": _FRACTION,
    "optim.weight_decay": _NONNEGATIVE,
    "optim.eps": _POSITIVE,
    "optim.grad_clip_norm": Range(0, low_open=True, optional=True),
    "schedule.warmup_fraction": _FRACTION,
    "schedule.power": _NONNEGATIVE,
    "schedule.gamma": _POSITIVE,
    "train.epochs": _POSITIVE,
    "train.seed": Range(0, 2**32 - 1, integer=True),
    "train.max_nonfinite_steps": _INT_1,
    "train.log_every": _INT_1,
    "train.diagnostics_every": _INT_0,
    "train.accumulate_steps": _INT_1,
    "train.ema_decay": Range(0, 1, low_open=True, high_open=True, optional=True),
    "checkpoint.every_steps": _INT_0,
    "checkpoint.keep_last": _INT_1,
    "eval.every_steps": _INT_0,
    "eval.batch_size": Range(1, integer=True, optional=True),
}


def _get(cfg: Config, dotted: str):
    value = cfg
    for key in dotted.split("."):
        value = getattr(value, key)
    return value


def _check(name: str, value, allowed: Range, extra: str = "") -> None:
    allowed.check(name, value, ConfigError, extra)


def validate(cfg: Config) -> Config:
    """Check value ranges and choices; raise :class:`ConfigError` naming the key, e.g.
    ``data.augment.max_rotation_deg must be a finite number in [0, 180], got 1e+308``."""
    for dotted, choices in _CHOICES.items():
        value = _get(cfg, dotted)
        if value not in choices:
            raise ConfigError(
                f"{dotted}={shown(value)}: choose one of {', '.join(map(str, choices))}"
            )
    for dotted, allowed in _RANGES.items():
        _check(dotted, _get(cfg, dotted), allowed)
    _validate_warmup(cfg.schedule, cfg.train.epochs)
    if cfg.train.num_threads != "auto":
        _check("train.num_threads", cfg.train.num_threads, _INT_0, ' or "auto"')
    if len(cfg.optim.betas) != 2:
        raise ConfigError(f"optim.betas must be two numbers, got {shown(cfg.optim.betas)}")
    for i, beta in enumerate(cfg.optim.betas):
        _check(f"optim.betas[{i}]", beta, _FRACTION)
    for i, milestone in enumerate(cfg.schedule.milestones):
        _check(f"schedule.milestones[{i}]", milestone, _NONNEGATIVE)
    _check(
        "eval.shift_average_px",
        cfg.eval.shift_average_px,
        Range(0, max(0, cfg.data.input_size // 2 - 1), integer=True),
        " (pixels, less than half of data.input_size)",
    )
    if cfg.data.augment.crop_padding > cfg.data.input_size:
        raise ConfigError(
            f"data.augment.crop_padding must be at most data.input_size="
            f"{cfg.data.input_size}, got {cfg.data.augment.crop_padding}"
        )
    _validate_model(cfg.model)
    _validate_protocols(cfg.eval)
    if cfg.data.source != "omniglot" and not cfg.data.path:
        raise ConfigError(f"data.path is required for data.source={shown(cfg.data.source)}")
    _validate_holdout(cfg)
    _validate_loss_and_batches(cfg)
    _validate_head_kind(cfg)
    return cfg


def _validate_warmup(schedule: ScheduleConfig, epochs: float) -> None:
    """One warm-up length: ``warmup_epochs`` (below ``train.epochs``) or ``warmup_fraction``."""
    _check("schedule.warmup_epochs", schedule.warmup_epochs, _NONNEGATIVE)
    if schedule.warmup_epochs > 0 and schedule.warmup_fraction > 0:
        raise ConfigError(
            f"schedule.warmup_epochs={schedule.warmup_epochs:g} and schedule.warmup_fraction="
            f"{schedule.warmup_fraction:g}: give the warm-up one way; set the other to 0"
        )
    if schedule.warmup_epochs >= epochs:
        raise ConfigError(
            f"schedule.warmup_epochs={schedule.warmup_epochs:g} must be below train.epochs="
            f"{epochs:g}: lower schedule.warmup_epochs, or give the warm-up as a share of "
            f"training (schedule.warmup_epochs=0, schedule.warmup_fraction=0.05)"
        )


# model.kwargs may hold the backbone arguments that no other key sets
_SET_ELSEWHERE = {
    "embedding_dim": "model.embedding_dim",
    "input_size": "data.input_size",
    "in_channels": "the training data",
}


def _validate_model(model: ModelConfig) -> None:
    import inspect

    from partialfc.models import MODELS, build_model

    if model.name not in MODELS:
        raise ConfigError(f"model.name={shown(model.name)}: choose one of {', '.join(MODELS)}")
    accepted = [p for p in inspect.signature(build_model).parameters if p != "name"]
    free = [p for p in accepted if p not in _SET_ELSEWHERE]
    for key in model.kwargs:
        if key in _SET_ELSEWHERE:
            raise ConfigError(
                f"model.kwargs.{key}: set by {_SET_ELSEWHERE[key]}, not in model.kwargs"
            )
        if key not in free:
            raise ConfigError(
                f"model.kwargs.{key}: not an argument of model {shown(model.name)}; "
                f"model.kwargs may set {', '.join(free)}"
            )
    if "dropout" in model.kwargs:
        _check("model.kwargs.dropout", model.kwargs["dropout"], _FRACTION)


def _validate_protocols(cfg: EvalConfig) -> None:
    from partialfc.eval.protocols.registry import parse_protocol

    for i, spec in enumerate(cfg.protocols):
        try:
            parse_protocol(spec, f"eval.protocols[{i}]")
        except ValueError as err:
            raise ConfigError(str(err)) from None


def _validate_holdout(cfg: Config) -> None:
    """Held-out background alphabets: Omniglot only, valid names or N, and the protocol that
    evaluates on them needs some."""
    from partialfc.data.omniglot_holdout import (
        holdout_alphabets_from_text,
        resolve_holdout_alphabets,
    )

    spec = cfg.data.holdout_background_alphabets
    key = "data.holdout_background_alphabets"
    if spec not in (0, []):
        if cfg.data.source != "omniglot":
            raise ConfigError(f"{key} needs data.source='omniglot', not {shown(cfg.data.source)}")
        try:
            resolve_holdout_alphabets(spec)
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    for i, name in enumerate(cfg.eval.protocols):
        kind, _, argument = name.partition(":")
        if kind != "omniglot_holdout":
            continue
        where = f"eval.protocols[{i}]"
        if spec in (0, []):
            raise ConfigError(
                f"{where}: omniglot_holdout evaluates on the held-out background alphabets; "
                f"set {key} (a list of names or a number, e.g. 5)"
            )
        if argument:
            try:
                named = holdout_alphabets_from_text(argument, where)
            except ValueError as err:
                raise ConfigError(str(err)) from None
            if sorted(named) != sorted(resolve_holdout_alphabets(spec)):
                raise ConfigError(
                    f"{where}: {shown(name)} is not the held-out set of {key}; write "
                    "omniglot_holdout without an argument"
                )


def _validate_head_kind(cfg: Config) -> None:
    """Partial FC's own fields keep their defaults with another head; the pair losses get
    batches with positives."""
    head = cfg.head
    if head.kind == "partial_fc":
        return
    defaults = HeadConfig()
    if head.kind != "margin_softmax" and head.compute_dtype != defaults.compute_dtype:
        raise ConfigError(
            f"head.compute_dtype={shown(head.compute_dtype)} needs head.kind=partial_fc or "
            f"margin_softmax, not {shown(head.kind)}"
        )
    partial_fc_keys = (
        "sample_rate",
        "negative_cos_threshold",
        "storage_dtype",
        "storage_device",
        "chunk_rows",
    )
    for key in partial_fc_keys:
        if getattr(head, key) != getattr(defaults, key):
            raise ConfigError(
                f"head.{key}={shown(getattr(head, key))} is a Partial FC setting; "
                f"head.kind={shown(head.kind)} does not use it"
            )
    if head.num_subcenters != 1 and head.kind != "margin_softmax":
        raise ConfigError(
            f"head.num_subcenters={head.num_subcenters} needs head.kind=partial_fc or "
            f"margin_softmax, not {shown(head.kind)}"
        )
    if head.kind == "triplet" and not (cfg.data.pk_identities and cfg.data.pk_images):
        raise ConfigError(
            "head.kind='triplet' needs P×K batches (positives in every batch): set "
            "data.pk_identities and data.pk_images (≥ 2 each)"
        )
    checks = [
        ("triplet_margin", head.triplet_margin >= 0),
        ("contrastive_margin", 0 < head.contrastive_margin <= 2),
        ("proxy_scale", head.proxy_scale > 0),
    ]
    for key, ok in checks:
        if not ok:
            raise ConfigError(f"head.{key}={shown(getattr(head, key))} is out of range")


def _validate_loss_and_batches(cfg: Config) -> None:
    """The loss weights and the P×K batch shape must fit together."""
    loss, data = cfg.loss, cfg.data
    if loss.classifier_weight == 0 and loss.triplet_weight == 0:
        raise ConfigError(
            "loss.classifier_weight=0 and loss.triplet_weight=0: nothing to train; "
            "set one of them > 0"
        )
    uses_pk = data.pk_identities > 0 or data.pk_images > 0
    if uses_pk:
        if data.pk_identities < 2 or data.pk_images < 2:
            raise ConfigError(
                f"data.pk_identities={data.pk_identities}, data.pk_images={data.pk_images}: "
                "P×K batches need at least 2 identities with at least 2 images each"
            )
        if data.batch_size != data.pk_identities * data.pk_images:
            raise ConfigError(
                f"data.batch_size={data.batch_size} must equal data.pk_identities × "
                f"data.pk_images = {data.pk_identities * data.pk_images}"
            )
    if loss.triplet_weight > 0 and not uses_pk:
        raise ConfigError(
            f"loss.triplet_weight={loss.triplet_weight} needs P×K batches (positives in every "
            "batch): set data.pk_identities and data.pk_images (≥ 2 each)"
        )


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from partialfc.atomic import atomic_write_bytes

    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    atomic_write_bytes(Path(path), text.encode())
