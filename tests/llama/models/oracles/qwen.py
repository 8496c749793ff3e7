"""Qwen 2 and Qwen 3 as Hugging Face's Qwen2ForCausalLM / Qwen3ForCausalLM compute them.

Both: pre-norm blocks, RMSNorm, rotate_half RoPE (no Q/K permutation in the GGUF), GQA,
SwiGLU MLP, tied embeddings when the file has no output matrix.
Qwen 2: the Q, K and V projections have biases (`attn_q.bias` ...), the output has none.
Qwen 3: no biases; Q and K are RMS-normalised per head (q_norm, k_norm over head_dim)
before RoPE, and head_dim is its own setting.
Qwen 3 MoE (Qwen3MoeSparseMoeBlock): the MLP is a softmax router over the experts, the top
`num_experts_per_tok` of them run (their probabilities renormalised to sum 1,
norm_topk_prob) and their SwiGLU outputs are summed, weighted.
Qwen 2 MoE (Qwen2MoeSparseMoeBlock): the same without the renormalisation, plus a shared
expert's SwiGLU output times sigmoid(shared_expert_gate(h)).
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import (
    Config, GGUFContents, attention, base_config, moe_mlp, rms_norm, rope, silu, split_heads,
)


def config(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def _linear(w: dict, name: str, x: np.ndarray, use_bias: bool) -> np.ndarray:
    y = x @ w[name + ".weight"].T
    if use_bias and name + ".bias" in w:
        y = y + w[name + ".bias"]
    return y


def forward(c: GGUFContents, cfg: Config, tokens: list[int], use_bias: bool = True,
            use_qk_norm: bool = True, norm_topk: bool = True, use_shared_expert: bool = True) -> np.ndarray:
    """use_bias / use_qk_norm / norm_topk / use_shared_expert = False leave those parts out
    (negative controls in tests)."""
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = split_heads(_linear(w, p + "attn_q", h, use_bias), cfg.num_heads, cfg.head_dim)
        k = split_heads(_linear(w, p + "attn_k", h, use_bias), cfg.num_kv_heads, cfg.head_dim)
        v = split_heads(_linear(w, p + "attn_v", h, use_bias), cfg.num_kv_heads, cfg.head_dim)
        if use_qk_norm and p + "attn_q_norm.weight" in w:  # Qwen 3
            q = rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        q = rope(q, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        k = rope(k, pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
        x = x + attention(q, k, v, cfg) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" in w:   # Qwen 3 MoE, Qwen 2 MoE
            x = x + moe_mlp(w, p, h, c.key("expert_used_count"), norm_topk and c.arch == "qwen3moe")
            if use_shared_expert and p + "ffn_gate_inp_shexp.weight" in w:
                shared = (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                    @ w[p + "ffn_down_shexp.weight"].T
                x = x + shared / (1.0 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp.weight"])))[:, None]
            continue
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
