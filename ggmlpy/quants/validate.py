"""Tensor data validation (ggml's `ggml_validate_row_data`, llama.cpp's `check_tensors`).

A corrupt or badly converted file can hold NaN or Inf weights, which turn every logit into
NaN many layers later, far from the cause. This finds them at load time and names the
tensor and the first bad element (plain float types) or block (quantised types, whose
float scales `d`/`dmin`/`m` are what can be non-finite; their integer quants cannot). Types
with nothing that can be non-finite (integers, NVFP4) pass; types without a check here
(MXFP4) are reported as unchecked.

Work is vectorised over chunks of a few MiB, so a check costs about one pass over the bytes
and never allocates more than a chunk's worth of temporaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants.dequant_iq import iq1_m_scale
from ggmlpy.quants.layouts import block_dtype

CHUNK_BYTES = 1 << 23

T = GGMLType
# the float fields of each quantised block that ggml_validate_row_data checks
SCALE_FIELDS: dict[GGMLType, tuple[str, ...]] = {
    T.Q4_0: ("d",), T.Q4_1: ("d", "m"), T.Q5_0: ("d",), T.Q5_1: ("d", "m"), T.Q8_0: ("d",),
    T.Q8_1: ("d", "s"), T.Q2_K: ("d", "dmin"), T.Q3_K: ("d",), T.Q4_K: ("d", "dmin"),
    T.Q5_K: ("d", "dmin"), T.Q6_K: ("d",), T.Q8_K: ("d",),
    **{t: ("d",) for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ4_NL,
                           T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.Q1_0, T.Q2_0)},
    T.IQ1_M: ("d",),    # the fp16 scale assembled from the top nibbles of its scale words
}
INTEGER_TYPES = frozenset({T.I8, T.I16, T.I32, T.I64})
# nothing that can be non-finite: integers, and NVFP4 (its E4M3 scale bytes are all valid)
ALWAYS_VALID = INTEGER_TYPES | {T.NVFP4}
# exponent bits of each 16-bit float: all ones is Inf or NaN
_EXP16 = {T.F16: 0x7C00, T.BF16: 0x7F80}


class TensorDataError(ValueError):
    """A tensor holds a NaN or Inf value (or a quantised block a non-finite scale)."""


@dataclass(frozen=True)
class Invalid:
    """The first bad spot: element or block index, the field (quantised types) and value."""

    index: int
    value: float
    field: str | None = None


def can_validate(t: GGMLType) -> bool:
    return t in SCALE_FIELDS or t in ALWAYS_VALID or t in (T.F32, T.F64, T.F16, T.BF16)


def _as_float(bits16: int, t: GGMLType) -> float:
    if t == T.BF16:
        return float(np.array([bits16 << 16], np.uint32).view(np.float32)[0])
    return float(np.array([bits16], np.uint16).view(np.float16)[0])


def _first_nonfinite(x: np.ndarray) -> int | None:
    """Index of the first non-finite float (any float dtype, any 1-d stride)."""
    if np.isfinite(x).all():
        return None
    return int(np.flatnonzero(~np.isfinite(x))[0])


def _first_bad_bits(bits: np.ndarray, exp: int, tmp: np.ndarray) -> int | None:
    """Index of the first 16-bit float whose exponent is all ones (Inf or NaN)."""
    np.bitwise_and(bits, exp, out=tmp)
    hit = tmp == exp
    if not hit.any():
        return None
    return int(np.argmax(hit))


def first_invalid(data: np.ndarray, t: GGMLType) -> Invalid | None:
    """The first non-finite element (F32/F64/F16/BF16) or block scale (quantised types) of
    a tensor's bytes, or None when all are finite (and for integer types and NVFP4)."""
    if t in ALWAYS_VALID:
        return None
    if not can_validate(t):
        raise NotImplementedError(f"no validation for {t.name} tensors")
    raw = data.reshape(-1).view(np.uint8)
    item = type_size(t)
    step = max(CHUNK_BYTES // item, 1) * item
    for start in range(0, raw.size, step):
        chunk = raw[start:start + step]
        base = start // item
        found = _first_in_chunk(chunk, t)
        if found is not None:
            return Invalid(base + found.index, found.value, found.field)
    return None


def _first_in_chunk(chunk: np.ndarray, t: GGMLType) -> Invalid | None:
    if t in _EXP16:
        bits = chunk.view(np.uint16)
        i = _first_bad_bits(bits, _EXP16[t], np.empty_like(bits))
        return None if i is None else Invalid(i, _as_float(int(bits[i]), t))
    if t in (T.F32, T.F64):
        x = chunk.view(np.float32 if t == T.F32 else np.float64)
        i = _first_nonfinite(x)
        return None if i is None else Invalid(i, float(x[i]))
    blocks = chunk.view(block_dtype(t))
    best: Invalid | None = None
    for name in SCALE_FIELDS[t]:
        scale = iq1_m_scale(blocks).astype(np.float16) if t == T.IQ1_M else blocks[name]
        if scale.dtype == np.float16:
            bits = scale.view(np.uint16)
            i = _first_bad_bits(bits, _EXP16[T.F16], np.empty(bits.shape, np.uint16))
            value = None if i is None else float(scale[i])
        else:
            i = _first_nonfinite(scale)
            value = None if i is None else float(scale[i])
        if i is not None and (best is None or i < best.index):
            best = Invalid(i, value, name)  # type: ignore[arg-type]
    return best


def validate_tensor(name: str, t: GGMLType, data: np.ndarray) -> None:
    """Raise TensorDataError naming the tensor and its first bad element or block."""
    bad = first_invalid(data, t)
    if bad is None:
        return
    if bad.field is None:
        raise TensorDataError(f"tensor {name!r} ({t.name}) has invalid data: element {bad.index} "
                              f"is {bad.value}")
    bs = block_size(t)
    raise TensorDataError(f"tensor {name!r} ({t.name}) has invalid data: block {bad.index} "
                          f"(elements {bad.index * bs}..{(bad.index + 1) * bs - 1}) has a "
                          f"non-finite scale {bad.field} = {bad.value}")
