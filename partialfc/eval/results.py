"""Typed results: dataclasses that serialise to plain JSON with ``.to_dict()``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays, dataclasses and containers to JSON-ready Python values.

    Non-finite floats become the strings ``"inf"``, ``"-inf"`` or ``"nan"`` so the output is
    strict JSON.
    """
    if isinstance(value, Result):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class Result:
    """Mixin for result dataclasses: ``to_dict()`` gives a JSON-serialisable dict."""

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["type"] = type(self).__name__
        return out
