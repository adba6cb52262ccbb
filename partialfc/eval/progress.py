"""Progress bars for the slow parts of an evaluation: embedding images and scoring pairs
(the Omniglot open set embeds 13,180 images and scores 86.7 M pairs).

Bars go to stderr and, by default, appear only when stderr is a terminal (tqdm's rule), so logs
and pipes stay clean. :func:`set_progress` overrides that for the process: ``False`` hides them
(``partialfc train`` with ``run.progress=false``), ``True`` shows them on any stream, ``None``
restores the terminal rule.
"""

from __future__ import annotations

import sys

_ENABLED: bool | None = None


def set_progress(enabled: bool | None) -> None:
    """Show (True), hide (False) or show on a terminal only (None, the default)."""
    global _ENABLED
    _ENABLED = enabled


def progress_bar(total: int, desc: str, unit: str):
    """A tqdm bar over ``total`` units, or a disabled one that costs nothing."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        file=sys.stderr,
        disable=None if _ENABLED is None else not _ENABLED,
        leave=False,
        dynamic_ncols=True,
    )
