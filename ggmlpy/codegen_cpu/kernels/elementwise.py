"""Elementwise kernels: arithmetic with broadcasting, activations, GLUs, scale, and the copies
(cont, cpy) that convert types or make data contiguous.

Each op is one formula over f32 values that works on scalars and on <16 x float> vectors alike
(KernelBuilder's math splats scalar constants). The kernel walks this thread's rows; when every
row is contiguous along ne[0] it runs the formula on whole vectors with a masked last chunk,
else (strided views, sources repeated along ne[0]) element by element. Explicit vectors rather
than LLVM's loop vectoriser: that one gives up, or adds run-time overlap checks that fail when
the op runs in place (dst == src, which the buffer planner does often) and so falls back to
scalar code.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import VECTOR_WIDTH, KernelBuilder, f32, i64, round_f16
from ggmlpy.codegen_cpu.kernels.common import (
    elem_ptr, n_rows, row_ptr, src_row_ptr, unravel_row,
)
from ggmlpy.codegen_cpu.kernels import kv_store
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.ops.formulas import FORMULAS as OP_FORMULAS
from ggmlpy.ir.ops.formulas import Expr, primitives, render
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

Formula = Callable[[KernelBuilder, Sequence[ir.Value], dict], ir.Value]
PLAIN = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)

# LLVM IR for each primitive of ggmlpy.ir.ops.formulas (code_for_op); all of them work on
# scalars and vectors alike. Arithmetic carries fast-math flags except `div` (ggml_div is an
# IEEE division); ops whose formula needs a primitive missing here are not lowered.
CODE_FOR_OP: dict[str, Callable[..., ir.Value]] = {
    "add": lambda kb, a, b: kb.fadd(a, b),
    "sub": lambda kb, a, b: kb.fsub(a, b),
    "mul": lambda kb, a, b: kb.fmul(a, b),
    "div": lambda kb, a, b: kb.fdiv(a, b, fast=False),
    "div_fast": lambda kb, a, b: kb.fdiv(a, b),
    "neg": lambda kb, a: kb.b.fneg(a),
    "abs": lambda kb, a: kb.intrinsic("llvm.fabs", [a]),
    "sqrt": lambda kb, a: kb.sqrt(a),
    "exp": lambda kb, a: kb.exp(a),
    "log": lambda kb, a: kb.log(a),
    "tanh": lambda kb, a: kb.tanh(a),
    "erf": lambda kb, a: kb.erf(a),
    "max": lambda kb, a, b: kb.fmax(a, b),
    "ge": lambda kb, a, b: kb.fcmp(">=", a, b),
    "le": lambda kb, a, b: kb.fcmp("<=", a, b),
    "select": lambda kb, c, a, b: kb.select(c, a, b),
    "round_f16": lambda kb, a: round_f16(kb.b, a),
}


def renders(op: str) -> bool:
    """Whether the CPU renders every primitive of op's formula."""
    return op in OP_FORMULAS and primitives(OP_FORMULAS[op]) <= set(CODE_FOR_OP)


def formula(op: str) -> Formula:
    """op's shared formula as an emitter: (kb, operand values, node params) -> value."""
    expr = OP_FORMULAS[op]

    def emit(kb: KernelBuilder, x: Sequence[ir.Value], params: dict) -> ir.Value:
        def leaf(n: Expr) -> ir.Value:
            if n.op == "operand":
                return x[n.arg]
            if n.op == "const":
                return f32(n.arg)
            name, default = n.arg
            return f32(params[name] if default is None else params.get(name, default))

        table = {p: functools.partial(fn, kb) for p, fn in CODE_FOR_OP.items()}
        return render(expr, table, leaf)
    return emit


def identity(kb: KernelBuilder, x: Sequence[ir.Value], params: dict) -> ir.Value:
    """cont and cpy: the value itself (load and store convert the type)."""
    return x[0]


def _plain(node: Tensor) -> bool:
    return node.type in PLAIN and all(s.type in PLAIN for s in node.src)


def contiguous_rows(t: Tensor) -> bool:
    """Consecutive elements along ne[0] (a static stride of one element): vector loads work."""
    return isinstance(t.nb[0], int) and t.nb[0] == type_size(t.type)


def vectorisable(node: Tensor, srcs: Sequence[Tensor]) -> bool:
    """Rows contiguous along ne[0] everywhere, and each source either as long as dst's rows or
    a single element repeated along them."""
    return contiguous_rows(node) and all(
        contiguous_rows(s) and (s.ne[0] == node.ne[0] or s.ne[0] == 1) for s in srcs)


