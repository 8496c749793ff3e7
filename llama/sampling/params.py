"""Parameter checks shared by the samplers and `make_sampler`.

Each check raises `ValueError` whose message starts with the parameter's name, so a bad CLI
flag or API argument is reported as such instead of surfacing later as a numpy error.
"""
from __future__ import annotations

import math
import numbers


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """An integer (bool and float are refused), optionally at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(name: str, value: object, *, allow_neg_inf: bool = False) -> float:
    """A real number that is not NaN nor infinite (-inf allowed when asked)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if math.isinf(value) and not (allow_neg_inf and value < 0):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_unit(name: str, value: object) -> float:
    """A probability-like parameter in [0, 1]."""
    value = check_float(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value
