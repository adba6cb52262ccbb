"""The run folder ``run.output_dir/run.name``, and what a new run does when it is taken.

* ``--resume`` (``checkpoint.resume=auto``, or a checkpoint inside the folder) continues the run
  in its folder.
* A folder that holds a run (at least one checkpoint) is otherwise left alone:
  ``run.on_exists`` is ``error`` (default: stop, naming the ways out), ``new`` (write to
  ``name-2``, ``name-3``, ... and say so) or ``overwrite`` (``--overwrite``: delete the run's
  files first).
* A folder with run files but no checkpoint is a failed attempt, with nothing to resume: a new
  run replaces its files and says so.

Only the files a run writes (:data:`RUN_FILES`) are ever deleted; anything else in the folder
stays. A training process holds an advisory lock on ``<folder>/.lock`` (``flock`` through
:mod:`partialfc.locking`; the system releases it when the process ends, crash or not), so a
folder in use now is never cleared and two processes never train into it together.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from partialfc.train import checkpoint as ckpt
from partialfc.train.config import OnExists

LOCK_FILE = ".lock"
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "training.log",
    "checkpoints",
    "report",
    "eval",
    "tensorboard",
)
ON_EXISTS = get_args(OnExists)


class RunFolderExistsError(ValueError):
    """The run folder holds a run and ``run.on_exists=error``."""


class RunLock:
    """An exclusive, non-blocking advisory lock on ``folder/.lock``
    (:func:`partialfc.locking.try_lock`)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_FILE
        self._lock = None

    def acquire(self) -> RunLock:
        from partialfc.locking import try_lock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = try_lock(self.path)
        if self._lock is None:
            raise RunFolderExistsError(
                f"{self.path.parent} is in use by another training process right now; wait for "
                "it to finish or choose another run.name"
            )
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def in_use(folder: Path) -> bool:
    """Whether a process holds the run lock of ``folder`` now."""
    if not (Path(folder) / LOCK_FILE).exists():
        return False
    try:
        RunLock(folder).acquire().release()
    except RunFolderExistsError:
        return True
    return False


def checkpoints_in(folder: Path) -> list[Path]:
    return ckpt.list_checkpoints(Path(folder) / "checkpoints")


def run_files_in(folder: Path) -> list[Path]:
    return [Path(folder) / name for name in RUN_FILES if (Path(folder) / name).exists()]


def clear_run_files(folder: Path) -> list[str]:
    """Delete the files a run wrote in ``folder`` (directories through a trash rename, so an
    interrupted deletion never leaves a half-deleted checkpoint); returns their names."""
    removed = []
    for path in run_files_in(folder):
        if path.is_dir():
            ckpt.discard_directory(path)
        else:
            path.unlink()
        removed.append(path.name)
    return removed


def continues_in(base: Path, resume: str | None) -> bool:
    """Whether ``checkpoint.resume`` continues the run of ``base`` in place."""
    if resume is None:
        return False
    if resume == "auto":
        return True
    try:
        Path(resume).resolve().relative_to(Path(base).resolve())
    except ValueError:
        return False
    return True


def prepare_run_dir(base: Path, on_exists: str = "error") -> tuple[Path, str]:
    """The folder a new run writes to, and a note for the console ("" when there is nothing
    to say). Clears a failed attempt's files, and with ``overwrite`` a finished run's."""
    if on_exists not in ON_EXISTS:
        raise ValueError(f"run.on_exists={on_exists!r}: choose one of {', '.join(ON_EXISTS)}")
    base = Path(base)
    busy = in_use(base)
    if busy and on_exists != "new":
        RunLock(base).acquire()  # raises, naming the folder
    found = checkpoints_in(base)
    if not found and not busy:
        if not run_files_in(base):
            return base, ""
        clear_run_files(base)
        return base, f"{base}: replacing the files of an earlier attempt that saved no checkpoint"
    if on_exists == "overwrite":
        clear_run_files(base)
        return base, f"{base}: --overwrite deleted the earlier run (up to {found[-1].name})"
    if on_exists == "new":
        n = 2
        while checkpoints_in(base.with_name(f"{base.name}-{n}")) or in_use(
            base.with_name(f"{base.name}-{n}")
        ):
            n += 1
        path, note = prepare_run_dir(base.with_name(f"{base.name}-{n}"))
        return path, (note + "; " if note else "") + f"{base} is taken: writing to {path}"
    raise RunFolderExistsError(
        f"{base} already holds a run (newest checkpoint {found[-1].name}): continue it with "
        f"--resume, start another with --set run.name=NEW_NAME (or --set run.on_exists=new for "
        f"{base.name}-2), or replace it with --overwrite"
    )
