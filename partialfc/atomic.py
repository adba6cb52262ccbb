"""Atomic file output: write to a temporary file in the target's directory, then rename.

A reader (or a crash) never sees a half-written checkpoint, gallery, export or report: the
file is either the old one or the complete new one (``os.replace`` is atomic on POSIX). The
temporary file is created with mode ``0o666`` minus the umask, like a plain ``open(path, "w")``,
so the result has the permissions any other file written by the user would have.

A process killed between the two steps leaves its temporary behind. Temporaries are named
``.<name>.<host>-<pid>-<random>.tmp``; the first time a process writes into a folder it removes
the temporaries there whose writer (same host, that process id) is no longer running, so a
rerun of an interrupted command cleans up after it. A writer still running, here or on another
host sharing the folder, keeps its temporary.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# which machine wrote a temporary: process ids are only meaningful on their own host
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
_TEMPORARY = re.compile(r"^\..+\.([0-9a-f]{6})-(\d+)-[0-9a-f]{8}\.tmp$")
_swept: set[Path] = set()  # folders this process has already cleaned


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, under another user
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporaries in ``folder`` left by writers of this host that are no longer
    running (killed between writing and renaming); returns what was removed."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or match.group(1) != HOST_TAG or _running(int(match.group(2))):
            continue
        try:
            os.unlink(entry.path)
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(Path(entry.path))
    return removed


class AtomicFile:
    """A temporary file next to ``path``; :meth:`commit` moves it onto ``path``,
    :meth:`discard` removes it.

    For writers that stream into the file between other calls (``RecordIOWriter``); a block of
    code uses :func:`atomic_output` instead. The folder of ``path`` must exist.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        folder = self.path.parent
        if not folder.is_dir():
            raise FileNotFoundError(f"{self.path}: folder {folder} does not exist")
        if folder.resolve() not in _swept:
            remove_stale_temporaries(folder)
            _swept.add(folder.resolve())
        while True:
            tmp = folder / f".{self.path.name}.{HOST_TAG}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
            try:  # O_EXCL: never reuse a file someone else created; 0o666 & ~umask like open()
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            os.close(fd)
            break
        self.tmp = tmp
        self.mode = os.stat(tmp).st_mode & 0o777  # 0o666 minus the umask, as the OS applied it
        self.done = False

    def commit(self) -> None:
        """Move the temporary file onto ``path`` (with the mode it was created with: a writer
        that recreated it, as safetensors does with mode 0o600, does not change it)."""
        if os.stat(self.tmp).st_mode & 0o777 != self.mode:
            os.chmod(self.tmp, self.mode)
        os.replace(self.tmp, self.path)
        self.done = True

    def discard(self) -> None:
        """Remove the temporary file (``path`` is left as it was)."""
        if not self.done:
            self.tmp.unlink(missing_ok=True)
            self.done = True


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` if the block succeeds.

    The writer inside the block may be any library call that takes a file name
    (``torch.save``, ``safetensors.torch.save_file``, ``onnx.save_model``). On an exception the
    temporary file is removed and ``path`` is left as it was. Missing parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = AtomicFile(path)
    try:
        yield target.tmp
        target.commit()
    finally:
        target.discard()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (flushed and fsynced before the rename)."""
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
