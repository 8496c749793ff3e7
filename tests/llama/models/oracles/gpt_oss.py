"""gpt-oss as Hugging Face's GptOssForCausalLM computes it (modeling_gpt_oss):

- attention with biases on Q, K, V and the output; rotate_half RoPE; every head has a
  learned sink: its logit is appended to each row of scores before the softmax and its
  probability dropped after (eager_attention_forward's `sinks`);
- layer_types alternate "sliding_attention" (even layers, window `sliding_window`) and
  "full_attention";
- the MLP: a biased linear router, the top-k logits softmaxed over themselves
  (GptOssTopKRouter), each chosen expert computing gate = min(gate, limit),
  up = clamp(up, -limit, limit), (up + 1) * gate * sigmoid(alpha * gate) with biases on
  its projections (GptOssExperts: alpha 1.702, limit 7), weighted and summed;
- the MLP's input norm is `post_attention_layernorm` (post_attention_norm in the GGUF).
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import Config, GGUFContents, base_config, heads_with_rope, rms_norm

ALPHA, LIMIT = 1.702, 7.0


def config(c: GGUFContents) -> Config:
    cfg = base_config(c, sliding_window=c.key("attention.sliding_window"))
    cfg.sliding_layers = [il % 2 == 0 for il in range(cfg.num_layers)]
    return cfg


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sinks: np.ndarray | None, cfg: Config,
               window: int) -> np.ndarray:
    k, v = np.repeat(k, cfg.n_rep, axis=1), np.repeat(v, cfg.n_rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * cfg.head_dim ** -0.5
    i, j = np.arange(q.shape[0])[:, None], np.arange(q.shape[0])[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    s = np.where(allowed[None], s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], s.shape[:2] + (1,))], axis=-1)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        p = p[..., :-1]
    return np.einsum("hts,shd->thd", p, v).reshape(q.shape[0], -1)


def _experts(w: dict, p: str, h: np.ndarray, top_k: int) -> np.ndarray:
    gate_w, gate_b = w[p + "ffn_gate_exps.weight"], w[p + "ffn_gate_exps.bias"]
    up_w, up_b = w[p + "ffn_up_exps.weight"], w[p + "ffn_up_exps.bias"]
    down_w, down_b = w[p + "ffn_down_exps.weight"], w[p + "ffn_down_exps.bias"]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        logits = w[p + "ffn_gate_inp.weight"] @ h[t] + w[p + "ffn_gate_inp.bias"]
        chosen = sorted(range(len(logits)), key=lambda e: (-logits[e], e))[:top_k]
        scores = np.exp(logits[chosen] - logits[chosen].max())
        scores /= scores.sum()
        for e, score in zip(chosen, scores):
            gate = np.minimum(gate_w[e] @ h[t] + gate_b[e], LIMIT)
            up = np.clip(up_w[e] @ h[t] + up_b[e], -LIMIT, LIMIT)
            glu = gate / (1.0 + np.exp(-ALPHA * gate))
            out[t] += score * (down_w[e] @ ((up + 1.0) * glu) + down_b[e])
    return out


def forward(c: GGUFContents, cfg: Config, tokens: list[int], use_sinks: bool = True) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q, k, v = heads_with_rope(*((h @ w[p + f"attn_{n}.weight"].T + w[p + f"attn_{n}.bias"]) for n in "qkv"),
                                  pos, cfg)
        window = cfg.sliding_window if cfg.sliding_layers[il] else 0
        attn = _attention(q, k, v, w[p + "attn_sinks.weight"] if use_sinks else None, cfg, window)
        x = x + attn @ w[p + "attn_output.weight"].T + w[p + "attn_output.bias"]
        h = rms_norm(x, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        x = x + _experts(w, p, h, c.key("expert_used_count"))
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w["output.weight"].T
