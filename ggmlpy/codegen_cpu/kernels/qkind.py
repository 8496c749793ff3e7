"""The interface every quantised weight type's dot decoder implements (qdot.py's module
docstring describes it and the arithmetic), kept apart from the decoders so that decoder
modules (qdot.py, qgrid.py, qternary.py) can subclass it while qdot.py gathers them all into KINDS
without an import cycle.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.qact import ActFormat
from ggmlpy.codegen_cpu.kernels.qvec import CONTRACT, WEIGHT_BYTE_MAX, dot_u8s8, load_vec, mul_small, sitofp, zeros
from ggmlpy.ir.types import GGMLType, block_size, type_size

Vals = dict


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    return b.fadd(b.fmul(x, y, flags=CONTRACT), acc, flags=CONTRACT)


class QKind:
    """Common parts; subclasses fill in the weight decoding."""
    wtype: GGMLType
    fmt: ActFormat
    step_elems: int
    chunks: int
    tile: tuple[int, int] = (2, 4)   # (weight rows, tokens) per register tile (llvm-mca tuned)
    single_rows: int = 2              # weight rows per tile for a lone token (decode)
    n_acc: int = 2                    # f32 accumulators per (row, token): main, correction

    @property
    def block_bytes(self) -> int:
        return type_size(self.wtype)

    def step_bytes(self) -> int:
        """Weight bytes per step."""
        return self.block_bytes * self.step_elems // block_size(self.wtype)

    def row_at(self, kb: KernelBuilder, wrow: ir.Value, step: ir.Value, tail: bool) -> Vals:
        """Step `step` of the weight row at wrow: `row` of its bytes. (A kind whose steps are
        parts of one block, Q1_0's halves, overrides it.)"""
        return self.row(kb, kb.byte_ptr(wrow, kb.b.mul(step, i64(self.step_bytes()))), tail)

    def n_steps(self, k: int) -> tuple[int, bool]:
        """(whole steps, whether a half step follows) for rows of k values."""
        return k // self.step_elems, k % self.step_elems != 0

    def tok(self, kb: KernelBuilder, arow: ir.Value, step: ir.Value) -> Vals:
        """A token's step: pointer to its bytes, lane scales and correction sums (qact.py)."""
        b = kb.b
        sp = kb.byte_ptr(arow, b.mul(step, i64(self.fmt.step_bytes)))
        aux_type = I32 if self.fmt.offset is not None else F32
        return {"qp": sp, "ad": load_vec(b, kb.byte_ptr(sp, i64(self.step_elems)), F32, 16),
                "aux": load_vec(b, kb.byte_ptr(sp, i64(self.step_elems + 64)), aux_type, 16)}

    def chunk_a(self, kb: KernelBuilder, tok: Vals, j: int) -> ir.Value:
        return load_vec(kb.b, kb.byte_ptr(tok["qp"], i64(64 * j)), I8, 64)

    def init(self, kb: KernelBuilder, row: Vals, tok: Vals) -> ir.Value:
        return zeros(I32, 16)

    def chunk_dot(self, kb: KernelBuilder, isum: ir.Value, wq: Vals, aq: ir.Value) -> ir.Value:
        return dot_u8s8(kb, isum, wq["q"], aq, WEIGHT_BYTE_MAX[self.wtype])

    def finish(self, kb: KernelBuilder, accs: list[ir.Value], isum: ir.Value, row: Vals,
               tok: Vals) -> list[ir.Value]:
        """Main accumulator += isum * (weight scale * activation scale); the second one +=
        correction * activation sums (separate, so the two are not one dependency chain)."""
        b = kb.b
        main = fma(b, sitofp(b, isum), b.fmul(row["wd"], tok["ad"], flags=CONTRACT), accs[0])
        if self.n_acc == 1:
            return [main]
        return [main, fma(b, row["corr"], tok["aux"], accs[1])]


# super-blocks ------------------------------------------------------------------------------------
class KQuant(QKind):
    """A step is one 256-value super-block in four 64-value chunks; the activations have one
    scale per super-block, so a super-block's integer sums (sub-block scales applied as
    integers) are exact and converted once. `row` gives the sub-blocks' integer scales
    ("scales", i32) and the f32 terms their activation sums meet ("corr"), one lane each."""
    step_elems = 256
    chunks = 4
    tile = (3, 4)
    groups: int    # sub-blocks per super-block (8 of 32 values, or 16 of 16)

    def corr_lane(self, j: int, e: int) -> int:
        """The sub-block (lane of "scales" and "corr") of value e of chunk j."""
        return (64 * j + e) // (256 // self.groups)

    def chunk_dot(self, kb: KernelBuilder, isum: ir.Value, wq: Vals, aq: ir.Value) -> ir.Value:
        u_max = WEIGHT_BYTE_MAX[self.wtype]
        p = dot_u8s8(kb, zeros(I32, 16), wq["q"], aq, u_max)
        if 4 * u_max * 128 < 1 << 15:   # |p| fits in i16: mul_small's one vpmaddwd
            return kb.b.add(isum, mul_small(kb, p, wq["sc"]))
        return kb.b.add(isum, kb.b.mul(p, wq["sc"]))   # IQ4_XS's codes reach 241

