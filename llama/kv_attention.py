"""The attention over the KV cache (llama.cpp's build_attn with its cache): store this ubatch's
K and V rows, attend over the n_kv cells read back through views of the cache.

The chain is llama.cpp's without flash attention, which every backend runs and fuses (the
CPU's mul_mat_soft_max, the CUDA attention kernel):

    kq = mul_mat(K, Q) -> soft_max(kq, mask, scale) -> mul_mat(V^T, .) -> permute -> cont

The cache's type (llama/kv_types.py) changes three things. Its views are strided by the
type's row size, so a quantised K is read a block row at a time (mul_mat's quantised src0, as
ggml reads it without flash attention). A quantised V cannot be read transposed (its values
lie in blocks along the head), so the weights times V is out_prod(V, transpose(weights)),
which reads V by rows as ggml's flash attention does (ggmlpy/ir/ops/out_prod.py). And where
llama.cpp rotates a quantised cache (kv_types.rotation_sizes), Q and K (V, and the output
back) are multiplied by the Hadamard matrix, an input of the graph (`inp_k_rot`,
`inp_v_rot`), as llama_mul_mat_hadamard does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ggmlpy.ir import N_KV, N_TOKENS, GGMLType, GraphBuilder, Tensor
from ggmlpy.ir.symbolic import N_KV_SWA, Dim
from ggmlpy.ir.types import is_quantized, row_size
from llama.graph_inputs import GraphInput, InputBuffers, fill_input
from llama.kv_types import hadamard

if TYPE_CHECKING:
    from llama.graph import AttnInput, KVLayout, LlmGraph
    from llama.weights import WeightRef

ROT_NAMES = ("inp_k_rot", "inp_v_rot")


def rotation_inputs(kv: "KVLayout", bufs: InputBuffers | None = None) -> dict[str, np.ndarray]:
    """The Hadamard matrices of the layout's rotations, by leaf name (none without)."""
    out = {}
    for name, n in zip(ROT_NAMES, (kv.rot_k, kv.rot_v)):
        if n:
            out[name] = fill_input(bufs, name, np.float32, hadamard(n))
    return out


