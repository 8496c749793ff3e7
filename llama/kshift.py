"""The K-shift graph: after seq_add/seq_div moved positions, cached keys (already rotated)
are rotated again by each cell's position delta, in place (llama.cpp's build_graph_shift)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.ir import GGMLType, GraphBuilder
from llama.graph import BuiltGraph, KVLayout
from llama.graph_inputs import GraphParams

if TYPE_CHECKING:
    from llama.model import Model


def build_k_shift(model: "Model", kv: KVLayout) -> BuiltGraph:
    hp = model.hparams
    b = GraphBuilder()
    shift = b.input("inp_k_shift", GGMLType.I32, (kv.kv_size,))
    # the separate sliding-window cache (iSWA) has its own cells, so its own shifts
    shift_swa = b.input("inp_k_shift_swa", GGMLType.I32, (kv.kv_size_swa,)) if kv.kv_size_swa else None
    outs = []
    for il in range(hp.n_layer):
        hk, n_head_kv = hp.n_embd_head_k, hp.n_head_kv[il]
        size = kv.size_of(hp, il)
        cache_k = b.cache(f"cache_k_l{il}", kv.type_k, (hp.n_embd_k_gqa(il), size))
        k = b.view(cache_k, (hk, n_head_kv, size), (cache_k.nb[0] * hk, cache_k.nb[1]))
        base = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope_freq_base
        scale = hp.rope_freq_scale_swa if hp.is_swa(il) else hp.rope_freq_scale
        delta = shift_swa if kv.separate_swa(hp, il) else shift
        rotated = b.rope_ext(k, delta, None, hp.n_rot, hp.rope_type, hp.n_ctx_orig_yarn, base, scale)
        outs.append(b.name(b.cpy(rotated, k), "k_shifted", il))
    graph = b.build(outs)
    return BuiltGraph(graph, outs[-1], [], GraphParams("kshift", False, kv.kv_size))
