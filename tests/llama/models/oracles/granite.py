"""Granite and Granite MoE as Hugging Face's GraniteForCausalLM / GraniteMoeSharedForCausalLM
compute them: LLaMA's blocks (the GGUF's Q and K rows permuted for adjacent-pair RoPE, undone
here as for LLaMA) with four multipliers: the embeddings times `embedding_multiplier`, the
attention scores times `attention_multiplier` (instead of 1/sqrt(head_dim)), each block's
output times `residual_multiplier`, the logits divided by `logits_scaling`. Granite MoE's
router (GraniteMoeTopKGating) takes the top-k logits and softmaxes over them, which is the
full softmax renormalised over the chosen; a shared SwiGLU expert is added where the file has one.
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, moe_mlp, rms_norm, rope, silu, split_heads,
)
from tests.llama.models.oracles.llama import unpermute


def config(c: GGUFContents) -> Config:
    cfg = base_config(c, query_scale=c.key("attention.scale") or None)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def forward(c: GGUFContents, cfg: Config, tokens: list[int], use_multipliers: bool = True) -> np.ndarray:
    w = c.tensors
    residual = (c.key("residual_scale", 0.0) or 1.0) if use_multipliers else 1.0
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens] * ((c.key("embedding_scale", 0.0) or 1.0) if use_multipliers else 1.0)
    has_rope = c.key("rope.scaling.finetuned", True)
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = split_heads(h @ unpermute(w[p + "attn_q.weight"], cfg.num_heads).T, cfg.num_heads, cfg.head_dim)
        k = split_heads(h @ unpermute(w[p + "attn_k.weight"], cfg.num_kv_heads).T, cfg.num_kv_heads, cfg.head_dim)
        if not has_rope:   # no RoPE: the permutation of Q and K rows cancels out in q . k
            q = split_heads(h @ w[p + "attn_q.weight"].T, cfg.num_heads, cfg.head_dim)
            k = split_heads(h @ w[p + "attn_k.weight"].T, cfg.num_kv_heads, cfg.head_dim)
        else:
            q = rope(q, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
            k = rope(k, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        v = split_heads(h @ w[p + "attn_v.weight"].T, cfg.num_kv_heads, cfg.head_dim)
        x = x + residual * (attention(q, k, v, cfg) @ w[p + "attn_output.weight"].T)
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" in w:
            out = moe_mlp(w, p, h, c.key("expert_used_count"), True)
            if p + "ffn_up_shexp.weight" in w:
                out = out + (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                    @ w[p + "ffn_down_shexp.weight"].T
        else:
            out = (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        x = x + residual * out
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    return logits / (c.key("logit_scale") if use_multipliers else 1.0)
