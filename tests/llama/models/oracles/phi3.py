"""Phi-3 as Hugging Face's Phi3ForCausalLM computes it.

qkv_proj is one matrix: its output splits into Q (num_heads * head_dim), K and V
(num_kv_heads * head_dim each). gate_up_proj likewise: the first half is the gate,
the second the up projection, and the MLP is down(up * silu(gate)). (A file with separate
attn_q/k/v matrices is the same model with qkv_proj cut in three.) RoPE is rotate_half
over the first `partial_rotary_factor * head_dim` dimensions of each head (the GGUF's
rope.dimension_count); the remaining dimensions pass through unchanged.
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, rms_norm, rope, silu, split_heads,
)


def config(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def qkv_proj(w: dict, p: str) -> np.ndarray:
    if p + "attn_qkv.weight" in w:
        return w[p + "attn_qkv.weight"]
    return np.concatenate([w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]])


def forward(c: GGUFContents, cfg: Config, tokens: list[int]) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    n_q, n_kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        qkv = h @ qkv_proj(w, p).T
        q = split_heads(qkv[:, :n_q], cfg.num_heads, cfg.head_dim)
        k = split_heads(qkv[:, n_q:n_q + n_kv], cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(qkv[:, n_q + n_kv:], cfg.num_kv_heads, cfg.head_dim)
        q = rope(q, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        k = rope(k, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        x = x + attention(q, k, v, cfg) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        gate, up = np.split(h @ w[p + "ffn_up.weight"].T, 2, axis=-1)
        x = x + (up * silu(gate)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
