"""Comparison helpers shared by the tests."""

from __future__ import annotations

import math
from typing import Any

from hmct_rs.debug import _numbers


def canon(obj: Any) -> Any:
    """JSON-like data with non-finite strings read as floats and NaN made comparable."""
    obj = _numbers(obj)
    if isinstance(obj, dict):
        return {k: canon(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canon(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return "nan"
    return obj


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}
