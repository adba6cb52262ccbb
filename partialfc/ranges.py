"""Allowed intervals for numeric settings (config keys and command-line options), with error
messages that name the setting: ``--batch-size must be an integer >= 1, got 0``."""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass

# Values echoed in error messages are cut to this many characters: a config value can be a
# megabyte string or an alias-expanded structure of a billion nodes (YAML "billion laughs").
SHOWN_CHARS = 120
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxtuple, _SHOWN.maxset = 3, 6, 6, 6, 6
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = SHOWN_CHARS, SHOWN_CHARS, 40


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters; its cost is bounded
    too (nested containers are cut at 3 levels and 6 items before anything is formatted)."""
    try:
        text = _SHOWN.repr(value)
    except ValueError:  # an int too long for str() (Python refuses > 4300 digits)
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Range:
    """An allowed interval; ``integer`` values must be ints, others finite numbers."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False  # None is allowed

    def allows(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        low, high = (v if v is None or isinstance(v, int) else f"{v:.6g}" for v in self.bounds)
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{low}, {high}{right}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {low}"
        else:
            text = kind
        return f"null or {text}" if self.optional else text

    @property
    def bounds(self) -> tuple:
        return self.low, self.high

    def check(self, name: str, value, error=ValueError, extra: str = "") -> None:
        """Raise ``error`` naming ``name`` unless ``value`` is allowed."""
        if not self.allows(value):
            raise error(f"{name} must be {self.describe()}{extra}, got {shown(value)}")


def check_options(args, ranges: dict[str, Range]) -> None:
    """Check ``argparse`` options by their flag (``"--batch-size"`` reads ``args.batch_size``);
    options absent from ``args`` or left at None are skipped."""
    for flag, allowed in ranges.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            allowed.check(flag, value)
