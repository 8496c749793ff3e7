"""RoPE: per token, the cos/sin table for its position is built once and applied to every
head (as ggml's rope cache), pairs adjacent (mode 0) or split in halves (mode 2, NeoX).

YaRN (ext_factor != 0, gpt-oss and other long-context files): each pair's angle blends the
interpolated (freq_scale * theta) and the extrapolated (theta) angle by a ramp over the
pair index, a constant per pair computed here at build time as ggml's rope_yarn_ramp does,
and the magnitude grows by 1 + 0.1 ln(1 / freq_scale).

Multi-section rope (modes 8 and 40, ggml_rope_multi) rotates halves as NeoX, but a token has
four positions (t, h, w, e at pos[i2 + c * ne2]): they are read once per token, and each
pair's angle takes the one a constant per-pair component table (mrope_components) names."""
from __future__ import annotations

import dataclasses
import math

import llvmlite.ir as ir
import numpy as np

from ggmlpy.codegen_cpu.irgen import F32, I32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, row_ptr
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.ops.rope import MROPE_SECTIONS, ROPE_TYPE_NORM, is_multi, mrope_components, yarn_corr_dims
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType



def _supported(node: Tensor) -> bool:
    return (node.src[0].type in (GGMLType.F32, GGMLType.F16) and node.type == GGMLType.F32
            and isinstance(node.params["n_dims"], int))


@lowering("rope", supports=_supported)
def _rope(kb: KernelBuilder, node: Tensor) -> None:
    _rope_tokens(kb, node, [(node, "src0", "dst")])


def _pair_parts(node: Tensor) -> tuple[Tensor, Tensor]:
    """The two rope nodes a rope_pair node stands for: (q, pos) into dst, (k, pos) into the
    memory of its fourth operand (the group's second output)."""
    q, pos, k, out_b = node.src
    return (dataclasses.replace(node, op="rope", src=(q, pos)),
            dataclasses.replace(out_b, op="rope", src=(k, pos), params=node.params))


def _pair_supported(node: Tensor) -> bool:
    a, b = _pair_parts(node)
    return _supported(a) and _supported(b) and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3]


@lowering("rope_pair", supports=_pair_supported)
def _rope_pair(kb: KernelBuilder, node: Tensor) -> None:
    """The rope_qk fusion group (codegen_cpu/fusion.py): q and k of a layer rotated in one
    kernel, each token's cos/sin table built once for both."""
    a, b = _pair_parts(node)
    _rope_tokens(kb, node, [(a, "src0", "dst"), (b, "src2", "src3")])


def _rope_tokens(kb: KernelBuilder, node: Tensor, parts: list[tuple[Tensor, str, str]]) -> None:
    """Per token: the cos/sin table, then every head of each (rope node, source argument,
    destination argument) in parts."""
    b = kb.b
    p = node.params
    freq = node.src[2] if node.op == "rope" and len(node.src) > 2 else None
    n_dims = p["n_dims"]
    half = n_dims // 2
    theta_scale = p["freq_base"] ** (-2.0 / n_dims)
    # ggml's theta for pair i is pos * theta_scale**i (computed by repeated multiplication)
    powers, t = [], 1.0
    for _ in range(half):
        powers.append(t)
        t *= theta_scale
    table = _constant_table(kb, "rope_theta", powers)
    ramp = _constant_table(kb, "rope_ramp", _yarn_ramp(p)) if p["ext_factor"] != 0.0 else None
    multi = is_multi(p["mode"])
    comps = _constant_table(kb, "rope_comp", list(mrope_components(n_dims, p["sections"], p["mode"])), I32) \
        if multi else None
    with b.goto_block(kb.fn.entry_basic_block):
        cos_t = b.alloca(ir.ArrayType(F32, half), name="cos")
        sin_t = b.alloca(ir.ArrayType(F32, half), name="sin")
        pos_t = b.alloca(ir.ArrayType(F32, MROPE_SECTIONS), name="pos4") if multi else None

    ne2 = kb.dim(node.ne[2])
    n_tok = b.mul(ne2, kb.dim(node.ne[3]))
    start, end = kb.thread_range(n_tok)
    mscale = np.float32(p["attn_factor"])
    if ramp is not None:   # in f32, as ggml: mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale)
        growth = np.float32(math.log(np.float32(1.0) / np.float32(p["freq_scale"])))
        mscale = mscale * (np.float32(1.0) + np.float32(0.1) * growth)
    mscale = f32(float(mscale))
    with kb.loop(start, end, "t") as t_:
        i2 = b.srem(t_, ne2)
        i3 = b.sdiv(t_, ne2)
        if multi:   # the token's t, h, w, e positions: pos[i2 + c * ne2]
            for c in range(MROPE_SECTIONS):
                at = b.add(i2, b.mul(i64(c), ne2))
                value = b.sitofp(b.load(kb.elem_ptr(kb.arg("src1"), at, I32), typ=I32), F32)
                b.store(value, b.gep(pos_t, [i64(0), i64(c)]))
        else:
            position = b.sitofp(b.load(kb.elem_ptr(kb.arg("src1"), i2, I32), typ=I32), F32)
        with kb.loop(i64(0), i64(half), "k") as k:
            if multi:   # this pair's component, from the table
                position = b.load(b.gep(pos_t, [i64(0), b.load(b.gep(comps, [i64(0), k]), typ=I32)]), typ=F32)
            if ramp is None:
                theta = kb.fmul(kb.fmul(position, b.load(b.gep(table, [i64(0), k]), typ=F32)), f32(p["freq_scale"]))
                if freq is not None:
                    theta = b.fdiv(theta, kb.load(kb.elem_ptr(kb.arg("src2"), k, F32), GGMLType.F32))
            else:   # ggml's rope_yarn: theta_extrap, theta_interp and their blend
                extrap = kb.fmul(position, b.load(b.gep(table, [i64(0), k]), typ=F32))
                if freq is not None:
                    extrap = b.fdiv(extrap, kb.load(kb.elem_ptr(kb.arg("src2"), k, F32), GGMLType.F32))
                mix = b.load(b.gep(ramp, [i64(0), k]), typ=F32)
                interp = kb.fmul(extrap, f32(p["freq_scale"]))
                theta = kb.fadd(kb.fmul(interp, kb.fsub(f32(1.0), mix)), kb.fmul(extrap, mix))
            b.store(kb.fmul(kb.intrinsic("llvm.cos", [theta]), mscale), b.gep(cos_t, [i64(0), k]))
            b.store(kb.fmul(kb.intrinsic("llvm.sin", [theta]), mscale), b.gep(sin_t, [i64(0), k]))
        for part, src_arg, dst_arg in parts:
            _rotate_heads(kb, part, src_arg, dst_arg, i2, i3, cos_t, sin_t, half)


