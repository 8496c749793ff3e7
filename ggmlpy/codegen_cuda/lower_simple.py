"""Lowerings of the one-kernel ops: norms, rope, softmax, row gathers and scatters, and (in
lower_elementwise.py) elementwise maps and copies, registered in the lowering table."""
from __future__ import annotations

import math

from ggmlpy.codegen_cuda.kernels import KernelSpec, tensor_fields
from ggmlpy.codegen_cuda import lower_elementwise as _elementwise  # noqa: F401  (registers its ops)
from ggmlpy.codegen_cuda import lower_experts as _experts  # noqa: F401  (registers its ops)
from ggmlpy.codegen_cuda import lower_out_prod as _out_prod  # noqa: F401  (registers its ops)
from ggmlpy.codegen_cuda import lower_recurrent as _recurrent  # noqa: F401  (registers its ops)
from ggmlpy.codegen_cuda.lowering import lowering, supports
from ggmlpy.codegen_cuda.steps import (
    DQ8_TYPES, FLOAT_TYPES, INDEX_TYPES, KV_QUANT_TYPES, Addr, Env, Launch, Step, check_grid, ev,
    grid_stride_blocks, nb_of, ne_of, row_threads, sfx, tensor_values,
)
from ggmlpy.ir.ops.rope import ROPE_MULTI_MODES, ROPE_TYPE_NEOX, ROPE_TYPE_NORM, is_multi, yarn_corr_dims
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, is_quantized, type_size

# norms ------------------------------------------------------------------------------------------
class NormStep(Step):
    """rms_norm / norm over ne[0], optionally multiplied by a broadcast weight (`mul`)."""

    def __init__(self, norm: Tensor, mul: Tensor | None = None):
        out = mul if mul is not None else norm
        self.weight = None
        if mul is not None:
            self.weight = mul.src[1] if mul.src[0] is norm else mul.src[0]
        super().__init__([norm] + ([mul] if mul is not None else []),
                         reads=[norm.src[0]] + ([self.weight] if self.weight is not None else []),
                         writes=[out])
        self.norm, self.out = norm, out
        fields = [("s", "ptr"), ("d", "ptr")] + [(f"ne{i}", "i64") for i in range(4)]
        fields += [(f"nbs{i}", "i64") for i in range(4)] + [(f"nbd{i}", "i64") for i in range(4)]
        variant = dict(kind="rms" if norm.op == "rms_norm" else "norm", src=sfx(norm.src[0].type),
                       has_w=self.weight is not None)
        if self.weight is not None:
            fields += tensor_fields("w")
            variant["wtype"] = sfx(self.weight.type)
        fields += [("eps", "f64")]
        self.spec = KernelSpec.make("norm", fields, **variant)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        src = self.norm.src[0]
        ne = ne_of(src, env)
        vals = {"s": addr(src), "d": addr(self.out), "eps": self.norm.params["eps"]}
        vals.update({f"ne{i}": v for i, v in enumerate(ne)})
        vals.update({f"nbs{i}": v for i, v in enumerate(nb_of(src, env))})
        vals.update({f"nbd{i}": v for i, v in enumerate(nb_of(self.out, env))})
        if self.weight is not None:
            vals.update(tensor_values("w", self.weight, env, addr))
        grid = check_grid((ne[1], ne[2], ne[3]), "norm")
        return [Launch(self.spec, grid, (row_threads(ne[0]), 1, 1), 0, self.spec.pack(vals))]


