"""mul_mat lowering: a warp-per-row matrix-vector kernel for few columns (decode) and a
tensor-core tiled kernel for many (prompts), chosen per run from the actual column count.

Fused forms (grouped by the rules of fusion_rules.py): several products sharing `b`
in one launch (Q, K, V), `act(gate . x) * (up . x)` for a GLU feed-forward, `+ residual` as
an epilogue, the norm (and its weight) that produced `b` as a prologue, one product's result
stored straight into KV cache rows (the set_rows of V), and ropes in the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lower_elementwise import c_expr
from ggmlpy.codegen_cuda.lowering import lowering
from ggmlpy.codegen_cuda.steps import (
    DQ8_TYPES, Addr, Env, Launch, LoweringError, Step, ceil_div, check_grid, ev, nb_of, ne_of, sfx,
)
from ggmlpy.ir.ops.rope import yarn_corr_dims
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.ir.types import GGMLType, is_quantized, type_size

MATVEC_WARPS = 4  # warps (of rpw rows each) per block of the matrix-vector kernel
MANY_BLOCKS = 1024  # about 8 blocks per multiprocessor of an H100/H200
TILE = 64
B_TYPES = (GGMLType.F32, GGMLType.F16)
# byte alignment the matrix-vector kernel's loads of a weight row need (mvu_load_<type>)
ROW_ALIGN = {GGMLType.Q4_1: 4, GGMLType.Q5_1: 4, GGMLType.Q4_0: 2, GGMLType.Q5_0: 2, GGMLType.Q8_0: 2,
             GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2}


@dataclass
class PreNorm:
    """`b` = norm(x) [* w]: the kernel reads x and normalises it itself."""

    norm: Tensor
    mul: Tensor | None = None
    weight: Tensor | None = None


@dataclass
class RowStore:
    """mats[index]'s result goes to rows of a cache: set_rows(cache, view of it, idx)."""

    index: int
    set_rows: Tensor
    views: list[Tensor]


@dataclass
class RopeEpilogue:
    """mats[i] is only read as rope(reshape(.)) (mode 0): the kernel rotates row pairs
    (2j, 2j + 1) and writes the rope's result, or stores it as cache rows (`store`: the
    set_rows of K, reached through `store_views`)."""

    view: Tensor
    rope: Tensor
    store_views: list[Tensor]
    store: Tensor | None


@dataclass
class MatMulOptions:
    max_cols: int = 8          # columns of b up to which the matrix-vector kernel runs
    tiled: bool = True         # whether the tiled kernel may be used at all
    rows_per_warp: int = 0     # rows of a per warp of the matrix-vector kernel; 0: auto_rows()
    fuse_rope: bool = True     # rotate Q/K in the product's epilogue (two rows per warp there)


def a_rows_contiguous(a: Tensor) -> bool:
    """Rows of `a` can be decoded 8 values at a time: contiguous along ne[0], K % 8 == 0."""
    k = a.ne[0]
    return a.nb[0] == type_size(a.type) and isinstance(k, int) and k % 8 == 0


def _aligned(t: Tensor, n: int, dims: tuple[int, ...]) -> bool:
    """Every address the kernel forms from t (its view offset, and strides of the dims it
    steps along, or dims of extent 1) is a multiple of n bytes; buffers start 256-aligned."""
    offs = t.view_offs if t.view_src is not None else 0
    if not isinstance(offs, int) or offs % n:
        return False
    for i in dims:
        if t.ne[i] != 1 and (not isinstance(t.nb[i], int) or t.nb[i] % n):
            return False
    return True


def matvec_ok(a: Tensor, b: Tensor) -> bool:
    return a_rows_contiguous(a) and b.nb[0] == type_size(b.type) and a.type in DQ8_TYPES \
        and _aligned(a, ROW_ALIGN.get(GGMLType(a.type), 1), (1, 2, 3))


def x_vectorisable(x: Tensor) -> bool:
    """Columns of x can be read as float4: f32, contiguous along ne[0], 16-byte aligned."""
    return x.type == GGMLType.F32 and x.nb[0] == 4 and _aligned(x, 16, (1, 2, 3))


def auto_rows(m: object) -> int:
    """Rows per warp of the matrix-vector kernel for M rows: one (most warps, hence the most
    latency hidden) unless four still leave MANY_BLOCKS blocks, as for an output projection
    over the vocabulary, where more rows per warp put more loads in flight per warp."""
    return 4 if isinstance(m, int) and m >= MANY_BLOCKS * MATVEC_WARPS * 4 else 1


def is_constant(t: Tensor) -> bool:
    """A weight: nothing in a graph writes it, so a kernel may read it before gg_pdl_wait."""
    return bool(memory_root(t).flags & Flag.WEIGHT)


