"""Where training numbers go: a JSONL file in the run folder, optional TensorBoard, a progress bar.

Every record is one JSON object per line with ``step`` and ``kind`` (``train``, ``diagnostics``,
``eval``, ``nonfinite``, ...) so a run can be plotted with ``pandas.read_json(lines=True)``.
Only rank 0 writes. A run resumed from step S first drops the records it will write again
(:func:`drop_records_after`), so each step's records appear once.
"""

from __future__ import annotations

import json
import math
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


class MetricsLog:
    """Append-only JSONL log (+ TensorBoard scalars when enabled)."""

    def __init__(self, path: Path | None, tensorboard_dir: Path | None = None):
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

    def write(self, kind: str, step: int, **values) -> None:
        if self._file is None:
            return
        record = {"kind": kind, "step": int(step), "time": round(time.time(), 3)}
        record.update(_jsonable(values))
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()


class Progress:
    """tqdm bar over steps showing samples/s, loss, lr and the ETA (rank 0 only)."""

    def __init__(self, total_steps: int, initial_step: int, enabled: bool):
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                smoothing=0.1,
            )

    def update(self, n: int, **postfix) -> None:
        if self._bar is not None:
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
