"""Helpers shared by op definitions: ggml's shape predicates and broadcasting."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ggmlpy.ir.symbolic import Dim


class ShapeError(ValueError):
    """An op was given sources whose shapes or types ggml would reject."""


def can_repeat(small: Sequence[Dim], big: Sequence[Dim]) -> bool:
    """ggml_can_repeat: every dim of `small` divides the matching dim of `big`."""
    for s, b in zip(small, big):
        if s == b or s == 1:
            continue
        if isinstance(s, int) and isinstance(b, int) and s and b % s == 0:
            continue
        return False
    return True


def require(cond: bool, op: str, message: str | Callable[[], str]) -> None:
    """ShapeError unless cond; a message that formats shapes is passed as a function, so
    that it is only formatted when the check fails (graphs check thousands of shapes)."""
    if not cond:
        raise ShapeError(f"{op}: {message() if callable(message) else message}")


def repeat_to(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """ggml's broadcast: a dim of 1 broadcasts, a dim that divides is tiled."""
    reps = [1 if xs == s else s // xs for xs, s in zip(x.shape, shape)]
    if all(r == 1 or xs == 1 for r, xs in zip(reps, x.shape)):
        return np.broadcast_to(x, tuple(shape))
    return np.tile(x, reps)


def shape_of(t: Any) -> str:
    return t.shape_str() if hasattr(t, "shape_str") else str(t)
