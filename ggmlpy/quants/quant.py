"""`quantize`: float32 rows to ggml block bytes, as ggml's reference quantisers write them."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import quant_blocks, quant_imatrix, quant_iq, quant_iq1, quant_iq_grid, quant_k
from ggmlpy.quants.checks import as_type, row_bytes

Encoder = Callable[[np.ndarray], np.ndarray]

ENCODERS: dict[GGMLType, Encoder] = {
    GGMLType.F32: quant_blocks.f32,
    GGMLType.F16: quant_blocks.f16,
    GGMLType.BF16: quant_blocks.bf16,
    GGMLType.Q4_0: quant_blocks.q4_0,
    GGMLType.Q4_1: quant_blocks.q4_1,
    GGMLType.Q5_0: quant_blocks.q5_0,
    GGMLType.Q5_1: quant_blocks.q5_1,
    GGMLType.Q8_0: quant_blocks.q8_0,
    GGMLType.Q8_1: quant_blocks.q8_1,
    GGMLType.Q2_K: quant_k.q2_k,
    GGMLType.Q3_K: quant_k.q3_k,
    GGMLType.Q4_K: quant_k.q4_k,
    GGMLType.Q5_K: quant_k.q5_k,
    GGMLType.Q6_K: quant_k.q6_k,
    GGMLType.Q8_K: quant_k.q8_k,
    GGMLType.MXFP4: quant_blocks.mxfp4,
    GGMLType.NVFP4: quant_blocks.nvfp4,
    GGMLType.Q1_0: quant_blocks.q1_0,
    GGMLType.Q2_0: quant_blocks.q2_0,
    GGMLType.TQ1_0: quant_blocks.tq1_0,
    GGMLType.TQ2_0: quant_blocks.tq2_0,
    GGMLType.IQ4_NL: quant_iq.iq4_nl,
    GGMLType.IQ4_XS: quant_iq.iq4_xs,
    GGMLType.IQ3_XXS: quant_iq_grid.iq3_xxs,
    GGMLType.IQ3_S: quant_iq_grid.iq3_s,
    GGMLType.IQ2_S: quant_iq_grid.iq2_s,
    GGMLType.IQ1_M: lambda x: quant_iq1.iq1_m(x, None),   # ggml weighs by x*x without a matrix
}

# elements per call of an encoder: bounds the K-quant searches' temporaries (~40 arrays)
CHUNK_ELEMENTS = 1 << 16


# types ggml cannot quantise without an importance matrix (ggml_quantize_requires_imatrix)
REQUIRES_IMATRIX = (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S)


def quantize(x: np.ndarray, type: GGMLType | int, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Encode `x` (float32, any shape, last axis = ne[0]) as ggml type `type`.

    Returns uint8 of shape x.shape[:-1] + (bytes per row,). Inputs of another float dtype are
    first rounded to float32, since ggml's quantisers read float32. With `imatrix` (one value
    per column, ne[0] of them) the bytes are ggml_quantize_chunk's with that importance
    matrix (types that ignore one, such as Q8_0, are encoded as without).
    """
    t = as_type(type)
    if imatrix is not None and t in quant_imatrix.ENCODERS:
        return _quantize_rows(np.asarray(x), t, np.asarray(imatrix, dtype=np.float32))
    encode = ENCODERS.get(t)
    if encode is None:
        if t in REQUIRES_IMATRIX:
            raise ValueError(f"quantization to {t.name} needs an importance matrix (imatrix=)")
        raise NotImplementedError(f"quantization to {t.name} is not implemented")
    arr = np.asarray(x)
    if arr.ndim == 0:
        raise ValueError(f"cannot quantize a 0-d value to {t.name}: need rows (last axis = ne[0])")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"cannot quantize an array of dtype {arr.dtype} to {t.name}")
    width = row_bytes(t, arr.shape[-1], list(reversed(arr.shape)))
    bs = block_size(t)
    blocks = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1, bs)
    out = np.empty((len(blocks), type_size(t)), dtype=np.uint8)
    step = max(1, CHUNK_ELEMENTS // bs)
    for start in range(0, len(blocks), step):
        encoded = encode(blocks[start:start + step])
        out[start:start + step] = encoded.view(np.uint8).reshape(len(encoded), -1)
    return out.reshape(arr.shape[:-1] + (width,))


def _quantize_rows(x: np.ndarray, t: GGMLType, imatrix: np.ndarray) -> np.ndarray:
    """quantize() with an importance matrix: whole rows at a time (the legacy types weigh by
    the row's mean square)."""
    if x.ndim == 0:
        raise ValueError(f"cannot quantize a 0-d value to {t.name}: need rows (last axis = ne[0])")
    if imatrix.shape != (x.shape[-1],):
        raise ValueError(f"importance matrix of shape {imatrix.shape} for rows of {x.shape[-1]} values: "
                         f"it needs one value per column")
    width = row_bytes(t, x.shape[-1], list(reversed(x.shape)))
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = np.empty((len(rows), width), dtype=np.uint8)
    step = max(1, CHUNK_ELEMENTS // max(1, rows.shape[1]))
    encode = quant_imatrix.ENCODERS[t]
    for start in range(0, len(rows), step):
        with np.errstate(all="ignore"):   # masked lanes (zero scales) compute inf and NaN, as C does
            encoded = encode(rows[start:start + step], imatrix)
        out[start:start + step] = encoded.view(np.uint8).reshape(len(rows[start:start + step]), width)
    return out.reshape(x.shape[:-1] + (width,))
