"""Typed metadata overrides (`kv_overrides`, llama.cpp's `llama_model_kv_override`).

An override replaces a key's value before anything reads the metadata (architecture,
hparams, vocab), so a model loads exactly as if its file held the value. As in llama.cpp an
override has one of four types, bool, int, float or str, and must match the type family of
the key it replaces (any integer width for int, FLOAT32/FLOAT64 for float): a float for an
integer key is more likely a mistake than a wish. Unlike llama.cpp, which warns and ignores
a mistyped override, a mismatch is a ValueError here: a load that silently ignores what the
caller asked for is worse than one that fails. A key the file lacks is added, typed from the
Python value (INT64, FLOAT64, BOOL, STRING).
"""
from __future__ import annotations

import logging
from typing import Mapping, Union

import numpy as np

from ggmlpy.gguf import GGUFField, GGUFFile, GGUFValueType

log = logging.getLogger("llama.model")

KVOverrideValue = Union[bool, int, float, str]

V = GGUFValueType
_FAMILIES: dict[type, frozenset[GGUFValueType]] = {
    bool: frozenset({V.BOOL}),
    int: frozenset({V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}),
    float: frozenset({V.FLOAT32, V.FLOAT64}),
    str: frozenset({V.STRING}),
}
_NEW_KEY_TYPE = {bool: V.BOOL, int: V.INT64, float: V.FLOAT64, str: V.STRING}
_INT_RANGES = {V.UINT8: (0, 2**8 - 1), V.INT8: (-2**7, 2**7 - 1), V.UINT16: (0, 2**16 - 1),
               V.INT16: (-2**15, 2**15 - 1), V.UINT32: (0, 2**32 - 1), V.INT32: (-2**31, 2**31 - 1),
               V.UINT64: (0, 2**64 - 1), V.INT64: (-2**63, 2**63 - 1)}


def _kind(key: str, value: object) -> type:
    """The override's type (bool before int: a bool is an int to Python); numpy scalars count
    as their Python kind."""
    if isinstance(value, (bool, np.bool_)):
        return bool
    if isinstance(value, (int, np.integer)):
        return int
    if isinstance(value, (float, np.floating)):
        return float
    if isinstance(value, str):
        return str
    raise ValueError(f"kv_overrides[{key!r}]: a {type(value).__name__} is not an override type "
                     f"(bool, int, float or str)")


def _typed(key: str, value: object, kind: type, vtype: GGUFValueType) -> object:
    """value as the key's declared type stores it (a FLOAT32 key holds a float32), checked
    to fit instead of wrapping or overflowing."""
    if kind is bool:
        return bool(value)
    if kind is str:
        return str(value)
    if kind is int:
        lo, hi = _INT_RANGES[vtype]
        if not lo <= int(value) <= hi:
            raise ValueError(f"kv_overrides[{key!r}] = {value} does not fit the key's type "
                             f"{vtype.name} [{lo}, {hi}]")
        return int(value)
    if vtype == V.FLOAT32:
        if np.isfinite(float(value)) and abs(float(value)) > float(np.finfo(np.float32).max):
            raise ValueError(f"kv_overrides[{key!r}] = {value} overflows the key's type FLOAT32")
        return float(np.float32(value))
    return float(value)


def override_field(key: str, value: KVOverrideValue, current: GGUFField | None) -> GGUFField:
    """The field `key` holds after the override: the current field's type with the new
    value, or a new field typed from the value. ValueError names the key and both types."""
    kind = _kind(key, value)
    if current is None:
        return GGUFField(key, _NEW_KEY_TYPE[kind], _typed(key, value, kind, _NEW_KEY_TYPE[kind]), -1)
    if current.type not in _FAMILIES[kind]:
        if current.type == V.ARRAY:
            found = f"an ARRAY of {current.element_type.name if current.element_type else '?'}"
            hint = "arrays cannot be overridden"
        else:
            found = current.type.name
            hint = f"give {_article(_family_name(current.type))} value"
        raise ValueError(f"kv_overrides[{key!r}]: the override is {_article(kind.__name__)} but the "
                         f"file's {key} is {found}; {hint}")
    return GGUFField(key, current.type, _typed(key, value, kind, current.type), current.offset)


def _article(kind: str) -> str:
    return f"an {kind}" if kind == "int" else f"a {kind}"


def _family_name(vtype: GGUFValueType) -> str:
    return next(kind.__name__ for kind, family in _FAMILIES.items() if vtype in family)


def apply_kv_overrides(gguf: GGUFFile, overrides: Mapping[str, KVOverrideValue] | None) -> None:
    """Apply every override to the open file's metadata (`fields` and `metadata`), all
    checked before any is applied, so a bad one leaves the metadata as the file had it."""
    if not overrides:
        return
    new: dict[str, GGUFField] = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"kv_overrides: keys must be non-empty strings, got {key!r}")
        new[key] = override_field(key, value, gguf.fields.get(key))
    for key, f in new.items():
        log.info("using metadata override (%s) %r = %r", f.type.name, key, f.value)
        gguf.fields[key] = f
        gguf.metadata[key] = f.value