def emit_map(kb: KernelBuilder, node: Tensor, srcs: Sequence[Tensor], src_args: Sequence[ir.Value],
             formula: Formula) -> None:
    """dst[i] = formula(src_0[i], src_1[i], ...) with every source broadcast to dst's shape."""
    start, end = kb.thread_range(n_rows(kb, node))
    ne0 = kb.dim(node.ne[0])
    row_fn = _map_row_vector if vectorisable(node, srcs) else _map_row_scalar
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        srows = [src_row_ptr(kb, a, s, node, i1, i2, i3) for s, a in zip(srcs, src_args)]
        row_fn(kb, node, srcs, srows, drow, ne0, formula)


def _map_row_vector(kb: KernelBuilder, node: Tensor, srcs: Sequence[Tensor], srows: Sequence[ir.Value],
                    drow: ir.Value, ne0: ir.Value, formula: Formula) -> None:
    # a source of one element per row is loaded once and splatted
    repeated = {k: kb.splat(kb.load(row, s.type), VECTOR_WIDTH)
                for k, (s, row) in enumerate(zip(srcs, srows)) if s.ne[0] != node.ne[0]}

    def chunk(i0: ir.Value, mask: ir.Value | None) -> None:
        vals = [repeated[k] if k in repeated else
                kb.load_vector(elem_ptr(kb, row, s, i0), s.type, VECTOR_WIDTH, mask)
                for k, (s, row) in enumerate(zip(srcs, srows))]
        kb.store_vector(elem_ptr(kb, drow, node, i0), formula(kb, vals, node.params), node.type, mask)

    kb.vector_chunks(ne0, chunk)


def _map_row_scalar(kb: KernelBuilder, node: Tensor, srcs: Sequence[Tensor], srows: Sequence[ir.Value],
                    drow: ir.Value, ne0: ir.Value, formula: Formula) -> None:
    b = kb.b
    with kb.loop(i64(0), ne0, "i0") as i0:
        vals = []
        for s, row in zip(srcs, srows):
            j = i0 if s.ne[0] == node.ne[0] else (i64(0) if s.ne[0] == 1 else b.srem(i0, kb.dim(s.ne[0])))
            vals.append(kb.load(elem_ptr(kb, row, s, j), s.type))
        kb.store(elem_ptr(kb, drow, node, i0), formula(kb, vals, node.params), node.type)


def emit_flat_copy(kb: KernelBuilder, node: Tensor, src: Tensor, src_arg: ir.Value) -> None:
    """Copy in ggml's logical element order into a contiguous destination of another shape."""
    b = kb.b
    start, end = kb.thread_range(n_rows(kb, src))
    ne0, ne1, ne2 = kb.dim(src.ne[0]), kb.dim(src.ne[1]), kb.dim(src.ne[2])
    esize = kb.dim(node.nb[0])
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, src, r)
        srow = row_ptr(kb, src_arg, src, i1, i2, i3)
        flat_row = b.mul(b.add(i1, b.mul(ne1, b.add(i2, b.mul(ne2, i3)))), ne0)
        with kb.loop(i64(0), ne0, "i0") as i0:
            v = kb.load(elem_ptr(kb, srow, src, i0), src.type)
            kb.store(kb.byte_ptr(kb.arg("dst"), b.mul(b.add(flat_row, i0), esize)), v, node.type)


@lowering(*[op for op in OP_FORMULAS if renders(op)], supports=_plain)
def _elementwise(kb: KernelBuilder, node: Tensor) -> None:
    emit_map(kb, node, node.src, [kb.arg(f"src{i}") for i in range(len(node.src))], formula(node.op))


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return tuple(a.ne) == tuple(b.ne)


@lowering("cont", supports=lambda node: _plain(node) or kv_store.decode_supported(node))
def _cont(kb: KernelBuilder, node: Tensor) -> None:
    src = node.src[0]
    if src.type in kv_store.STORABLE:   # a quantised KV cache's rows, decoded (its K-shift)
        kv_store.decode_rows(kb, node, src, kb.arg("src0"))
    elif _same_shape(node, src):
        emit_map(kb, node, [src], [kb.arg("src0")], identity)
    else:
        emit_flat_copy(kb, node, src, kb.arg("src0"))


def _cpy_supported(node: Tensor) -> bool:
    dst, src = node.src
    return _plain(node) and (_same_shape(dst, src) or dst.is_contiguous) or kv_store.store_supported(node)


@lowering("cpy", supports=_cpy_supported)
def _cpy(kb: KernelBuilder, node: Tensor) -> None:
    dst, src = node.src  # WRITE ops: the destination first; the kernel's dst is its memory
    if node.type in kv_store.STORABLE:   # rows quantised back into a KV cache (its K-shift)
        kv_store.store_rows(kb, node, src, kb.arg("src1"))
    elif _same_shape(node, src):
        emit_map(kb, node, [src], [kb.arg("src1")], identity)
    else:
        emit_flat_copy(kb, node, src, kb.arg("src1"))