def supports_mul_mat(node: Tensor) -> bool:
    a, b = node.src
    if b.type not in B_TYPES or a.type not in DQ8_TYPES:
        return False
    if is_quantized(a.type) and not a_rows_contiguous(a):
        return False
    return True


@lowering("mul_mat", supports=supports_mul_mat)
def _mul_mat(node: Tensor, opts) -> "MatMulStep":
    return MatMulStep([node], opts.matmul)


class MatMulStep(Step):
    """mats: the mul_mat nodes (one; several sharing b; or gate and up of a GLU).
    glu: the swiglu/geglu node consuming (gate, up); add: the add node using mats[0]."""

    def __init__(self, mats: list[Tensor], opts: MatMulOptions, glu: Tensor | None = None,
                 add: Tensor | None = None, prenorm: PreNorm | None = None, store: RowStore | None = None,
                 ropes: dict[int, RopeEpilogue] | None = None):
        self.mats, self.glu, self.add, self.prenorm, self.store = mats, glu, add, prenorm, store
        self.ropes = ropes or {}
        b = prenorm.norm.src[0] if prenorm is not None else mats[0].src[1]
        self.b = b
        self.residual = None
        if add is not None:
            self.residual = add.src[1] if add.src[0] is mats[0] else add.src[0]
        outs = [glu] if glu is not None else [add] if add is not None else list(mats)
        if store is not None:
            outs[store.index] = store.set_rows
        for i, epi in self.ropes.items():
            outs[i] = epi.store if epi.store is not None else epi.rope
        nodes = list(mats) + ([glu] if glu is not None else []) + ([add] if add is not None else [])
        reads = [m.src[0] for m in mats] + [b] + ([self.residual] if self.residual is not None else [])
        if prenorm is not None:
            nodes = [t for t in (prenorm.norm, prenorm.mul) if t is not None] + nodes
            reads += [prenorm.weight] if prenorm.weight is not None else []
        if store is not None:
            nodes += store.views + [store.set_rows]
            reads.append(store.set_rows.src[2])
        for epi in self.ropes.values():
            nodes += [epi.view, epi.rope] + epi.store_views + ([epi.store] if epi.store is not None else [])
            reads += list(epi.rope.src[1:]) + ([epi.store.src[2]] if epi.store is not None else [])
        super().__init__(nodes, reads=reads, writes=outs)
        self.outs = outs
        self.opts = opts
        a = mats[0].src[0]
        fused = glu is not None or len(mats) > 1 or prenorm is not None or store is not None or bool(self.ropes)
        epilogue = "add" if add is not None else "none"
        self.mv_spec = None
        if matvec_ok(a, b) and opts.max_cols > 0:
            self.mv_spec = self._matvec_spec(a, b, epilogue)
        elif fused:
            raise LoweringError("fused products need the matrix-vector kernel")
        self.mm_spec = None
        if not fused and opts.tiled:
            self.mm_spec = self._tiled_spec(a, b, epilogue)
        if self.mv_spec is None and self.mm_spec is None:
            raise LoweringError(f"no kernel for mul_mat {mats[0]!r} with these options")

    # specs ------------------------------------------------------------------------------------
    def _matvec_spec(self, a: Tensor, b: Tensor, epilogue: str) -> KernelSpec:
        mode = "glu" if self.glu is not None else "sep"
        n_mats = 1 if mode == "glu" else len(self.mats)
        fields = [("b", "ptr"), ("N", "i64"), ("nb11", "i64"), ("nb12", "i64"),
                  ("nb13", "i64"), ("ne12", "i64"), ("ne13", "i64"), ("r2", "i64"), ("r3", "i64")]
        for g in range(n_mats):
            fields += [(f"a{g}", "ptr"), (f"M{g}", "i64")] + [(f"a{g}nb{i}", "i64") for i in (1, 2, 3)]
            fields += [(f"d{g}", "ptr")] + [(f"d{g}nb{i}", "i64") for i in (1, 2, 3)]
        if mode == "glu":
            fields += [("a1", "ptr")]
        if epilogue == "add":
            fields += [("r", "ptr")] + [(f"rnb{i}", "i64") for i in range(4)]
        pre, st = self.prenorm, self.store
        if pre is not None:
            fields += [("eps", "f64")] + ([("w", "ptr"), ("wnb0", "i64")] if pre.weight is not None else [])
        if st is not None:
            fields += [("st_d", "ptr"), ("st_nb0", "i64"), ("st_nb1", "i64"), ("st_i", "ptr"), ("st_inb0", "i64")]
        ropes, rope_ff = [], False
        if self.ropes:
            first = next(iter(self.ropes.values())).rope
            rope_ff = len(first.src) > 2
            fields += [("pos", "ptr"), ("nbp0", "i64"), ("rope_hd", "i64"), ("n_dims", "i64")]
            fields += [(k, "f64") for k in ("freq_base", "freq_scale", "ext_factor", "attn_factor",
                                            "corr_low", "corr_high")]
            fields += [("ff", "ptr"), ("nbf0", "i64")] if rope_ff else []
            for g, epi in sorted(self.ropes.items()):
                if epi.store is None:
                    ropes.append((g, "none", "none"))
                    continue
                fields += [(f"rs{g}_d", "ptr"), (f"rs{g}_nb0", "i64"), (f"rs{g}_nb1", "i64"),
                           (f"rs{g}_i", "ptr"), (f"rs{g}_inb0", "i64")]
                ropes.append((g, sfx(epi.store.type), sfx(epi.store.src[2].type)))
        # the GLU's own formula over the two accumulators (lower_elementwise.c_expr)
        act = c_expr(self.glu.op, ["acc[r][n]", "acc2[r][n]"]) if self.glu is not None else "none"
        x = pre.norm.src[0] if pre is not None else b
        wvec = pre is not None and pre.weight is not None and x_vectorisable(pre.weight)
        a_const = all(is_constant(m.src[0]) for m in self.mats)
        rows = [m.src[0].ne[1] for m in self.mats]
        rpw = self.opts.rows_per_warp or auto_rows(max(rows) if all(isinstance(r, int) for r in rows) else None)
        if ropes:
            rpw = 2  # the pair of rows a rotation mixes
        return KernelSpec.make(
            "matvec", fields, atype=sfx(a.type), btype=sfx(b.type), bsize=type_size(b.type),
            K=int(a.ne[0]), rpw=rpw, xvec=x_vectorisable(x), wvec=wvec,
            a_const=a_const, ropes=tuple(ropes), rope_ff=rope_ff,
            max_cols=self.opts.max_cols, n_mats=n_mats, mode=mode, act=act, epilogue=epilogue,
            prenorm={"rms_norm": "rms", "norm": "norm"}[pre.norm.op] if pre is not None else "none",
            prenorm_w=pre is not None and pre.weight is not None,
            store_mat=st.index if st is not None else -1,
            store_type=sfx(st.set_rows.type) if st is not None else "none",
            store_itype=sfx(st.set_rows.src[2].type) if st is not None else "none")

    def _tiled_spec(self, a: Tensor, b: Tensor, epilogue: str) -> KernelSpec:
        fields = [("a", "ptr"), ("b", "ptr"), ("d", "ptr"), ("M", "i64"), ("N", "i64"), ("K", "i64")]
        fields += [(f"anb{i}", "i64") for i in range(4)] + [(f"bnb{i}", "i64") for i in range(4)]
        fields += [("ne12", "i64"), ("ne13", "i64"), ("r2", "i64"), ("r3", "i64")]
        fields += [(f"dnb{i}", "i64") for i in (1, 2, 3)]
        if epilogue == "add":
            fields += [("r", "ptr")] + [(f"rnb{i}", "i64") for i in range(4)]
        contig = a_rows_contiguous(a)
        if not contig and a.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
            raise LoweringError(f"strided rows of {a.type.name} are not supported")
        return KernelSpec.make("matmul", fields, atype=sfx(a.type), btype=sfx(b.type),
                               a_contig=contig, epilogue=epilogue)

    def specs(self) -> list[KernelSpec]:
        return [s for s in (self.mv_spec, self.mm_spec) if s is not None]

    # launches ---------------------------------------------------------------------------------
    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        b = self.b
        n_cols = ev(b.ne[1], env)
        use_mv = self.mv_spec is not None and (n_cols <= self.opts.max_cols or self.mm_spec is None)
        if use_mv and n_cols > self.opts.max_cols:
            raise LoweringError(f"{self.label}: {n_cols} columns exceed the fused kernel's {self.opts.max_cols}")
        return [self._matvec(env, addr) if use_mv else self._tiled(env, addr)]

    def _common(self, env: Env) -> dict[str, int]:
        a, b = self.mats[0].src
        ane, bne = ne_of(a, env), ne_of(b, env)
        return {"K": ane[0], "N": bne[1], "ne12": bne[2], "ne13": bne[3],
                "r2": bne[2] // ane[2], "r3": bne[3] // ane[3]}

    def _residual(self, env: Env, addr: Addr) -> dict[str, int]:
        if self.residual is None:
            return {}
        return {"r": addr(self.residual), **{f"rnb{i}": v for i, v in enumerate(nb_of(self.residual, env))}}

    def _matvec(self, env: Env, addr: Addr) -> Launch:
        spec, b = self.mv_spec, self.b
        vals = self._common(env)
        bnb = nb_of(b, env)
        vals.update(b=addr(b), nb11=bnb[1], nb12=bnb[2], nb13=bnb[3])
        mats = self.mats[:1] if self.glu is not None else self.mats
        m_max = 0
        for g, mm in enumerate(mats):
            a = mm.src[0]
            out = self.outs[g]
            anb, dnb = nb_of(a, env), nb_of(out, env)
            m = ev(a.ne[1], env)
            m_max = max(m_max, m)
            vals.update({f"a{g}": addr(a), f"M{g}": m, f"d{g}": addr(out)})
            vals.update({f"a{g}nb{i}": anb[i] for i in (1, 2, 3)})
            vals.update({f"d{g}nb{i}": dnb[i] for i in (1, 2, 3)})
        if self.glu is not None:
            vals["a1"] = addr(self.mats[1].src[0])
        vals.update(self._residual(env, addr))
        if self.prenorm is not None:
            vals["eps"] = self.prenorm.norm.params["eps"]
            if self.prenorm.weight is not None:
                vals.update(w=addr(self.prenorm.weight), wnb0=ev(self.prenorm.weight.nb[0], env))
        if self.store is not None:
            sr = self.store.set_rows
            idx = sr.src[2]
            cnb = nb_of(sr, env)
            vals.update(st_d=addr(sr), st_nb0=cnb[0], st_nb1=cnb[1], st_i=addr(idx), st_inb0=ev(idx.nb[0], env))
        if self.ropes:
            vals.update(self._rope_values(env, addr))
        variant = dict(spec.variant)
        if variant["xvec"] and vals["b"] % 16:
            raise LoweringError(f"{self.label}: x at {vals['b']:#x} is not 16-byte aligned")
        rows = MATVEC_WARPS * variant["rpw"]
        grid = check_grid((ceil_div(m_max, rows), len(mats), vals["ne12"] * vals["ne13"]), "mul_mat")
        return Launch(spec, grid, (32 * MATVEC_WARPS, 1, 1), 0, spec.pack(vals))

    def _rope_values(self, env: Env, addr: Addr) -> dict[str, int | float]:
        first = next(iter(self.ropes.values())).rope
        p, pos = first.params, first.src[1]
        low = high = 0.0
        if p["ext_factor"] != 0.0:
            low, high = yarn_corr_dims(p["n_dims"], p["n_ctx_orig"], p["freq_base"], p["beta_fast"], p["beta_slow"])
        vals: dict[str, int | float] = {
            "pos": addr(pos), "nbp0": ev(pos.nb[0], env), "rope_hd": ev(first.ne[0], env), "n_dims": p["n_dims"],
            "freq_base": p["freq_base"], "freq_scale": p["freq_scale"], "ext_factor": p["ext_factor"],
            "attn_factor": p["attn_factor"], "corr_low": low, "corr_high": high}
        if len(first.src) > 2:
            vals.update(ff=addr(first.src[2]), nbf0=ev(first.src[2].nb[0], env))
        for g, epi in self.ropes.items():
            if epi.store is None:  # the rope's own result (hd, heads, tokens): columns are tokens
                rnb = nb_of(epi.rope, env)
                vals.update({f"d{g}": addr(epi.rope), f"d{g}nb1": rnb[2], f"d{g}nb2": rnb[3], f"d{g}nb3": rnb[3]})
                continue
            sr = epi.store
            idx, cnb = sr.src[2], nb_of(sr, env)
            vals.update({f"rs{g}_d": addr(sr), f"rs{g}_nb0": cnb[0], f"rs{g}_nb1": cnb[1], f"rs{g}_i": addr(idx),
                         f"rs{g}_inb0": ev(idx.nb[0], env)})
        return vals

    def _tiled(self, env: Env, addr: Addr) -> Launch:
        spec = self.mm_spec
        mm = self.mats[0]
        a, b = mm.src
        out = self.outs[0]
        vals = self._common(env)
        m = ev(a.ne[1], env)
        vals.update(a=addr(a), b=addr(b), d=addr(out), M=m)
        vals.update({f"anb{i}": v for i, v in enumerate(nb_of(a, env))})
        vals.update({f"bnb{i}": v for i, v in enumerate(nb_of(b, env))})
        dnb = nb_of(out, env)
        vals.update({f"dnb{i}": dnb[i] for i in (1, 2, 3)})
        vals.update(self._residual(env, addr))
        grid = check_grid((ceil_div(m, TILE), ceil_div(vals["N"], TILE), vals["ne12"] * vals["ne13"]), "mul_mat")
        return Launch(spec, grid, (256, 1, 1), 0, spec.pack(vals))
