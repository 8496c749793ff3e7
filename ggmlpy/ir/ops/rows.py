"""Row gathers and scatters: get_rows (embedding lookup, output selection) and set_rows
(writing the ubatch's K and V into their KV cache cells)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import DST_TYPE, Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType, block_size
from ggmlpy.quants.from_float import quantize_rows_cpu

F32 = GGMLType.F32
INDEX_TYPES = (GGMLType.I32, GGMLType.I64)
# the quantised KV cache types (llama.cpp's -ctk/-ctv): set_rows and cpy write rows of them
QUANT_DST = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q5_1)


def _get_rows_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, idx = srcs
    require(idx.type in INDEX_TYPES, "get_rows", "row indices must be I32 or I64")
    require(idx.ne[1] == a.ne[2] and idx.ne[2] == a.ne[3] or (idx.ne[1] == 1 and a.ne[2] == 1),
            "get_rows", lambda: f"indices {idx.shape_str()} do not match {a.shape_str()}")
    out_type = GGMLType.I32 if a.type == GGMLType.I32 else F32
    return Inferred(out_type, (a.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]))


def _get_rows_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a, idx = x  # a [A3, A2, rows, K]; idx [1, I2, I1, n]
    n3, n2, n1 = idx.shape[1], idx.shape[2], idx.shape[3]
    out = np.empty((n3, n2, n1, a.shape[3]), dtype=np.float32 if a.dtype != np.int32 else np.int32)
    for i3 in range(n3):
        for i2 in range(n2):
            out[i3, i2] = a[min(i3, a.shape[0] - 1), min(i2, a.shape[1] - 1)][idx[0, i3, i2]]
    return out


def _get_rows_cases() -> list[OpCase]:
    cases = []
    for t in (F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.IQ4_NL, GGMLType.Q4_K,
              GGMLType.Q6_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.IQ2_S, GGMLType.IQ2_XS,
              GGMLType.IQ2_XXS, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ2_0, GGMLType.TQ1_0,
              GGMLType.Q2_0, GGMLType.Q1_0, GGMLType.NVFP4):
        k = max(block_size(t), 32)
        cases.append(OpCase((SrcSpec(t, (k, 10, 1, 1)), SrcSpec(GGMLType.I32, (4,), fill="rows:10")),
                            label=t.name))
    cases.append(OpCase((SrcSpec(F32, (6, 10, 3, 1)), SrcSpec(GGMLType.I32, (4, 3), fill="rows:10")),
                        label="batched"))
    return cases


register(OpDef("get_rows", Kind.OPAQUE, _get_rows_infer, _get_rows_ref,
               api={"get_rows": lambda b, a, idx: b.make("get_rows", (a, idx))},
               cases=_get_rows_cases, doc="gather rows of a by index (ggml_get_rows)"))


def _set_rows_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    dst, src, idx = srcs
    require(idx.type in INDEX_TYPES, "set_rows", "row indices must be I32 or I64")
    require(src.ne[0] == dst.ne[0], "set_rows", lambda: f"row length {src.ne[0]} vs destination {dst.ne[0]}")
    require(src.ne[1] == idx.ne[0], "set_rows", lambda: f"{src.shape_str()} rows but {idx.shape_str()} indices")
    require(dst.type in (F32, GGMLType.F16, GGMLType.BF16) + QUANT_DST, "set_rows",
            lambda: f"destination type {dst.type.name} is not supported")
    require(dst.type not in QUANT_DST or (isinstance(src.ne[0], int) and src.ne[0] % block_size(dst.type) == 0),
            "set_rows", lambda: f"rows of {src.ne[0]} are not whole {dst.type.name} blocks")
    root, offs = (dst.view_src, dst.view_offs) if dst.view_src is not None else (dst, 0)
    return Inferred(dst.type, dst.ne, dst.nb, root, offs)


def _set_rows_write(dst: np.ndarray, x: Sequence[np.ndarray], params: dict) -> None:
    """A quantised destination (the KV cache types, QUANT_DST) gets each row as ggml's CPU
    set_rows writes it: quantised by the type's from_float (quants/from_float.py)."""
    src, idx = x[1], x[2]  # src [S3, S2, n, K]; idx [1, I2?, I1?, n]
    qtype = params.get(DST_TYPE)
    for i3 in range(src.shape[0]):
        for i2 in range(src.shape[1]):
            rows = idx[0, i3 % idx.shape[1], i2 % idx.shape[2]]
            values = src[i3, i2] if qtype is None else quantize_rows_cpu(src[i3, i2], qtype)
            dst[i3 % dst.shape[0], i2 % dst.shape[1], rows] = values


def _set_rows_cases() -> list[OpCase]:
    return [OpCase((SrcSpec(t, (16, 12, 1, 1), fill="zeros"), SrcSpec(F32, (16, 5, 1, 1)),
                    SrcSpec(GGMLType.I64, (5,), fill="unique_rows:12")), label=t.name)
            for t in (F32, GGMLType.F16)] + [
        OpCase((SrcSpec(t, (64, 12, 1, 1), fill="zeros"), SrcSpec(F32, (64, 5, 1, 1)),
                SrcSpec(GGMLType.I64, (5,), fill="unique_rows:12")), label=t.name) for t in QUANT_DST]


register(OpDef("set_rows", Kind.WRITE, _set_rows_infer, write=_set_rows_write,
               api={"set_rows": lambda b, dst, src, idx: b.make("set_rows", (dst, src, idx))},
               cases=_set_rows_cases, doc="dst[idx[i]] = src[i] (ggml_set_rows); the result is dst"))
