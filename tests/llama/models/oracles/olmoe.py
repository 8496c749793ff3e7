"""OLMoE as Hugging Face's OlmoeForCausalLM computes it: pre-norm blocks, RMSNorm, Q and K
RMS-normalised over their whole projections (q_norm, k_norm: hidden-size wide, before the
split into heads), rotate_half RoPE, and a sparse MoE MLP: a softmax router, the top
`num_experts_per_tok` experts' SwiGLU outputs weighted by their probabilities, not
renormalised (norm_topk_prob false)."""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, heads_with_rope, moe_mlp, rms_norm,
)


def config(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def forward(c: GGUFContents, cfg: Config, tokens: list[int], use_qk_norm: bool = True) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q, k = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T
        if use_qk_norm:
            q = rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        q, k, v = heads_with_rope(q, k, h @ w[p + "attn_v.weight"].T, pos, cfg)
        x = x + attention(q, k, v, cfg) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        x = x + moe_mlp(w, p, h, c.key("expert_used_count"), False)
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w["output.weight"].T
