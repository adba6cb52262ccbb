"""An arcface_torch config file (Python) as a partialfc YAML config, read without running it.

arcface_torch (InsightFace) keeps a training setup in ``configs/NAME.py``: ``config = edict()``
followed by ``config.KEY = value`` lines. Its ``get_config`` imports ``configs/base.py`` first
and updates that ``config`` with the file's own, so a key the file does not set keeps the base
value. This module does the same on the syntax tree (``ast``): it accepts only the imports of
``easydict`` and ``configs.base``, ``config = edict()`` and ``config.KEY = <literal>`` (numbers,
strings, booleans, ``None``, tuples, lists, dicts, ``+ - * / // %`` of numbers such as
``30 * 10000``, and keys set above, as in ``config.num_epoch // 10``); anything else (a call,
a name, another import) is refused with its file and line. Nothing in the file is executed.

Each arcface_torch key is then mapped to partialfc's config keys, or dropped with the reason
(:data:`KEY_TABLE`); :func:`convert_config` returns both and checks the result with the
training config's own loader, so a written file loads with ``partialfc train --config``::

    converted = convert_config("arcface_torch/configs/ms1mv3_r50.py", rec="/data/ms1mv3")
    write_converted(converted, "ms1mv3_r50.yaml")
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# arcface_torch's backbone names -> (partialfc model, how the two differ; "" = the same network)
NETWORKS: dict[str, tuple[str, str]] = {
    "r18": ("iresnet18", ""),
    "r34": ("iresnet34", ""),
    "r50": ("iresnet50", ""),
    "r100": ("iresnet100", ""),
    "r200": ("iresnet200", ""),
    "mbf": (
        "mobilefacenet",
        "arcface_torch's mbf is a MobileFaceNet widened 2x with blocks (1, 4, 6, 2); partialfc's "
        "mobilefacenet follows the paper's plan, so the two differ in widths and depth",
    ),
    "mbf_large": (
        "mobilefacenet",
        "arcface_torch's mbf_large is a MobileFaceNet widened 4x with blocks (2, 8, 12, 4); "
        "partialfc's mobilefacenet follows the paper's plan (smaller)",
    ),
    "vit_t": (
        "vit_t",
        "arcface_torch's vit_t: width 256, 8 heads, drop path 0.1, 10% patch masking; "
        "partialfc's vit_t: width 192, 3 heads, drop path 0.1, no masking (both 12 blocks, "
        "patch 9)",
    ),
    "vit_t_dp005_mask0": (
        "vit_t",
        "arcface_torch's vit_t_dp005_mask0: width 256, 8 heads, drop path 0.05; partialfc's "
        "vit_t: width 192, 3 heads, drop path 0.1 (both 12 blocks, patch 9, no masking)",
    ),
    "vit_s": (
        "vit_s",
        "arcface_torch's vit_s: width 512, 8 heads, drop path 0.1, 10% patch masking; "
        "partialfc's vit_s: width 384, 6 heads, no masking (both 12 blocks, patch 9)",
    ),
    "vit_s_dp005_mask_0": (
        "vit_s",
        "arcface_torch's vit_s_dp005_mask_0: width 512, 8 heads, drop path 0.05; partialfc's "
        "vit_s: width 384, 6 heads, drop path 0.1 (both 12 blocks, patch 9)",
    ),
    "vit_b": (
        "vit_b",
        "arcface_torch's vit_b: width 512, 24 blocks, 8 heads, 10% patch masking; partialfc's "
        "vit_b: width 768, 12 blocks, 12 heads, no masking",
    ),
    "vit_b_dp005_mask_005": (
        "vit_b",
        "arcface_torch's vit_b_dp005_mask_005: width 512, 24 blocks, 8 heads, drop path 0.05, "
        "5% patch masking; partialfc's vit_b: width 768, 12 blocks, 12 heads, no masking",
    ),
    "vit_l_dp005_mask_005": (
        "vit_b",
        "no ViT-L here (arcface_torch's: width 768, 24 blocks, 8 heads); vit_b, the largest "
        "ViT partialfc has, is written instead (width 768, 12 blocks); --network picks another",
    ),
    "vit_h": (
        "vit_b",
        "no ViT-H here (arcface_torch's: width 1024, 48 blocks, 8 heads); vit_b, the largest "
        "ViT partialfc has, is written instead (width 768, 12 blocks); --network picks another",
    ),
}

# head.sample_rate for arcface_torch's 0: ceil(r * C_rank) = 1 for every C_rank below 10^9, so
# only the positive classes are active (a rank without positives draws one negative)
POSITIVES_ONLY_RATE = 1e-9

WANDB_REASON = (
    "Weights & Biases logging; partialfc has none: metrics.jsonl always, TensorBoard "
    "(run.tensorboard) or MLflow (run.mlflow) on request"
)

# keys train_v2.py reads that have no partialfc key: the reason for each
DROPPED: dict[str, str] = {
    "resume": "arcface_torch resumes from output/checkpoint_gpu_RANK.pt; partialfc resumes a "
    "run folder with `partialfc train --resume` (checkpoint.resume=auto)",
    "save_all_states": "partialfc's checkpoints always hold the whole trainer state "
    "(backbone, head shards, optimizers, RNG); checkpoint.every_steps / keep_last set how often",
    "num_image": "used by arcface_torch only to count steps; partialfc counts the images in "
    "train.idx",
    "dali": "NVIDIA DALI loader; partialfc decodes the .rec in DataLoader workers "
    "(data.num_workers)",
    "dali_aug": "DALI's extra augmentations (random resized crop, colour); partialfc's are in "
    "data.augment (hflip on; crop, rotation, colour jitter, erasing off)",
    "using_wandb": WANDB_REASON,
    "wandb_key": WANDB_REASON,
    "wandb_entity": WANDB_REASON,
    "wandb_project": WANDB_REASON,
    "wandb_log_all": WANDB_REASON,
    "wandb_resume": WANDB_REASON,
    "save_artifacts": WANDB_REASON,
    "suffix_run_name": WANDB_REASON,
    "notes": WANDB_REASON,
}

# what train_v2.py fixes in code, written so the converted run trains the same way
IMPLIED: dict[str, tuple[Any, str]] = {
    "head.kind": ("partial_fc", "train_v2 always trains PartialFC_V2"),
    "head.margin.scale": (64.0, "CombinedMarginLoss(64, ...) in train_v2"),
    "data.source": ("recordio", "MXFaceDataset reads REC/train.rec + train.idx"),
    "data.input_size": (112, "arcface_torch trains on 112x112 crops"),
    "data.augment.hflip": (True, "MXFaceDataset's RandomHorizontalFlip"),
    "optim.grad_clip_norm": (5.0, "clip_grad_norm_(backbone.parameters(), 5) in train_v2"),
    "schedule.kind": ("poly", "PolynomialLRWarmup in train_v2"),
    "schedule.power": (1.0, "PolynomialLRWarmup's default power, which train_v2 keeps"),
    "eval.flip_test": (True, "CallBackVerification embeds each image and its mirror"),
}


class ArcfaceConfigError(ValueError):
    """A config file that cannot be read without running it, or that does not convert."""


@dataclass(frozen=True)
class Setting:
    """One ``config.KEY = value`` line: the value and where it was set."""

    key: str
    value: Any
    file: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class KeyOutcome:
    """What became of one arcface_torch key: ``mapped`` to ``targets`` or ``dropped``."""

    key: str
    value: Any
    status: str
    targets: tuple[str, ...] = ()
    note: str = ""

    def line(self) -> str:
        value = repr(self.value)
        if self.status == "mapped":
            text = f"{self.key} = {value} -> {', '.join(self.targets)}"
        else:
            text = f"{self.key} = {value}: dropped"
        return f"{text}: {self.note}" if self.note else text


@dataclass
class ConvertedConfig:
    """A converted config: the partialfc mapping, and the fate of every arcface_torch key."""

    source: Path
    base: Path | None
    data: dict
    outcomes: list[KeyOutcome] = field(default_factory=list)

    @property
    def mapped(self) -> list[KeyOutcome]:
        return [o for o in self.outcomes if o.status == "mapped"]

    @property
    def dropped(self) -> list[KeyOutcome]:
        return [o for o in self.outcomes if o.status == "dropped"]

    def report(self) -> str:
        """The mapped and dropped keys, one per line (printed, and the YAML's header)."""
        base = f" (base: {self.base})" if self.base else " (no configs/base.py beside it)"
        lines = [f"arcface_torch config {self.source}{base}"]
        lines.append(f"mapped ({len(self.mapped)} keys):")
        lines += [f"  {o.line()}" for o in self.mapped]
        lines.append(f"dropped ({len(self.dropped)} keys):")
        lines += [f"  {o.line()}" for o in self.dropped]
        lines.append("set by train_v2.py's code, written as it trains:")
        lines += [f"  {key} = {value!r}: {why}" for key, (value, why) in IMPLIED.items()]
        return "\n".join(lines)

    def yaml_text(self) -> str:
        header = ["Converted by `partialfc import-config`; docs/arcface_torch.md has the table."]
        header += self.report().splitlines()
        comment = "".join(f"# {line}\n" for line in header)
        return comment + yaml.safe_dump(self.data, sort_keys=False)


# ---------------------------------------------------------------------------- reading the file

_NUMBER_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_ALLOWED = (
    "only `config = edict()`, `config.KEY = <literal>` and the imports of easydict and "
    "configs.base are read"
)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(node: ast.AST) -> str:
    """A short name for what a refused expression does."""
    if isinstance(node, ast.Call):
        return f"calls a function (`{ast.unparse(node.func)}(...)`)"
    if isinstance(node, ast.Name):
        return f"refers to the name `{node.id}`"
    if isinstance(node, ast.Attribute):
        return f"reads the attribute `{ast.unparse(node)}`"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"computes `{ast.unparse(node)}` with something other than numbers"
    return f"holds a {type(node).__name__} expression (`{ast.unparse(node)}`)"


def literal_value(node: ast.AST, where: str, known: dict | None = None) -> Any:
    """The value of a literal expression, or :class:`ArcfaceConfigError` naming ``where``;
    ``config.KEY`` reads a key set above it (``known``: key -> value)."""
    known = known or {}
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "config"
    ):
        if node.attr not in known:
            raise ArcfaceConfigError(f"{where}: reads config.{node.attr} before it is set")
        return known[node.attr]
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [literal_value(item, where, known) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {
            literal_value(k, where, known): literal_value(v, where, known)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal_value(node.operand, where, known)
        if _is_number(value):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _NUMBER_OPS:
        left = literal_value(node.left, where, known)
        right = literal_value(node.right, where, known)
        if _is_number(left) and _is_number(right):
            try:
                return _NUMBER_OPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ArcfaceConfigError(f"{where}: divides by zero") from None
    raise ArcfaceConfigError(f"{where}: the value {_describe(node)}; {_ALLOWED}")


def _parse(path: Path) -> ast.Module:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArcfaceConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ArcfaceConfigError(f"{path}: cannot be read as text ({err})") from None
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as err:
        raise ArcfaceConfigError(
            f"{path}:{err.lineno}: not valid Python ({err.msg}); an arcface_torch config is a "
            "Python file of `config.KEY = value` lines"
        ) from None


def read_settings(
    path: str | Path, base: dict[str, Setting] | None = None
) -> tuple[dict[str, Setting], bool]:
    """The ``config.KEY = value`` settings of one file, and whether it imports configs.base;
    ``base``: the settings of configs/base.py (None: this file is the base, or there is none),
    which ``from configs.base import config`` starts from."""
    path = Path(path)
    tree = _parse(path)
    edict_names: set[str] = set()
    settings: dict[str, Setting] = {}
    defined = False
    imports_base = False
    for node in tree.body:
        where = f"{path}:{node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or a bare string
        if isinstance(node, ast.ImportFrom) and node.module == "easydict" and node.level == 0:
            for alias in node.names:
                if alias.name != "EasyDict":
                    raise ArcfaceConfigError(
                        f"{where}: imports {alias.name} from easydict; {_ALLOWED}"
                    )
                edict_names.add(alias.asname or alias.name)
            continue
        if isinstance(node, ast.Import) and [a.name for a in node.names] == ["easydict"]:
            edict_names.add(f"{node.names[0].asname or 'easydict'}.EasyDict")
            continue
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "configs.base"
            and [(a.name, a.asname) for a in node.names] == [("config", None)]
        ):
            if base is None:
                raise ArcfaceConfigError(
                    f"{where}: imports configs.base, but there is no other base.py beside it"
                )
            imports_base = defined = True  # the base's config object, updated in place
            settings = dict(base)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ", ".join(a.name for a in node.names)
            module = f" from {node.module}" if isinstance(node, ast.ImportFrom) else ""
            raise ArcfaceConfigError(f"{where}: imports {names}{module}; {_ALLOWED}")
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            kind = type(node).__name__
            raise ArcfaceConfigError(f"{where}: a {kind} statement is not read; {_ALLOWED}")
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and target.id == "config":
            if not (
                isinstance(value, ast.Call)
                and ast.unparse(value.func) in edict_names
                and not value.args
                and not value.keywords
            ):
                raise ArcfaceConfigError(f"{where}: `config` must be `edict()`; {_ALLOWED}")
            defined = True
            settings = {}  # a new, empty config
            continue
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            if target.value.id != "config":
                raise ArcfaceConfigError(
                    f"{where}: sets an attribute of `{target.value.id}`, not of `config`; "
                    f"{_ALLOWED}"
                )
            if not defined:
                raise ArcfaceConfigError(f"{where}: `config` is used before `config = edict()`")
            key = target.attr
            settings[key] = Setting(
                key,
                literal_value(
                    value, f"{where}: config.{key}", {k: v.value for k, v in settings.items()}
                ),
                path,
                node.lineno,
            )
            continue
        raise ArcfaceConfigError(f"{where}: assigns to `{ast.unparse(target)}`; {_ALLOWED}")
    if not defined:
        raise ArcfaceConfigError(f"{path}: defines no `config = edict()`")
    return settings, imports_base


def resolve_settings(path: str | Path) -> tuple[dict[str, Setting], Path | None]:
    """The file's settings over those of ``base.py`` in the same folder, as arcface_torch's
    ``get_config`` merges them; also the base file read (None when there is none)."""
    path = Path(path)
    base_path = path.parent / "base.py"
    if path.name == "base.py" or not base_path.is_file():
        own, _ = read_settings(path)
        return own, None
    base, _ = read_settings(base_path)
    own, _ = read_settings(path, base)
    return {**base, **own}, base_path


# ---------------------------------------------------------------------------- mapping the keys


def _set(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def _number(setting: Setting, integer: bool = False):
    value = setting.value
    if not _is_number(value) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ArcfaceConfigError(
            f"{setting.where}: config.{setting.key} must be {kind}, got {value!r}"
        )
    return value


def _text(setting: Setting) -> str:
    if not isinstance(setting.value, str):
        raise ArcfaceConfigError(
            f"{setting.where}: config.{setting.key} must be a string, got {setting.value!r}"
        )
    return setting.value


def _steps(setting: Setting, accumulate: int) -> tuple[int, str]:
    """An interval of arcface_torch micro-batches as partialfc optimizer steps."""
    count = _number(setting, integer=True)
    if count < 1:
        raise ArcfaceConfigError(
            f"{setting.where}: config.{setting.key} must be at least 1, got {count}"
        )
    steps = max(1, round(count / accumulate))
    note = "the same count"
    if accumulate > 1:
        note = (
            f"arcface_torch counts micro-batches, partialfc optimizer steps: {count} / "
            f"gradient_acc {accumulate} = {steps}"
        )
    return steps, note


def convert_settings(
    settings: dict[str, Setting], name: str, rec: str | None = None, network: str | None = None
) -> tuple[dict, list[KeyOutcome]]:
    """The partialfc mapping and per-key outcomes of resolved settings; ``name`` names the run
    when ``config.output`` is None (arcface_torch: ``work_dirs/NAME``)."""
    data: dict = {}
    outcomes: list[KeyOutcome] = []
    for dotted, (value, _) in IMPLIED.items():
        _set(data, dotted, value)

    def mapped(key: str, targets, note: str = "") -> None:
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        outcomes.append(KeyOutcome(key, settings[key].value, "mapped", targets, note))

    def get(key: str) -> Setting | None:
        return settings.get(key)

    accumulate = 1
    if get("gradient_acc"):
        accumulate = _number(settings["gradient_acc"], integer=True)
        if accumulate < 1:
            raise ArcfaceConfigError(
                f"{settings['gradient_acc'].where}: config.gradient_acc must be at least 1"
            )
    for key, setting in settings.items():
        value = setting.value
        if key == "margin_list":
            if not (
                isinstance(value, (tuple, list)) and len(value) == 3 and all(map(_is_number, value))
            ):
                raise ArcfaceConfigError(
                    f"{setting.where}: config.margin_list must be three numbers (m1, m2, m3), "
                    f"got {value!r}"
                )
            m1, m2, m3 = (float(v) for v in value)
            _set(data, "head.margin.m1", m1)
            _set(data, "head.margin.m2_rad", m2)
            _set(data, "head.margin.m3", m3)
            note = "the same order and units: cos(m1*theta + m2) - m3, m2 in radians"
            if m3 > 0 and m2 != 0:
                note += (
                    "; arcface_torch ignores m2 when m3 > 0 (CosFace only), partialfc applies "
                    "all three"
                )
            if m1 != 1 and m3 == 0:
                note += "; arcface_torch stops with an error for m1 != 1 without m3"
            mapped(key, ("head.margin.m1", "head.margin.m2_rad", "head.margin.m3"), note)
        elif key == "network":
            name_here, note = network, "chosen with --network"
            if network is None:
                if value not in NETWORKS:
                    raise ArcfaceConfigError(
                        f"{setting.where}: config.network={value!r} has no partialfc "
                        f"equivalent here ({', '.join(NETWORKS)} have); choose a partialfc "
                        "model with --network"
                    )
                name_here, note = NETWORKS[value]
                note = note or "the same network"
            _set(data, "model.name", name_here)
            mapped(key, "model.name", note)
        elif key == "embedding_size":
            _set(data, "model.embedding_dim", _number(setting, integer=True))
            mapped(key, "model.embedding_dim")
        elif key == "sample_rate":
            rate = float(_number(setting))
            note = (
                "per rank, positives always kept; arcface_torch samples floor(r * C_rank) "
                "classes, partialfc ceil(r * C_rank)"
            )
            if rate == 0:
                rate = POSITIVES_ONLY_RATE
                note += (
                    f"; 0 (positive classes only in arcface_torch) is written as "
                    f"{POSITIVES_ONLY_RATE:g}: the batch's positives, plus one negative on a rank "
                    "that holds none"
                )
            _set(data, "head.sample_rate", rate)
            mapped(key, "head.sample_rate", note)
        elif key == "interclass_filtering_threshold":
            threshold = float(_number(setting))
            _set(data, "head.negative_cos_threshold", threshold if threshold > 0 else None)
            mapped(
                key,
                "head.negative_cos_threshold",
                "0 = off (null); arcface_torch sets the filtered negatives' cosine to 0, so "
                "each still adds exp(0) to the softmax; partialfc removes them (PFC*)",
            )
        elif key == "fp16":
            if not isinstance(value, bool):
                raise ArcfaceConfigError(f"{setting.where}: config.fp16 must be True or False")
            _set(data, "train.precision", "auto" if value else "fp32")
            mapped(
                key,
                "train.precision",
                "True -> auto (fp16 autocast + GradScaler on a GPU, fp32 on a CPU), "
                "False -> fp32; the head stays float32 in both",
            )
        elif key == "batch_size":
            _set(data, "data.batch_size", _number(setting, integer=True))
            mapped(key, "data.batch_size", "per GPU (rank) in both")
        elif key == "optimizer":
            if value not in ("sgd", "adamw"):
                raise ArcfaceConfigError(
                    f"{setting.where}: config.optimizer={value!r}: choose sgd or adamw"
                )
            _set(data, "optim.name", value)
            mapped(
                key, "optim.name", "torch's SGD / AdamW for the backbone, row-sparse for the head"
            )
        elif key == "lr":
            _set(data, "optim.lr", float(_number(setting)))
            mapped(key, "optim.lr", "backbone and head, not scaled by the number of GPUs in either")
        elif key == "momentum":
            _set(data, "optim.momentum", float(_number(setting)))
            note = "SGD only"
            if value != 0.9:
                note += "; train_v2 passes momentum=0.9 whatever the config says"
            mapped(key, "optim.momentum", note)
        elif key == "weight_decay":
            _set(data, "optim.weight_decay", float(_number(setting)))
            mapped(
                key,
                "optim.weight_decay",
                "arcface_torch decays every parameter; partialfc skips biases, norms and "
                "PReLU slopes",
            )
        elif key == "verbose":
            steps, note = _steps(setting, accumulate)
            _set(data, "eval.every_steps", steps)
            mapped(key, "eval.every_steps", f"verification every N steps; {note}")
        elif key == "frequent":
            steps, note = _steps(setting, accumulate)
            _set(data, "train.log_every", steps)
            mapped(key, "train.log_every", f"a log line every N steps; {note}")
        elif key == "gradient_acc":
            _set(data, "train.accumulate_steps", accumulate)
            mapped(
                key,
                "train.accumulate_steps",
                "arcface_torch sums the micro-batches' gradients and steps the LR schedule "
                "per micro-batch; partialfc averages them (one step = one k-times larger batch)",
            )
        elif key == "seed":
            _set(data, "train.seed", _number(setting, integer=True))
            mapped(key, "train.seed", "the same number seeds different random streams")
        elif key == "num_workers":
            _set(data, "data.num_workers", _number(setting, integer=True))
            mapped(key, "data.num_workers")
        elif key == "num_classes":
            _set(data, "head.num_classes", _number(setting, integer=True))
            mapped(key, "head.num_classes", "0 would take it from the .rec; kept as given")
        elif key == "num_epoch":
            _set(data, "train.epochs", float(_number(setting)))
            mapped(key, "train.epochs")
        elif key == "warmup_epoch":
            epochs = float(_number(setting))
            note = "linear warm-up from 0, then the poly decay"
            if epochs < 0:
                note += f"; {epochs:g} is below 0, written as 0 (no warm-up)"
                epochs = 0.0
            _set(data, "schedule.warmup_epochs", epochs)
            mapped(key, "schedule.warmup_epochs", note)
        elif key == "output":
            output = name if value is None else _text(setting)
            folder = Path(output)
            parent = "work_dirs" if value is None else (str(folder.parent) or ".")
            _set(data, "run.output_dir", parent)
            _set(data, "run.name", folder.name)
            note = "the run folder = output_dir/name"
            if value is None:
                note += f"; None is work_dirs/{name} in arcface_torch"
            mapped(key, ("run.output_dir", "run.name"), note)
        elif key == "rec":
            mapped(key, "data.path", *_rec(data, settings, rec))
        elif key == "val_targets":
            targets = value
            if not isinstance(targets, (list, tuple)) or not all(
                isinstance(t, str) for t in targets
            ):
                raise ArcfaceConfigError(
                    f"{setting.where}: config.val_targets must be a list of names, got {value!r}"
                )
            folder = rec if rec is not None else str(settings["rec"].value) if get("rec") else "."
            _set(data, "eval.protocols", [f"bin:{Path(folder) / t}.bin" for t in targets])
            mapped(
                key,
                "eval.protocols",
                "each NAME is bin:REC/NAME.bin; 10-fold accuracy with flip is reported beside "
                "AUC, EER and TAR@FAR",
            )
        elif key in DROPPED:
            outcomes.append(KeyOutcome(key, value, "dropped", note=DROPPED[key]))
        else:
            outcomes.append(
                KeyOutcome(
                    key, value, "dropped", note="not a key arcface_torch's train_v2.py reads"
                )
            )
    if "rec" not in settings and rec is not None:
        _set(data, "data.path", str(Path(rec) / "train.rec"))
    return data, outcomes


def _rec(data: dict, settings: dict[str, Setting], rec: str | None) -> tuple[str]:
    """data.path from ``config.rec`` (or the ``rec`` given instead); the note."""
    value = _text(settings["rec"])
    if rec is not None:
        _set(data, "data.path", str(Path(rec) / "train.rec"))
        return (f"REC/train.rec; the folder {rec} given instead of {value!r}",)
    if value == "synthetic":
        _set(data, "data.path", "synthetic/train.rec")
        return (
            "arcface_torch's random-image speed test has no loader here; data.path names a "
            "placeholder, give a .rec folder with --rec",
        )
    _set(data, "data.path", str(Path(value) / "train.rec"))
    return ("REC/train.rec (+ train.idx beside it); property is not needed",)


def _in_schema_order(data: dict, cls) -> dict:
    """``data`` with its sections and keys in the order of the config dataclasses."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            value = data[f.name]
            tp = hints[f.name]
            out[f.name] = _in_schema_order(value, tp) if dataclasses.is_dataclass(tp) else value
    return out


def convert_config(
    path: str | Path, rec: str | None = None, network: str | None = None
) -> ConvertedConfig:
    """Read an arcface_torch config (and its base) without running it and map it to partialfc's
    config; the result has passed :func:`partialfc.train.config.validate`.

    ``rec`` replaces ``config.rec`` (the dataset folder: train.rec, train.idx, NAME.bin);
    ``network`` a partialfc model name that replaces the mapping of ``config.network``.
    """
    from partialfc.train.config import Config, ConfigError, config_from_dict, validate

    path = Path(path)
    settings, base = resolve_settings(path)
    if "rec" not in settings and rec is None:
        raise ArcfaceConfigError(
            f"{path}: sets no config.rec (the dataset folder: train.rec, train.idx, NAME.bin); "
            "give one with --rec"
        )
    data, outcomes = convert_settings(settings, path.stem, rec=rec, network=network)
    data = _in_schema_order(data, Config)
    try:
        validate(config_from_dict(data, source=str(path)))
    except ConfigError as err:
        raise ArcfaceConfigError(f"{path}: the converted config does not load: {err}") from None
    return ConvertedConfig(path, base, data, outcomes)


def write_converted(converted: ConvertedConfig, output: str | Path) -> Path:
    """Write the YAML (with the key report as its header comment) atomically."""
    from partialfc.atomic import atomic_write_bytes

    output = Path(output)
    atomic_write_bytes(output, converted.yaml_text().encode())
    return output


__all__ = [
    "DROPPED",
    "IMPLIED",
    "NETWORKS",
    "ArcfaceConfigError",
    "ConvertedConfig",
    "KeyOutcome",
    "Setting",
    "convert_config",
    "convert_settings",
    "literal_value",
    "read_settings",
    "resolve_settings",
    "write_converted",
]
