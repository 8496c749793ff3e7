"""The K-shift graph: after seq_add/seq_div moved positions, cached keys (already rotated)
are rotated again by each cell's position delta, in place (llama.cpp's build_graph_shift).

The second rotation must use the forward graph's own RoPE: the same per-layer base and
scale (`hp.rope_args(il)`), attention factor and frequency factors. Anything else leaves
the shifted keys at angles a fresh decode at the new positions would never have produced.

A quantised K cache is decoded to f32 first and quantised again after (llama.cpp's
build_rope_shift: ggml_cast, rope, ggml_cpy), with its Hadamard rotation undone before the
RoPE and redone after it (llama/kv_types.py); the rows then carry a second rounding.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.ir import GGMLType
from ggmlpy.ir.types import is_quantized, row_size
from llama.graph import BuiltGraph, KVLayout, LlmGraph
from llama.graph_inputs import GraphParams
from llama.kv_attention import ROT_NAMES, rotate
from llama.weights import WeightRef

if TYPE_CHECKING:
    from llama.model import Model


def rope_factors(model: "Model", kv: KVLayout) -> WeightRef | None:
    """The frequency factors the forward graph rotates with (llama_model::get_rope_factors):
    llama 3's `rope_freqs`, else LongRoPE's long factors when the cache is longer than the
    original training context (as llama/models/phi3.py decides), else its short ones; None
    for files with neither."""
    w = model.w
    if getattr(w, "rope_freqs", None) is not None:
        return w.rope_freqs
    long = getattr(w, "rope_long", None)
    if long is not None and kv.kv_size > model.hparams.n_ctx_orig_yarn:
        return long
    return getattr(w, "rope_short", None)


def build_k_shift(model: "Model", kv: KVLayout) -> BuiltGraph:
    hp = model.hparams
    g = LlmGraph(model, kv, GraphParams("kshift", False, kv.kv_size))
    b = g.b
    shift = b.input("inp_k_shift", GGMLType.I32, (kv.kv_size,))
    # the separate sliding-window cache (iSWA) has its own cells, so its own shifts
    shift_swa = b.input("inp_k_shift_swa", GGMLType.I32, (kv.kv_size_swa,)) if kv.kv_size_swa else None
    # a weight leaf like the model graphs' (g.w): the context binds it to the loaded tensor
    factors = g.w(rope_factors(model, kv))
    rot = b.input(ROT_NAMES[0], GGMLType.F32, (kv.rot_k, kv.rot_k)) if kv.rot_k else None
    outs = []
    for il in range(hp.n_layer):
        if not hp.has_kv(il):   # reads an earlier layer's cache, shifted there
            continue
        hk, n_head_kv = hp.head_k(il), hp.n_head_kv[il]
        size = kv.size_of(hp, il)
        cache_k = b.cache(f"cache_k_l{il}", kv.type_k, (hp.n_embd_k_gqa(il), size))
        # the rotated dims of each head: from rope_k_offset on (MLA keys end with them)
        offset = hp.rope_k_offset(il)
        k = b.view(cache_k, (hk - offset, n_head_kv, size), (row_size(kv.type_k, hk), cache_k.nb[1]),
                   row_size(kv.type_k, offset))
        delta = shift_swa if kv.separate_swa(hp, il) else shift
        # a quantised K: decoded, its Hadamard rotation undone, RoPE, rotated and quantised again
        cur = b.cont(k) if is_quantized(kv.type_k) else k
        if rot is not None:
            cur = rotate(b, cur, rot)
        rotated = b.rope_ext(cur, delta, factors if hp.uses_rope_freqs(il) else None, **hp.rope_args(il))
        if rot is not None:
            rotated = rotate(b, rotated, rot)
        outs.append(b.name(b.cpy(rotated, k), "k_shifted", il))
    graph = b.build(outs)
    return BuiltGraph(graph, outs[-1], [], g.params)
