"""GLM-4.5 as Hugging Face's Glm4MoeForCausalLM computes it: attention with q/k/v biases
(attention_bias), RoPE (rotate_half) on the first partial_rotary_factor of each head, the MLP
after post_attention_layernorm; the first first_k_dense_replace layers a dense SwiGLU MLP, the
others Glm4MoeMoE: router scores sigmoid(h @ W_router), the top num_experts_per_tok chosen by
scores + e_score_correction_bias (one group), their unbiased scores as weights (divided by
their sum with norm_topk_prob), times routed_scaling_factor, plus the shared experts' SwiGLU.
Other gating functions (llama.cpp's expert_gating_func: softmax, sqrt(softplus)) replace the
sigmoid where a file asks for them."""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, heads_with_rope, rms_norm, silu,
)

GATINGS = {1: lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum(), 2: lambda x: 1.0 / (1.0 + np.exp(-x)),
           4: lambda x: np.sqrt(np.log1p(np.exp(x)))}


def config(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def _experts(c: GGUFContents, w: dict, p: str, h: np.ndarray, use_bias: bool) -> np.ndarray:
    gating = GATINGS[c.key("expert_gating_func", 2)]
    scale = c.key("expert_weights_scale", 0.0) or 1.0
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        scores = gating(w[p + "ffn_gate_inp.weight"] @ h[t])
        choice = scores + (w[p + "exp_probs_b.bias"] if use_bias else 0.0)
        chosen = sorted(range(len(scores)), key=lambda e: (-choice[e], e))[:c.key("expert_used_count")]
        weights = scores[chosen]
        if c.key("expert_weights_norm", False):
            weights = weights / weights.sum()
        for e, wt in zip(chosen, weights * scale):
            gate, up, down = (w[p + f"ffn_{n}_exps.weight"][e] for n in ("gate", "up", "down"))
            out[t] += wt * (down @ (silu(gate @ h[t]) * (up @ h[t])))
    return out


def forward(c: GGUFContents, cfg: Config, tokens: list[int], use_selection_bias: bool = True) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q, k, v = heads_with_rope(*((h @ w[p + f"attn_{n}.weight"].T + w[p + f"attn_{n}.bias"]) for n in "qkv"),
                                  pos, cfg)
        x = x + attention(q, k, v, cfg) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" not in w:   # the leading dense layers
            x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            continue
        shared = (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
            @ w[p + "ffn_down_shexp.weight"].T
        x = x + _experts(c, w, p, h, use_selection_bias) + shared
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