# rope -------------------------------------------------------------------------------------------
class RopeStep(Step):
    """rope of one tensor, or of two sharing positions and parameters (Q and K) in one launch.
    A part given with a store, (views, set_rows), writes its rotated rows straight into the
    cache (the set_rows of K, fused: the rope result is only ever read through that store)."""

    def __init__(self, parts: list[tuple[Tensor, tuple[list[Tensor], Tensor] | None]]):
        nodes, reads, writes, pvariants = [], [], [], []
        fields = [("pos", "ptr"), ("nbp0", "i64"), ("ne0", "i64"), ("ne2", "i64"), ("ne3", "i64"),
                  ("n_dims", "i64")]
        fields += [(k, "f64") for k in ("freq_base", "freq_scale", "ext_factor", "attn_factor",
                                        "corr_low", "corr_high")]
        first = parts[0][0]
        has_ff = len(first.src) > 2
        if has_ff:
            fields += [("ff", "ptr"), ("nbf0", "i64")]
        for i, (node, store) in enumerate(parts):
            q = f"q{i}_"
            nodes += [node] + (store[0] + [store[1]] if store is not None else [])
            reads += list(node.src) + ([store[1].src[2]] if store is not None else [])
            writes.append(store[1] if store is not None else node)
            fields += [(q + "s", "ptr"), (q + "d", "ptr"), (q + "ne1", "i64")]
            fields += [(f"{q}nbs{j}", "i64") for j in range(4)] + [(f"{q}nbd{j}", "i64") for j in range(4)]
            part = dict(src=sfx(node.src[0].type), scatter=store is not None, dtype="f32", itype="none")
            if store is not None:
                fields += [(q + "idx", "ptr"), (q + "nbi0", "i64"), (q + "nbr", "i64")]
                part.update(dtype=sfx(store[1].type), itype=sfx(store[1].src[2].type))
            pvariants.append(part)
        super().__init__(nodes, reads=reads, writes=writes)
        self.parts = parts
        mode = int(first.params["mode"])
        # multi-section modes only: the variants (and kernel names) of modes 0 and 2 stay as they were
        multi = dict(sections=tuple(first.params["sections"])) if is_multi(mode) else {}
        self.spec = KernelSpec.make("rope", fields, mode=mode, has_ff=has_ff,
                                    parts=tuple(tuple(sorted(v.items())) for v in pvariants), **multi)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        first = self.parts[0][0]
        p = first.params
        pos = first.src[1]
        ne = ne_of(first.src[0], env)
        low = high = 0.0
        if p["ext_factor"] != 0.0:
            low, high = yarn_corr_dims(p["n_dims"], p["n_ctx_orig"], p["freq_base"], p["beta_fast"], p["beta_slow"])
        vals = {"pos": addr(pos), "nbp0": ev(pos.nb[0], env), "ne0": ne[0], "ne2": ne[2], "ne3": ne[3],
                "n_dims": p["n_dims"], "freq_base": p["freq_base"], "freq_scale": p["freq_scale"],
                "ext_factor": p["ext_factor"], "attn_factor": p["attn_factor"],
                "corr_low": low, "corr_high": high}
        if len(first.src) > 2:
            vals.update(ff=addr(first.src[2]), nbf0=ev(first.src[2].nb[0], env))
        heads = 0
        for i, (node, store) in enumerate(self.parts):
            q = f"q{i}_"
            a = node.src[0]
            ane = ne_of(a, env)
            heads += ane[1]
            vals.update({q + "s": addr(a), q + "ne1": ane[1]})
            vals.update({f"{q}nbs{j}": v for j, v in enumerate(nb_of(a, env))})
            if store is None:
                vals[q + "d"] = addr(node)
                vals.update({f"{q}nbd{j}": v for j, v in enumerate(nb_of(node, env))})
            else:  # element (i0, i1) of token i2 at i0 * esz + i1 * ne0 * esz of cache row idx[i2]
                sr = store[1]
                idx = sr.src[2]
                cnb = nb_of(sr, env)
                vals.update({q + "d": addr(sr), q + "nbd0": cnb[0], q + "nbd1": ane[0] * cnb[0], q + "nbd2": 0,
                             q + "nbd3": 0, q + "nbr": cnb[1], q + "idx": addr(idx), q + "nbi0": ev(idx.nb[0], env)})
        grid = check_grid((heads, ne[2], ne[3]), "rope")
        return [Launch(self.spec, grid, (row_threads(ne[0] // 2, 128), 1, 1), 0, self.spec.pack(vals))]


# softmax ----------------------------------------------------------------------------------------
def alibi_params(n_head: int, max_bias: float) -> tuple[float, float, int]:
    """ggml's ALiBi constants m0, m1, n_head_log2 (see ggmlpy.ir.ops.softmax.alibi_slopes)."""
    n_head_log2 = 1 << int(math.floor(math.log2(max(n_head, 1))))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    return m0, m1, n_head_log2


class SoftmaxStep(Step):
    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        mask = node.src[1] if len(node.src) > 1 else None
        fields = [("s", "ptr"), ("d", "ptr"), ("m", "ptr"), ("k", "ptr")] + [(f"ne{i}", "i64") for i in range(4)]
        fields += [(f"nbs{i}", "i64") for i in range(4)] + [(f"nbd{i}", "i64") for i in range(4)]
        fields += [(f"mnb{i}", "i64") for i in range(4)] + [("mne2", "i64"), ("mne3", "i64")]
        fields += [("scale", "f64"), ("m0", "f64"), ("m1", "f64"), ("n_head_log2", "i64")]
        self.spec = KernelSpec.make("softmax", fields, src=sfx(node.src[0].type),
                                    mask=sfx(mask.type) if mask is not None else "none",
                                    alibi=node.params.get("max_bias", 0.0) > 0.0, sinks=len(node.src) > 2)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        a = node.src[0]
        ne = ne_of(a, env)
        m0, m1, nhl = alibi_params(ne[2], node.params.get("max_bias", 0.0))
        vals = {"s": addr(a), "d": addr(node), "scale": node.params["scale"], "m0": m0, "m1": m1,
                "n_head_log2": nhl, "m": 0, "mne2": 1, "mne3": 1, **{f"mnb{i}": 0 for i in range(4)},
                "k": addr(node.src[2]) if len(node.src) > 2 else 0}   # the attention sinks
        if len(node.src) > 1:
            mask = node.src[1]
            vals["m"] = addr(mask)
            mne = ne_of(mask, env)
            vals.update(mne2=mne[2], mne3=mne[3])
            vals.update({f"mnb{i}": v for i, v in enumerate(nb_of(mask, env))})
        vals.update({f"ne{i}": v for i, v in enumerate(ne)})
        vals.update({f"nbs{i}": v for i, v in enumerate(nb_of(a, env))})
        vals.update({f"nbd{i}": v for i, v in enumerate(nb_of(node, env))})
        grid = check_grid((ne[1], ne[2], ne[3]), "soft_max")
        return [Launch(self.spec, grid, (row_threads(ne[0]), 1, 1), 0, self.spec.pack(vals))]


# get_rows / set_rows ----------------------------------------------------------------------------
class GetRowsStep(Step):
    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        table, idx = node.src
        self.quant = is_quantized(table.type)
        fields = [("a", "ptr"), ("i", "ptr"), ("d", "ptr")] + [(f"ne{i}", "i64") for i in range(4)]
        fields += [(f"anb{i}", "i64") for i in range(4)] + [("ane2", "i64"), ("ane3", "i64")]
        fields += [(f"inb{i}", "i64") for i in range(3)] + [(f"dnb{i}", "i64") for i in range(4)]
        self.spec = KernelSpec.make("get_rows", fields, cooperative=False, ttype=sfx(table.type),
                                    itype=sfx(idx.type), otype=sfx(node.type), quant=self.quant)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        table, idx = node.src
        ne = ne_of(node, env)
        tne = ne_of(table, env)
        vals = {"a": addr(table), "i": addr(idx), "d": addr(node), "ane2": tne[2], "ane3": tne[3]}
        vals.update({f"ne{i}": v for i, v in enumerate(ne)})
        vals.update({f"anb{i}": v for i, v in enumerate(nb_of(table, env))})
        vals.update({f"inb{i}": v for i, v in enumerate(nb_of(idx, env)[:3])})
        vals.update({f"dnb{i}": v for i, v in enumerate(nb_of(node, env))})
        per_row = ne[0] // 8 if self.quant else ne[0]
        grid = check_grid((ne[1], ne[2], ne[3]), "get_rows")
        return [Launch(self.spec, grid, (row_threads(per_row, 128), 1, 1), 0, self.spec.pack(vals))]


class SetRowsStep(Step):
    def __init__(self, node: Tensor):
        dst, src, idx = node.src
        super().__init__([node], reads=[src, idx], writes=[node])
        self.node = node
        fields = [("s", "ptr"), ("i", "ptr"), ("d", "ptr")] + [(f"ne{i}", "i64") for i in range(4)]
        fields += [(f"snb{i}", "i64") for i in range(4)] + [("ine1", "i64"), ("ine2", "i64")]
        fields += [(f"inb{i}", "i64") for i in range(3)] + [("dne2", "i64"), ("dne3", "i64")]
        fields += [(f"dnb{i}", "i64") for i in range(4)]
        self.quant = dst.type in KV_QUANT_TYPES   # one thread per block, quantising it
        self.spec = KernelSpec.make("set_rows", fields, cooperative=False, stype=sfx(src.type),
                                    itype=sfx(idx.type), dtype=sfx(dst.type), quant=self.quant)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        dst, src, idx = node.src
        ne = ne_of(src, env)
        ine, dne = ne_of(idx, env), ne_of(node, env)
        vals = {"s": addr(src), "i": addr(idx), "d": addr(node), "ine1": ine[1], "ine2": ine[2],
                "dne2": dne[2], "dne3": dne[3]}
        vals.update({f"ne{i}": v for i, v in enumerate(ne)})
        vals.update({f"snb{i}": v for i, v in enumerate(nb_of(src, env))})
        vals.update({f"inb{i}": v for i, v in enumerate(nb_of(idx, env)[:3])})
        vals.update({f"dnb{i}": v for i, v in enumerate(nb_of(node, env))})
        n = (ne[0] // 32 if self.quant else ne[0]) * ne[1] * ne[2] * ne[3]
        return [Launch(self.spec, (grid_stride_blocks(n), 1, 1), (256, 1, 1), 0, self.spec.pack(vals))]


# registrations ----------------------------------------------------------------------------------
def _float_src(node: Tensor) -> bool:
    return node.src[0].type in FLOAT_TYPES


@lowering("rms_norm", "norm", supports=_float_src)
def _norm(node: Tensor, opts) -> Step:
    return NormStep(node)


def _rope_ok(node: Tensor) -> bool:
    srcs = node.src
    return srcs[0].type in FLOAT_TYPES and srcs[1].type == GGMLType.I32 and \
        (len(srcs) < 3 or srcs[2].type == GGMLType.F32) and \
        node.params["mode"] in (ROPE_TYPE_NORM, ROPE_TYPE_NEOX) + ROPE_MULTI_MODES


@lowering("rope", supports=_rope_ok)
def _rope(node: Tensor, opts) -> Step:
    return RopeStep([(node, None)])


def _softmax_ok(node: Tensor) -> bool:
    srcs = node.src
    return srcs[0].type in FLOAT_TYPES and (len(srcs) < 2 or srcs[1].type in (GGMLType.F32, GGMLType.F16))


@lowering("soft_max", supports=_softmax_ok)
def _softmax(node: Tensor, opts) -> Step:
    return SoftmaxStep(node)


def _get_rows_ok(node: Tensor) -> bool:
    table, idx = node.src
    return (table.type in DQ8_TYPES or table.type == GGMLType.I32) and idx.type in INDEX_TYPES


@lowering("get_rows", supports=_get_rows_ok)
def _get_rows(node: Tensor, opts) -> Step:
    return GetRowsStep(node)


def _set_rows_ok(node: Tensor) -> bool:
    """Float destinations, and the quantised KV cache types with rows of whole blocks."""
    dst, src, idx = node.src
    if dst.type in KV_QUANT_TYPES:
        return (src.type in FLOAT_TYPES and idx.type in INDEX_TYPES and node.nb[0] == type_size(dst.type)
                and isinstance(src.ne[0], int) and src.ne[0] % 32 == 0)
    return dst.type in FLOAT_TYPES and src.type in FLOAT_TYPES and idx.type in INDEX_TYPES


@lowering("set_rows", supports=_set_rows_ok)
def _set_rows(node: Tensor, opts) -> Step:
    return SetRowsStep(node)


def supports_simple(node: Tensor) -> bool:
    """Whether a lowering registered for node's op (elementwise and the ops above) takes it;
    backend.py asks this, mul_mat separately."""
    return supports(node)
