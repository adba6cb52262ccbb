"""The list of input files a ``--skip-bad`` run left out, with the reason for each.

A tab-separated file with a header, one line per file::

    file<TAB>reason
    faces/p1/cut.png<TAB>not a decodable image (200 bytes)

Written on every ``--skip-bad`` run (empty but for the header when nothing was refused), so
the list beside an output always belongs to the run that wrote it.
"""

from __future__ import annotations

import os
from pathlib import Path

from partialfc.atomic import atomic_write_bytes

REFUSED_SUFFIX = ".refused.tsv"


def reason_of(source: str, message: str) -> str:
    """``message`` without the ``"<source>: "`` it starts with (errors name their file)."""
    return message[len(source) + 2 :] if message.startswith(f"{source}: ") else message


def refused_list_path(output: str | os.PathLike) -> Path:
    """``<folder>/<stem>.refused.tsv`` beside ``output`` (a folder output: inside it)."""
    output = Path(output)
    if output.is_dir():
        return output / "refused.tsv"
    return output.with_name(f"{output.stem}{REFUSED_SUFFIX}")


def write_refused_list(path: str | os.PathLike, refused: list[tuple[str, str]]) -> Path:
    """Write ``(file, reason)`` pairs to ``path`` atomically; tabs and line breaks inside a
    reason become spaces, so each file stays on one line."""
    lines = ["file\treason"] + [f"{file}\t{' '.join(reason.split())}" for file, reason in refused]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return Path(path)
