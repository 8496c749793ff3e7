"""Dequantisation of whole tensors and of selected rows.

The work is done in chunks of blocks (not per block): each chunk's temporaries fit in the
CPU cache, which makes the several passes of a decoder nearly as cheap as one.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size
from ggmlpy.quants.checks import as_bytes, as_ne, as_type, check_length
from ggmlpy.quants import dequant_blocks, dequant_iq
from ggmlpy.quants.layouts import block_dtype

# float32 outputs per chunk: 1 MiB of output plus its small-integer temporaries stays in L2
CHUNK_ELEMENTS = 1 << 18

_PLAIN = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.F64: np.dtype("<f8"),
    GGMLType.I8: np.dtype("i1"),
    GGMLType.I16: np.dtype("<i2"),
    GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
}


# block decoders of every quantised type, the I-quants' kept in their own module
DECODERS: dict[GGMLType, dequant_blocks.Decoder] = {**dequant_blocks.DECODERS, **dequant_iq.DECODERS}

# every type `dequantize` decodes: the types a model's weights may have, since whatever no
# compiled backend runs the reference backend computes from these float32 values
DEQUANTIZABLE: frozenset[GGMLType] = frozenset(DECODERS) | frozenset(_PLAIN) | {GGMLType.BF16}


def dequantizable_types() -> tuple[GGMLType, ...]:
    """Every type `dequantize` decodes, in ggml id order (the engine can compute these)."""
    return tuple(sorted(DEQUANTIZABLE))


def _check_supported(t: GGMLType) -> None:
    if t not in DEQUANTIZABLE:
        raise NotImplementedError(f"dequantization of {t.name} is not implemented")


def dequantize(data: np.ndarray | bytes | memoryview, type: GGMLType | int,
               ne: Sequence[int]) -> np.ndarray:
    """Decode a tensor of ggml type `type` and ggml shape `ne` to float32.

    The result has numpy shape `reversed(ne)`. F32 data comes back as a zero-copy view of
    `data` (read-only when `data` is): decoding it is a no-op, and a loader should not pay to
    copy float32 weights it only reads.
    """
    t = as_type(type)
    _check_supported(t)
    dims = as_ne(ne)
    raw = as_bytes(data)
    check_length(raw, t, dims)
    shape = tuple(reversed(dims))
    if t in _PLAIN:
        return _plain(raw, t).reshape(shape)
    out = np.empty(shape, dtype=np.float32)
    if t == GGMLType.BF16:
        _chunked(raw.view("<u2"), out.reshape(-1), _bf16)
    else:
        _chunked(raw.view(block_dtype(t)), out.reshape(-1, block_size(t)), DECODERS[t])
    return out


def dequantize_rows(data: np.ndarray | bytes | memoryview, type: GGMLType | int,
                    ne: Sequence[int], rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """Decode only the given rows (get_rows on an embedding matrix): shape (len(rows), ne[0]).

    Rows are numbered over all of ne[1:] flattened, as ggml lays them out in memory.
    """
    t = as_type(type)
    _check_supported(t)
    dims = as_ne(ne)
    raw = as_bytes(data)
    check_length(raw, t, dims)
    n_rows = math.prod(dims[1:])
    idx = np.asarray(rows)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"rows must be a 1-D sequence of integers, got {rows!r}")
    idx = idx.astype(np.intp)
    bad = (idx < 0) | (idx >= n_rows)
    if bad.any():
        raise IndexError(f"row {int(idx[bad][0])} is out of range for a tensor of shape "
                         f"{list(dims)} with {n_rows} rows")
    if idx.size == 0 or dims[0] == 0:
        return np.empty((idx.size, dims[0]), dtype=np.float32)
    picked = raw.reshape(n_rows, -1)[idx]
    return dequantize(picked, t, (dims[0], idx.size))


def _chunked(blocks: np.ndarray, out: np.ndarray, decode) -> None:
    """Run `decode` over runs of blocks sized to keep temporaries in cache.

    `out` is (n_blocks, block_size), or 1-D for the one-element-per-block plain types.
    """
    step = max(1, CHUNK_ELEMENTS // (out.shape[1] if out.ndim == 2 else 1))
    for start in range(0, len(blocks), step):
        stop = start + step
        decode(blocks[start:stop], out[start:stop])


def _plain(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    values = raw.view(_PLAIN[t])
    if t == GGMLType.F32:
        return values
    out = np.empty(values.shape, dtype=np.float32)
    _chunked(values, out, _f16 if t == GGMLType.F16 and _denormals_work() else _convert)
    return out


def _convert(values: np.ndarray, out: np.ndarray) -> None:
    with np.errstate(over="ignore"):  # F64 beyond float32's range becomes inf, as in C
        np.copyto(out, values, casting="unsafe")


def _bf16(bits: np.ndarray, out: np.ndarray) -> None:
    """bfloat16 is the top half of a float32: widen the bits, shift them into place."""
    wide = out.view(np.uint32)
    np.copyto(wide, bits)
    wide <<= 16


# f16 -> f32 by bit placement: numpy's own cast converts one element at a time; these four
# whole-array integer/float passes are about twice as fast and give identical bits for all
# 65536 halves (tested). Sign-extending the int16 puts the sign at bit 31; the mask keeps it
# with exponent and mantissa moved up 13 bits; multiplying by 2^112 rebiases the exponent and
# normalises half subnormals exactly. Only inf/nan (exponent 31) need their exponent fixed.
_F16_MASK = np.array([0x8FFFE000], dtype=np.uint32).view(np.int32)[0]
_F16_REBIAS = np.float32(2.0**112)
_TINY = np.array([1], dtype=np.uint32).view(np.float32)  # the smallest float32 subnormal


def _denormals_work() -> bool:
    """False if some library switched on flush-to-zero/denormals-are-zero in this thread."""
    return bool((_TINY * _F16_REBIAS)[0] == np.float32(2.0**-37))


def _f16(halves: np.ndarray, out: np.ndarray) -> None:
    bits = out.view(np.int32)
    np.copyto(bits, halves.view(np.int16))
    bits <<= 13
    bits &= _F16_MASK
    out *= _F16_REBIAS
    signed, unsigned = halves.view(np.int16), halves.view(np.uint16)
    if signed.max() >= 0x7C00 or unsigned.max() >= 0xFC00:  # some +-inf or nan
        special = (unsigned & 0x7C00) == 0x7C00
        bits[special] |= 0x7F800000