def _constant_table(kb: KernelBuilder, name: str, values: list, typ: ir.Type = F32) -> ir.GlobalVariable:
    table = ir.GlobalVariable(kb.module, ir.ArrayType(typ, len(values)), f"{name}_{kb.fn.name}")
    items = [f32(v) for v in values] if typ == F32 else [ir.Constant(typ, v) for v in values]
    table.initializer = ir.Constant(ir.ArrayType(typ, len(values)), items)
    table.global_constant = True
    table.linkage = "internal"
    return table


def _yarn_ramp(p: dict) -> list[float]:
    """Each pair's share of the extrapolated angle: ggml's rope_yarn_ramp(low, high, 2k) in
    f32, times ext_factor."""
    low, high = (np.float32(v) for v in yarn_corr_dims(p["n_dims"], p["n_ctx_orig"], p["freq_base"],
                                                        p["beta_fast"], p["beta_slow"]))
    out = []
    for k in range(p["n_dims"] // 2):
        y = (np.float32(k) - low) / max(np.float32(0.001), high - low)
        out.append(float((np.float32(1.0) - min(np.float32(1.0), max(np.float32(0.0), y))) * np.float32(p["ext_factor"])))
    return out


def _rotate_heads(kb: KernelBuilder, node: Tensor, src_arg: str, dst_arg: str, i2: ir.Value, i3: ir.Value,
                  cos_t: ir.Value, sin_t: ir.Value, half: int) -> None:
    b = kb.b
    p = node.params
    src = node.src[0]
    n_dims = p["n_dims"]
    ne1 = kb.dim(node.ne[1])
    with kb.loop(i64(0), ne1, "h") as h:
        srow = row_ptr(kb, kb.arg(src_arg), src, h, i2, i3)
        drow = row_ptr(kb, kb.arg(dst_arg), node, h, i2, i3)
        with kb.loop(i64(0), i64(half), "k") as k:
            c = b.load(b.gep(cos_t, [i64(0), k]), typ=F32)
            s = b.load(b.gep(sin_t, [i64(0), k]), typ=F32)
            if p["mode"] != ROPE_TYPE_NORM:   # NeoX and the multi modes: halves
                j0, j1 = k, b.add(k, i64(half))
            else:
                j0 = b.mul(k, i64(2))
                j1 = b.add(j0, i64(1))
            x0 = kb.load(elem_ptr(kb, srow, src, j0), src.type)
            x1 = kb.load(elem_ptr(kb, srow, src, j1), src.type)
            kb.store(elem_ptr(kb, drow, node, j0), kb.fsub(kb.fmul(x0, c), kb.fmul(x1, s)), node.type)
            kb.store(elem_ptr(kb, drow, node, j1), kb.fadd(kb.fmul(x0, s), kb.fmul(x1, c)), node.type)
        with kb.loop(i64(n_dims), kb.dim(node.ne[0]), "rest") as i0:
            kb.store(elem_ptr(kb, drow, node, i0), kb.load(elem_ptr(kb, srow, src, i0), src.type), node.type)
