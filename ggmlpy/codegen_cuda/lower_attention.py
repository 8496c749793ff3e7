"""Attention as one kernel: the chain llama's graph builds without flash attention,

    kq = mul_mat(K, Q) -> soft_max(kq, mask, scale) -> kqv = mul_mat(V, ...) [-> permute -> cont]

computed per (query token, head) with the scores in shared memory and written directly in
the layout of the final `cont`. K and V are any f16/f32 views (the KV cache read through
strided, permuted views); heads share K/V heads by ggml's broadcast rule (h / ratio). A
quantised KV cache (llama/kv_attention.py) gives quantised K rows, and for a quantised V
kqv = out_prod(V, transpose(...)) over V's rows; the kernel decodes both an element at a time
(_kv_quant.cu.j2) and, against a quantised K, rounds q to 8-bit blocks first, as ggml's flash
attention converts Q to K's vec_dot_type.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lower_simple import alibi_params
from ggmlpy.codegen_cuda.steps import (
    KV_QUANT_TYPES, Addr, Env, Launch, LoweringError, Step, check_grid, ev, nb_of, ne_of, sfx, static_int,
)
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, block_size, type_size

THREADS = 256        # per block; the step's few_blocks_threads when the grid is small (decode)
FEW_BLOCKS_THREADS = 1024  # the default of that (Options.cuda_attn_threads, GGMLPY_CUDA_ATTN_THREADS)
FEW_BLOCKS = 264     # about two blocks per multiprocessor of an H100/H200
MAX_DPL = 8          # output dims per lane: head sizes up to 256
DEFAULT_SMEM = 48 * 1024


@dataclass
class OutProjection:
    """The attention's output only feeds add(mul_mat(wo, .), residual), for one token: the
    kernel computes the projection and the add too (attention.cu.j2, `oproj`)."""

    mm: Tensor
    add: Tensor

    @property
    def wo(self) -> Tensor:
        return self.mm.src[0]

    @property
    def residual(self) -> Tensor:
        return self.add.src[1] if self.add.src[0] is self.mm else self.add.src[0]


class AttentionStep(Step):
    def __init__(self, kq: Tensor, sm: Tensor, kqv: Tensor, perm: Tensor | None = None,
                 cont: Tensor | None = None, oproj: OutProjection | None = None,
                 few_blocks_threads: int = FEW_BLOCKS_THREADS, weights_view: Tensor | None = None):
        """few_blocks_threads: threads per block when the grid is small (decode), the
        backend's Options.cuda_attn_threads (a knob for comparisons). weights_view: the
        transposed weights an out_prod kqv reads (a quantised V cache, V read by rows)."""
        k, q = kq.src
        v = kqv.src[0]
        self.v_rows = kqv.op == "out_prod"   # V [hv, n_kv, heads]: each key's values along dim 0
        mask = sm.src[1] if len(sm.src) > 1 else None
        self.sinks = sm.src[2] if len(sm.src) > 2 else None
        out = cont if cont is not None else kqv
        nodes = [kq, sm, *([weights_view] if weights_view is not None else []), kqv]
        nodes += [perm, cont] if cont is not None else []
        reads = [q, k, v] + ([mask] if mask is not None else []) + ([self.sinks] if self.sinks is not None else [])
        if oproj is not None:
            nodes += [oproj.mm, oproj.add]
            reads += [oproj.wo, oproj.residual]
            out = oproj.add
        super().__init__(nodes, reads=reads, writes=[out])
        self.oproj = oproj
        self.few_blocks_threads = few_blocks_threads
        self.max_threads = max(THREADS, few_blocks_threads)  # the most threads a launch may have
        self.q, self.k, self.v, self.mask, self.sm, self.kqv, self.perm, self.out = q, k, v, mask, sm, kqv, perm, out
        hk, hv = static_int(q.ne[0]), static_int(v.ne[0] if self.v_rows else v.ne[1])
        assert hk is not None and hv is not None
        self.hk, self.hv = hk, hv
        # the cache length's symbol (n_kv or n_kv_swa); with `count_at` holding a device
        # address for it, the kernel reads the length there instead of from its parameters
        self.count_symbol = _symbol_name(k.ne[1])
        self.count_at: int = 0
        fields = [(n, "ptr") for n in ("q", "k", "v", "m", "o", "n_kv_dev", "sk")]
        fields += [(n, "i64") for n in ("n_kv", "hv", "rk", "rv", "mne2", "n_head_log2")]
        fields += [(f"qnb{i}", "i64") for i in range(3)] + [(f"knb{i}", "i64") for i in range(3)]
        fields += [(f"vnb{i}", "i64") for i in range(3)] + [(f"mnb{i}", "i64") for i in range(3)]
        fields += [(f"onb{i}", "i64") for i in range(3)] + [("scale", "f64"), ("m0", "f64"), ("m1", "f64")]
        self.scratch_bytes = 0  # device memory of its own (oproj: a row per head, a counter)
        self.scratch_at = 0
        if oproj is not None:
            fields += [("wo", "ptr"), ("wonb1", "i64"), ("wo_m", "i64"), ("res", "ptr"), ("rnb0", "i64"),
                       ("od", "ptr"), ("dnb0", "i64"), ("scr", "ptr"), ("cnt", "ptr")]
            self.scratch_bytes = 4 * static_int(q.ne[2]) * static_int(oproj.wo.ne[1]) + 256
        self.spec = KernelSpec.make(
            "attention", fields, hk=hk, dpl=-(-hv // 32), ktype=sfx(k.type), vtype=sfx(v.type),
            kquant=k.type in KV_QUANT_TYPES, vquant=v.type in KV_QUANT_TYPES,
            mask=sfx(mask.type) if mask is not None else "none",
            alibi=sm.params.get("max_bias", 0.0) > 0.0, kvec=_k_vectorisable(k, hk), sinks=self.sinks is not None,
            **_oproj_variant(oproj, hv))

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def out_strides(self, env: Env) -> list[int]:
        """Byte strides of kqv's dims (d, t, h) in the memory the step writes."""
        if self.perm is None:
            return nb_of(self.kqv, env)[:3]
        pne = ne_of(self.perm, env)
        lin = [4]
        for i in range(3):
            lin.append(lin[-1] * pne[i])
        axes = self.perm.params["axes"]
        return [lin[axes[i]] for i in range(3)]

    def smem_bytes(self, env: Env, threads: int) -> int:
        n_kv = ev(self.k.ne[1], env)
        return 4 * (self.hk + (threads // 32) * self.hv + n_kv)

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        q, k, v, mask = self.q, self.k, self.v, self.mask
        qne, kne, vne = ne_of(q, env), ne_of(k, env), ne_of(v, env)
        n_tokens, n_head = qne[1], qne[2]
        m0, m1, nhl = alibi_params(n_head, self.sm.params.get("max_bias", 0.0))
        vals = {"q": addr(q), "k": addr(k), "v": addr(v), "o": addr(self.out), "m": 0, "n_kv_dev": self.count_at,
                "n_kv": kne[1], "hv": self.hv, "rk": n_head // kne[2], "rv": n_head // vne[2],
                "mne2": 1, "n_head_log2": nhl, "scale": self.sm.params["scale"], "m0": m0, "m1": m1,
                "sk": addr(self.sinks) if self.sinks is not None else 0}
        for prefix, t in (("q", q), ("k", k), ("v", v)):
            vals.update({f"{prefix}nb{i}": x for i, x in enumerate(nb_of(t, env)[:3])})
        if self.v_rows:   # the template's V element (j, d) at j * vnb0 + d * vnb1 (d: blocks when quantised)
            vals["vnb0"], vals["vnb1"] = vals["vnb1"], vals["vnb0"]
        vals.update({f"mnb{i}": 0 for i in range(3)})
        if mask is not None:
            vals["m"] = addr(mask)
            vals["mne2"] = ev(mask.ne[2], env)
            vals.update({f"mnb{i}": x for i, x in enumerate(nb_of(mask, env)[:3])})
        vals.update({f"onb{i}": x for i, x in enumerate(self.out_strides(env))})
        if self.oproj is not None:
            if n_tokens != 1:
                raise LoweringError(f"attention with its output projection runs one token, not {n_tokens}")
            wo, add = self.oproj.wo, self.oproj.add
            counter = self.scratch_at + self.scratch_bytes - 256
            vals.update({"o": 0, "wo": addr(wo), "wonb1": ev(wo.nb[1], env), "wo_m": ev(wo.ne[1], env),
                         "res": addr(self.oproj.residual), "rnb0": ev(self.oproj.residual.nb[0], env),
                         "od": addr(add), "dnb0": ev(add.nb[0], env), "scr": self.scratch_at, "cnt": counter})
        grid = check_grid((n_tokens, n_head, 1), "attention")
        threads = self.few_blocks_threads if n_tokens * n_head < FEW_BLOCKS else THREADS
        return [Launch(self.spec, grid, (threads, 1, 1), self.smem_bytes(env, threads), self.spec.pack(vals))]


def _symbol_name(d) -> str | None:
    """The name of the symbol d is (n_kv), when it is exactly one symbol; else None."""
    if isinstance(d, SymExpr) and len(d.terms) == 1:
        ((mono, coef),) = d.terms.items()
        if coef == 1 and len(mono) == 1:
            return mono[0]
    return None


def _oproj_variant(oproj: OutProjection | None, hv: int) -> dict:
    """The template's choices for the output projection: Wo's decoder (dq8_<type>), the head
    size, and Wo's block size and bytes (for the prefetch)."""
    if oproj is None:
        return dict(oproj="none", ohv=0, obs=1, ots=1)
    t = oproj.wo.type
    return dict(oproj=sfx(t), ohv=hv, obs=block_size(t), ots=type_size(t))


def _k_vectorisable(k: Tensor, hk: int) -> bool:
    """16-byte loads of K rows: f16, contiguous rows, every row start 16-byte aligned."""
    if k.type != GGMLType.F16 or k.nb[0] != 2 or hk % 8:
        return False
    statics = [k.nb[1], k.nb[2], k.view_offs]
    return all(isinstance(x, int) and x % 16 == 0 for x in statics)
