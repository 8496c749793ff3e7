"""LLaMA and Mistral as Hugging Face's LlamaForCausalLM / MistralForCausalLM compute them:
pre-norm blocks, RMSNorm, rotate_half RoPE on Q and K, GQA, SwiGLU MLP (Mixtral: a
mixture of experts in its place, the top-k weights renormalised).

llama.cpp's converter permutes the rows of Q and K so that its adjacent-pair RoPE equals
HF's rotate_half; the oracle undoes that permutation (as transformers does when it loads a
llama GGUF) and applies HF's RoPE. Mistral's sliding window covers every layer.
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, moe_mlp, rms_norm, rope, silu, split_heads,
)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of the converter's permute: per head, interleaved rows back to two halves."""
    n_out, n_in = w.shape
    return w.reshape(n_head, n_out // n_head // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def config_llama(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def config_mistral(c: GGUFContents) -> Config:
    cfg = base_config(c, sliding_window=c.key("attention.sliding_window", 0))
    cfg.sliding_layers = [True] * cfg.num_layers
    return cfg


def forward(c: GGUFContents, cfg: Config, tokens: list[int]) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        wq = unpermute(w[p + "attn_q.weight"], cfg.num_heads)
        wk = unpermute(w[p + "attn_k.weight"], cfg.num_kv_heads)
        q = split_heads(h @ wq.T, cfg.num_heads, cfg.head_dim)
        k = split_heads(h @ wk.T, cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(h @ w[p + "attn_v.weight"].T, cfg.num_kv_heads, cfg.head_dim)
        q = rope(q, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        k = rope(k, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        window = cfg.sliding_window if cfg.sliding_layers[il] else 0
        x = x + attention(q, k, v, cfg, window) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" in w:   # Mixtral
            x = x + moe_mlp(w, p, h, c.key("expert_used_count"), True)
            continue
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
