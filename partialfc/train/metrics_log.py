"""Where training numbers go: a JSONL file in the run folder, optional TensorBoard, a progress bar
(on a terminal) or plain periodic lines, and the console's copy in ``training.log``.

Every record is one JSON object per line with ``step`` and ``kind`` (``train``, ``diagnostics``,
``eval``, ``nonfinite``, ...) so a run can be plotted with ``pandas.read_json(lines=True)``.
Only rank 0 writes. A run resumed from step S first drops the records it will write again
(:func:`drop_records_after`), so each step's records appear once.

The numbers of every record also go, as scalars named ``kind/key`` (nested mappings flattened:
``eval/omniglot_open_set/auc``), to TensorBoard (``run.tensorboard``) and to MLflow
(``run.mlflow``, :class:`MLflowLog`), which also receives the resolved config once, as
parameters.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

from partialfc.atomic import atomic_write_bytes


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def drop_records_after(path: Path, step: int) -> int:
    """Rewrite ``path`` atomically without the records a run resumed at ``step`` writes again:
    those with a later step, the ``done`` marker, and a last line cut short by a crash.
    Lines that are not records are kept. Returns the number of lines dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            dropped += 1
            continue
        try:
            record = json.loads(line)
            later = int(record["step"]) > step or record.get("kind") == "done"
        except (ValueError, KeyError, TypeError, AttributeError):
            later = False
        if later:
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        atomic_write_bytes(path, "".join(keep).encode())
    return dropped


def scalars(kind: str, values: dict) -> dict[str, float]:
    """The numbers of a record as ``{"kind/key[/subkey...]": float}``: nested mappings are
    flattened, booleans, strings and lists left out."""
    out: dict[str, float] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            walk(prefix, value.item())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = float(value)

    for key, value in values.items():
        walk(f"{kind}/{key}", value)
    return out


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config mapping as ``{"section.key": "value"}`` (the parameters of a run)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, name + "."))
        else:
            out[name] = json.dumps(value) if not isinstance(value, str) else value
    return out


class MLflowLog:
    """One MLflow run: the config as parameters (once), then scalars by step.

    ``tracking_uri``: ``""`` means ``$MLFLOW_TRACKING_URI`` when set, else a local file store
    ``file:<default_dir>`` (for which MLflow's ``MLFLOW_ALLOW_FILE_STORE`` opt-in is set in
    this process; ``sqlite:///...`` or ``http://...`` select a database or a server). Metric
    names keep letters, digits and ``_ - . / space``; other characters become ``_``
    (``tar@far=0.001`` is logged as ``tar_far_0.001``). Needs ``pip install
    'partialfc[mlflow]'`` (``mlflow-skinny``).
    """

    def __init__(
        self, tracking_uri: str, experiment: str, run_name: str, config: dict, default_dir: Path
    ):
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ImportError(
                "run.mlflow=true needs MLflow: pip install 'partialfc[mlflow]'"
            ) from None
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri:
            uri = Path(default_dir).resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self._client = MlflowClient(uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_config(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(re.sub(r"[^A-Za-z0-9_\-./ ]", "_", key), value, now, int(step))
            for key, value in values.items()
            if math.isfinite(value)
        ]
        for start in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class MetricsLog:
    """Append-only JSONL log (+ TensorBoard scalars and an :class:`MLflowLog` when given).

    ``config`` (a nested mapping) is written once to TensorBoard as text.
    """

    def __init__(
        self,
        path: Path | None,
        tensorboard_dir: Path | None = None,
        mlflow: MLflowLog | None = None,
        config: dict | None = None,
    ):
        self.path = Path(path) if path is not None else None
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError(
                    "run.tensorboard=true needs the tensorboard package: "
                    "pip install 'partialfc[tensorboard]'"
                ) from err
            self._tb = SummaryWriter(str(tensorboard_dir))
            if config is not None:
                import yaml

                text = yaml.safe_dump(config, sort_keys=False)
                self._tb.add_text("config", "```\n" + text + "```")
        self._mlflow = mlflow

    def write(self, kind: str, step: int, **values) -> None:
        if self._file is None:
            return
        record = {"kind": kind, "step": int(step), "time": round(time.time(), 3)}
        record.update(_jsonable(values))
        self._file.write(json.dumps(record) + "\n")
        if self._tb is None and self._mlflow is None:
            return
        numbers = scalars(kind, values)
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
        if self._mlflow is not None and numbers:
            self._mlflow.log(numbers, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._mlflow is not None:
            self._mlflow.close()
            self._mlflow = None


class ConsoleLog:
    """The training console: each line printed (with ``tqdm.write``, so it never lands on a
    progress bar's line) and, once :meth:`open` names a file, appended to it with the time
    (``training.log`` in the run folder; a resumed run appends)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else None

    def open(self, path: Path) -> None:
        self.path = Path(path)

    def __call__(self, text: str = "", error: bool = False) -> None:
        from tqdm import tqdm

        stream = sys.stderr if error else sys.stdout
        tqdm.write(text, file=stream)
        stream.flush()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.path, "a") as log:
            for line in str(text).splitlines() or [""]:
                log.write(f"{stamp} {line}\n")


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (hours unbounded), e.g. ``3725.2 -> '1:02:05'``."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def step_line(
    step: int, total: int, epoch: float, loss: float, lr: float, samples_per_s: float, eta_s: float
) -> str:
    """The plain periodic line printed when no progress bar is shown (a job's log file)."""
    return (
        f"step {step:,}/{total:,} (epoch {epoch:.2f}): loss {loss:.4f}, lr {lr:.3e}, "
        f"{samples_per_s:,.0f} samples/s, ETA {format_duration(eta_s)}"
    )


class Progress:
    """tqdm bar over steps showing samples/s, loss, lr and the ETA (rank 0 only), shown only
    when asked for (``run.progress``) and stderr is a terminal; :attr:`active` says whether it
    is, so the trainer prints plain lines instead (``nohup``, a cluster job)."""

    def __init__(self, total_steps: int, initial_step: int, enabled: bool):
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                smoothing=0.1,
            )

    @property
    def active(self) -> bool:
        return self._bar is not None

    def update(self, n: int, **postfix) -> None:
        if self._bar is not None:
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
