"""Tiny Gemma 4 files: the layer and global writers `models_archs` uses for "gemma4".

GEMMA4_DENSE is shaped like E2B: six layers, windows on all but layers 3 and 5, global
layers with twice the head size, one KV head and "proportional" RoPE (rope_freqs leaves 24
of their 32 dim pairs unrotated), the last two layers reading the cache of layers 2 and 3,
per-layer embeddings 32 wide, the shared layers' FFN twice as wide. GEMMA4_MOE is shaped
like 26B-A4B: no shared cache and no per-layer embeddings, a dense FFN beside four experts
whose gate and up rows are stacked in one tensor, with a scale per expert. Both have an
output projection of their own (the released files tie it; untied, greedy tokens vary), omit
attn_v on the global layers (they use K as V), scale each layer's output and soft-cap the
logits. With `fused_qkv=True` a layer's Q, K and V are one attn_qkv.weight instead.
"""
from __future__ import annotations

from typing import Any

import numpy as np

SWA_PATTERN = [True, True, True, False, True, False]
GEMMA4_DENSE: dict[str, Any] = dict(
    n_layer=6, fused_qkv=False, head_dim=64, n_swa=4, rope_base=1e6, final_softcap=10.0,
    extra_keys={"attention.sliding_window_pattern": SWA_PATTERN, "attention.key_length_swa": 32,
                "attention.value_length_swa": 32, "rope.dimension_count_swa": 32, "rope.freq_base_swa": 1e4,
                "attention.head_count_kv": [2, 2, 2, 1, 2, 1], "attention.shared_kv_layers": 2,
                "embedding_length_per_layer_input": 32, "feed_forward_length": [96, 96, 96, 96, 192, 192]})
GEMMA4_MOE: dict[str, Any] = dict(
    n_layer=4, fused_qkv=False, head_dim=64, n_swa=4, rope_base=1e6, final_softcap=10.0,
    n_expert=4, n_expert_used=2, n_ff_exp=32,
    extra_keys={"attention.sliding_window_pattern": [True, True, False, True], "attention.key_length_swa": 32,
                "attention.value_length_swa": 32, "rope.dimension_count_swa": 32, "rope.freq_base_swa": 1e4,
                "attention.head_count_kv": [2, 2, 1, 2], "embedding_length_per_layer_input": 0})
ROTATED_PAIRS = 8   # of the global layers' head_dim / 2 pairs; the rest get factor 1e30


def gemma4_globals(t: Any) -> None:
    """rope_freqs and, where the file has them, the per-layer embedding tensors."""
    c, k = t.cfg, t.cfg.extra_keys
    half = c.head // 2
    t.add("rope_freqs.weight", np.array([1.0] * ROTATED_PAIRS + [1e30] * (half - ROTATED_PAIRS), np.float32))
    n_pl = k["embedding_length_per_layer_input"]
    if n_pl:
        wide = n_pl * c.n_layer
        t.add("per_layer_token_embd.weight", t.rng.standard_normal((c.n_vocab, wide)).astype(np.float32))
        t.mat("per_layer_model_proj.weight", c.n_embd, wide)
        t.norm("per_layer_proj_norm.weight", n_pl)


def gemma4_layer(t: Any, p: str) -> None:
    c, k = t.cfg, t.cfg.extra_keys
    il = int(p.split(".")[1])
    swa = k["attention.sliding_window_pattern"][il]
    head = k["attention.key_length_swa"] if swa else c.head
    n_kv = k["attention.head_count_kv"][il]
    n_ff = k["feed_forward_length"][il] if "feed_forward_length" in k else c.n_ff
    t.norm(p + "attn_norm.weight", c.n_embd)
    if c.fused_qkv:   # rows [Q | K | V], V on every layer
        t.mat(p + "attn_qkv.weight", c.n_embd, head * (c.n_head + 2 * n_kv))
    else:
        t.mat(p + "attn_q.weight", c.n_embd, head * c.n_head)
        t.mat(p + "attn_k.weight", c.n_embd, head * n_kv)
        if swa:
            t.mat(p + "attn_v.weight", c.n_embd, head * n_kv)
    t.mat(p + "attn_output.weight", head * c.n_head, c.n_embd)
    t.norm(p + "attn_q_norm.weight", head)
    t.norm(p + "attn_k_norm.weight", head)
    t.norm(p + "post_attention_norm.weight", c.n_embd)
    t.add(p + "layer_output_scale.weight", np.array([0.5 + t.rng.random()], np.float32))
    t.norm(p + "ffn_norm.weight", c.n_embd)
    t.mat(p + "ffn_gate.weight", c.n_embd, n_ff)
    t.mat(p + "ffn_up.weight", c.n_embd, n_ff)
    t.mat(p + "ffn_down.weight", n_ff, c.n_embd)
    t.norm(p + "post_ffw_norm.weight", c.n_embd)
    if c.n_expert:
        t.mat(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert)
        t.norm(p + "ffn_gate_inp.scale", c.n_embd)
        t.experts(p + "ffn_gate_up_exps.weight", c.n_embd, 2 * c.n_ff_exp)
        t.experts(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd)
        t.norm(p + "ffn_down_exps.scale", c.n_expert)
        for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            t.norm(p + name + ".weight", c.n_embd)
    n_pl = k["embedding_length_per_layer_input"]
    if n_pl:
        t.mat(p + "inp_gate.weight", c.n_embd, n_pl)
        t.mat(p + "proj.weight", n_pl, c.n_embd)
        t.norm(p + "post_norm.weight", c.n_embd)
