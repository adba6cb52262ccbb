"""Advisory file locks that serialise read-modify-write updates of one file across processes.

Writes through :mod:`partialfc.atomic` are atomic, but two processes that each read a file,
change it and write it back still lose one update (the last rename wins). A command that
updates a file in place takes :func:`file_lock` on it *before* reading it and holds it until
the atomic rename is done. The lock is ``flock(2)`` on a hidden sidecar ``.<name>.lock`` in
the same folder (the ``filelock`` package); the kernel releases it when the holder exits,
killed or not, so a crash never leaves a file locked (a sidecar left behind is harmless).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout


class LockTimeout(ValueError):
    """Another process held the lock on a file for longer than the caller would wait."""


def lock_path(path: str | os.PathLike) -> Path:
    """The sidecar that carries the lock of ``path``: ``<folder>/.<name>.lock``."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def try_lock(lock_file: str | os.PathLike) -> FileLock | None:
    """Take the advisory lock on ``lock_file`` now (created if missing), or return None when
    another process holds it; the caller releases it (``.release()``)."""
    lock = FileLock(lock_file, mode=0o666)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


@contextmanager
def file_lock(
    path: str | os.PathLike,
    timeout: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the advisory lock of ``path`` for the block (waits for another holder).

    Args:
        path: the file about to be read and rewritten (it need not exist yet; its folder is
            created if missing).
        timeout: seconds to wait for another holder; None waits for as long as it takes.
            Past it, :class:`LockTimeout` names the file.
        log: where the one "waiting for lock" line goes when the lock is held elsewhere
            (default: standard error).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path(path), mode=0o666)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say = log or (lambda line: print(line, file=sys.stderr, flush=True))
        wait = "" if timeout is None else f" (waiting up to {timeout:g} s)"
        say(f"waiting for lock on {path} held by another process{wait}")
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except Timeout:
            raise LockTimeout(
                f"{path}: still locked by another process after {timeout:g} s "
                f"(lock file {lock_path(path)}); try again later"
            ) from None
    try:
        yield
    finally:
        lock.release()