@dataclass
class InpKVRot(GraphInput):
    """The rotation matrices (llama.cpp's attn_inp_k_rot / attn_inp_v_rot): the same every ubatch."""

    kv: "KVLayout"

    @property
    def names(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(name for name, n in zip(ROT_NAMES, (self.kv.rot_k, self.kv.rot_v)) if n)

    def set_input(self, ub, state, bufs=None):
        return rotation_inputs(self.kv, bufs)


def rotation_leaves(g: "LlmGraph") -> tuple[Tensor | None, Tensor | None]:
    """The graph's K and V rotation inputs (made once per graph), None where not rotated."""
    kv, leaves = g.kv, g._leaves
    if not (kv.rot_k or kv.rot_v):
        return None, None
    if ROT_NAMES[0] not in leaves and ROT_NAMES[1] not in leaves:
        g.inputs.append(InpKVRot(kv))
        for name, n in zip(ROT_NAMES, (kv.rot_k, kv.rot_v)):
            if n:
                leaves[name] = g.b.input(name, GGMLType.F32, (n, n))
    return leaves.get(ROT_NAMES[0]), leaves.get(ROT_NAMES[1])


def rotate(b: GraphBuilder, t: Tensor, rot: Tensor) -> Tensor:
    """t with each run of rot.ne[0] values along ne[0] multiplied by the Hadamard matrix rot
    (symmetric: mul_mat(rot, x) = rot x), in t's shape (llama_mul_mat_hadamard)."""
    n = rot.ne[0]
    x = t if t.is_contiguous else b.cont(t)
    rows = b.reshape(x, n, t.ne[0] // n, t.ne[1], t.ne[2])
    return b.reshape(b.mul_mat(rot, rows), *t.ne[:3])


def build_kv_attn(g: "LlmGraph", inp: "AttnInput", q_cur: Tensor, k_cur: Tensor | None, v_cur: Tensor | None,
                  kq_scale: float, il: int, softcap: float = 0.0,
                  sinks: "WeightRef | None" = None, v_mla: "WeightRef | None" = None) -> Tensor:
    """The heads' outputs [head_v * n_head, n_tokens] (`kqv_out`) of layer il: LlmGraph.build_attn
    without the output projection. q_cur [head_dim, n_head, n_tokens]; k_cur, v_cur
    [head_dim, n_head_kv, n_tokens], or None in a layer without a cache of its own, which
    attends over the cache layer hp.kv_layer(il) stored earlier in this graph (Gemma 4's
    shared KV layers). The cached views depend on the set_rows results, so the store always
    precedes the read. A layer of the separate SWA cache (iSWA) uses that cache's size,
    indices and n_kv. With MLA (hp.is_mla) only K is cached and V is the first head_v values
    of its rows; `v_mla` then decompresses each head's output (llama.cpp's v_mla)."""
    b, hp, kv = g.b, g.hp, g.kv
    hk, hv, n_head_kv = hp.head_k(il), hp.head_v(il), hp.n_head_kv[il]
    src = hp.kv_layer(il)
    swa_cache = kv.separate_swa(hp, src)
    k_idxs, n_kv = (inp.k_idxs_swa, N_KV_SWA) if swa_cache else (inp.k_idxs, N_KV)
    rot_k, rot_v = rotation_leaves(g)
    if rot_k is not None:
        q_cur = rotate(b, q_cur, rot_k)
    if k_cur is None or v_cur is None:
        if src == il or src not in g.kv_stored:
            raise ValueError(f"{hp.arch} layer {il}: no K/V given and no earlier layer's cache to read")
        k_all, v_all = g.kv_stored[src]
    else:
        k_all, v_all = _store_kv(g, k_cur, v_cur, k_idxs, rot_k, rot_v, il)
    mask = inp.mask_swa if (inp.mask_swa is not None and hp.is_swa(il)) else inp.mask
    return attend_cache(g, q_cur, k_all, v_all, CacheHeads(hk, hv, n_head_kv, hp.n_head[il], n_kv), mask,
                        kq_scale, il, softcap=softcap, sinks=sinks, rot_v=rot_v, v_mla=v_mla)


@dataclass(frozen=True)
class CacheHeads:
    """How a layer's query heads read a cache layer: head sizes, K/V heads, query heads
    and the symbol of the cells attended (n_kv, or n_kv_swa for the separate SWA cache)."""

    hk: int
    hv: int
    n_head_kv: int
    n_head: int
    n_kv: Dim


def attend_cache(g: "LlmGraph", q_cur: Tensor, k_all: Tensor, v_all: Tensor, heads: CacheHeads, mask: Tensor,
                 kq_scale: float, il: int, softcap: float = 0.0, sinks: "WeightRef | None" = None,
                 rot_v: Tensor | None = None, v_mla: "WeightRef | None" = None) -> Tensor:
    """softmax(K^T Q * scale + mask) V over the cells of the cache layers k_all and v_all:
    the heads' outputs [hv * n_head, n_tokens] (with `v_mla` [hv, hv_mla, n_head], each
    head's output times its matrix: [hv_mla * n_head, n_tokens]). q_cur is already rotated
    where the cache is (rotation_leaves); the output is rotated back with rot_v."""
    b, kv = g.b, g.kv
    hk, hv, n_head_kv, n_kv = heads.hk, heads.hv, heads.n_head_kv, heads.n_kv
    k = b.view(k_all, (hk, n_head_kv, n_kv), (row_size(kv.type_k, hk), k_all.nb[1]))
    v = b.view(v_all, (hv, n_head_kv, n_kv), (row_size(kv.type_v, hv), v_all.nb[1]))
    q = b.permute(q_cur, 0, 2, 1, 3)                           # [hk, n_tokens, n_head]
    k = b.permute(k, 0, 2, 1, 3)                               # [hk, n_kv, n_head_kv]
    kq = g.cb(b.mul_mat(k, q), "kq", il)                       # [n_kv, n_tokens, n_head]
    if softcap:
        kq = b.scale(b.tanh(b.scale(kq, kq_scale / softcap)), softcap)
        kq_scale = 1.0
    kq = g.cb(b.soft_max_ext(kq, mask, kq_scale, 0.0, sinks=g.w(sinks)), "kq_soft_max", il)
    if is_quantized(kv.type_v):   # V's rows, one per key, weighted: [hv, n_tokens, n_head]
        kqv = b.out_prod(b.permute(v, 0, 2, 1, 3), b.transpose(kq))
    else:
        kqv = b.mul_mat(b.permute(v, 1, 2, 0, 3), kq)          # [hv, n_tokens, n_head]
    if v_mla is not None:
        kqv = g.cb(b.mul_mat(g.w(v_mla), kqv), "kqv_mla", il)  # [hv_mla, n_tokens, n_head]
    cur = b.permute(kqv, 0, 2, 1, 3)                           # [hv, n_head, n_tokens]
    cur = b.cont(cur, kqv.ne[0] * heads.n_head, N_TOKENS)
    if rot_v is not None:
        cur = rotate(b, cur, rot_v)
    return g.cb(cur, "kqv_out", il)


def _store_kv(g: "LlmGraph", k_cur: Tensor, v_cur: Tensor, k_idxs: Tensor, rot_k: Tensor | None,
              rot_v: Tensor | None, il: int) -> tuple[Tensor, Tensor]:
    """Write this ubatch's K and V rows into layer il's cache; the results (the whole caches
    after the write) are what the attention reads, here and in layers that share them. With
    MLA only K is written, and read as V too."""
    b, hp, kv = g.b, g.hp, g.kv
    if rot_k is not None:
        k_cur = rotate(b, k_cur, rot_k)
    if rot_v is not None:
        v_cur = rotate(b, v_cur, rot_v)
    size = kv.size_of(hp, il)
    cache_k = b.cache(f"cache_k_l{il}", kv.type_k, (hp.n_embd_k_gqa(il), size))
    if hp.is_mla:
        k_rows = b.reshape(k_cur, hp.n_embd_k_gqa(il), N_TOKENS)
        k_stored = g.cb(b.set_rows(cache_k, k_rows, k_idxs), "k_stored", il)
        g.kv_stored[il] = (k_stored, k_stored)
        return k_stored, k_stored
    cache_v = b.cache(f"cache_v_l{il}", kv.type_v, (hp.n_embd_v_gqa(il), size))
    k_rows = b.reshape(k_cur, hp.n_embd_k_gqa(il), N_TOKENS)
    v_rows = b.reshape(v_cur, hp.n_embd_v_gqa(il), N_TOKENS)
    stored = (g.cb(b.set_rows(cache_k, k_rows, k_idxs), "k_stored", il),
              g.cb(b.set_rows(cache_v, v_rows, k_idxs), "v_stored", il))
    g.kv_stored[il] = stored
    return stored
