"""Gemma, Gemma 2 and Gemma 3 (text) as Hugging Face's modeling code computes them.

All three: embeddings times sqrt(hidden_size); GemmaRMSNorm multiplies by (1 + w), where
the HF weight w is the GGUF's minus one (llama.cpp's converter stores 1 + w); rotate_half
RoPE; GELU(tanh)-gated MLP; the output projection is the embedding matrix.
Gemma 2 and 3 add RMS norms after attention and after the MLP (post_attention_layernorm,
post_feedforward_layernorm) and alternate sliding-window and global layers:
- Gemma 2: layer i slides when i is even; scores are soft-capped, tanh(s / c) * c with
  c = attn_logit_softcapping, and so are the logits (final_logit_softcapping);
- Gemma 3: every 6th layer (i % 6 == 5) is global, the others slide and rotate with
  rope_local_base_freq = 10000 (the global ones with rope_theta); Q and K get a per-head
  (1 + w) RMS norm before RoPE.
The query scale is query_pre_attn_scalar ** -0.5, with query_pre_attn_scalar = head_dim
in these files (the 27B models differ).
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, gelu_tanh, rms_norm, rope, split_heads,
)

GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def gemma_norm(x: np.ndarray, gguf_weight: np.ndarray, eps: float) -> np.ndarray:
    hf_weight = gguf_weight - 1.0
    return rms_norm(x, 1.0 + hf_weight, eps)


def config_gemma(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def config_gemma2(c: GGUFContents) -> Config:
    cfg = base_config(c, sliding_window=c.key("attention.sliding_window", 4096),
                      attn_softcap=c.key("attn_logit_softcapping", 50.0),
                      final_softcap=c.key("final_logit_softcapping", 30.0))
    cfg.sliding_layers = [il % 2 == 0 for il in range(cfg.num_layers)]
    return cfg


def config_gemma3(c: GGUFContents) -> Config:
    cfg = base_config(c, sliding_window=c.key("attention.sliding_window", 0),
                      rope_local_theta=GEMMA3_LOCAL_ROPE_THETA)
    cfg.sliding_layers = [(il + 1) % GEMMA3_SLIDING_PATTERN != 0 for il in range(cfg.num_layers)]
    return cfg


def forward(c: GGUFContents, cfg: Config, tokens: list[int]) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens] * np.sqrt(cfg.hidden_size)
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        sliding = cfg.sliding_layers[il]
        theta = cfg.rope_local_theta if (sliding and cfg.rope_local_theta) else cfg.rope_theta
        h = gemma_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = split_heads(h @ w[p + "attn_q.weight"].T, cfg.num_heads, cfg.head_dim)
        k = split_heads(h @ w[p + "attn_k.weight"].T, cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(h @ w[p + "attn_v.weight"].T, cfg.num_kv_heads, cfg.head_dim)
        if p + "attn_q_norm.weight" in w:  # Gemma 3
            q = gemma_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = gemma_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        q = rope(q, pos, theta, cfg.rotary_dim, cfg.rope_style)
        k = rope(k, pos, theta, cfg.rotary_dim, cfg.rope_style)
        attn = attention(q, k, v, cfg, cfg.sliding_window if sliding else 0) @ w[p + "attn_output.weight"].T
        if p + "post_attention_norm.weight" in w:  # Gemma 2 and 3
            attn = gemma_norm(attn, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        x = x + attn
        h = gemma_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        mlp = (gelu_tanh(gate) * up) @ w[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in w:
            mlp = gemma_norm(mlp, w[p + "post_ffw_norm.weight"], cfg.rms_eps)
        x = x + mlp
    x = gemma_norm(x, w["output_norm.weight"], cfg.rms_eps)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    if cfg.final_softcap:
        logits = np.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits
