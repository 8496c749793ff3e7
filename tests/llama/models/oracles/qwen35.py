"""Qwen3.5 (dense and MoE) and Qwen3-Next as Hugging Face's Qwen3_5 / Qwen3Next modeling
code computes them, token by token in float64.

Layers are Gated DeltaNet (linear attention) except every `full_attention_interval`-th:
- Gated DeltaNet: the mixed Q/K/V channels through a causal depthwise convolution (kernel
  `ssm.conv_kernel`, zero history) and SiLU; Q and K L2-normalised per head; per value head
  a state S [d_k, d_v] updated by the gated delta rule (torch_recurrent_gated_delta_rule):
  S *= exp(g), delta = beta * (v - S^T k), S += k delta^T, o = S^T q / sqrt(d_k), with
  g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b); then RMSNormGated (the
  norm times silu(z)) and out_proj. Value head h reads key head h mod n_k (Qwen3.5) or
  h // (n_v / n_k) (Qwen3-Next's repeat_interleave). Qwen3-Next's GGUF keeps beta/alpha
  (and in older files Q/K/V/z) interleaved per key head, as its in_proj_ba / in_proj_qkvz.
- gated attention: q_proj gives per head the query and an output gate; q/k RMS-normed per
  head, rotated (Qwen3-Next: rotate_half on rotary_dim dims; Qwen3.5: interleaved
  multi-section RoPE, whose pair i takes position component (i mod sum(sections)) of
  ggml's rule: t, h, w cycle where their sections reach, else the fourth component, 0 for
  text), attention times sigmoid(gate), o_proj.
Then post_attention_layernorm and the MLP (SwiGLU; MoE: softmax top-k renormalised plus a
shared expert times sigmoid(shared_expert_gate)).
"""
from __future__ import annotations

import numpy as np

from tests.llama.models.oracles.common import Config, GGUFContents, attention, base_config, moe_mlp, rms_norm, silu


def config(c: GGUFContents) -> Config:
    cfg = base_config(c)
    cfg.sliding_layers = [False] * cfg.num_layers
    return cfg


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(x))


def _l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


def _pair_positions(pos: np.ndarray, n_pairs: int, sections: list[int] | None) -> np.ndarray:
    """[T, n_pairs] the position each rotated pair uses (all = pos without sections)."""
    if not sections:
        return np.repeat(pos[:, None], n_pairs, axis=1).astype(np.float64)
    s0, s1, s2 = sections[:3]
    total = sum(sections)
    out = np.zeros((len(pos), n_pairs))
    for i in range(n_pairs):
        sector = i % total
        in_thw = ((sector % 3 == 0 and sector < 3 * s0) or (sector % 3 == 1 and sector < 3 * s1)
                  or (sector % 3 == 2 and sector < 3 * s2))
        out[:, i] = pos if in_thw else 0.0   # text: t = h = w = pos, the fourth component 0
    return out


def _rope(x: np.ndarray, pos: np.ndarray, cfg: Config, sections: list[int] | None) -> np.ndarray:
    d = cfg.rotary_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
    ang = (_pair_positions(pos, d // 2, sections) * inv_freq[None, :])[:, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2, rest = x[..., : d // 2], x[..., d // 2: d], x[..., d:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def _causal_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, C], w [C, K]: out[t, c] = sum_j w[c, j] x[t - K + 1 + j, c] (zeros before 0)."""
    k = w.shape[1]
    padded = np.concatenate([np.zeros((k - 1, x.shape[1])), x])
    return sum(padded[j: j + x.shape[0]] * w[:, j] for j in range(k))


def _projections(c: GGUFContents, w: dict, p: str, h: np.ndarray):
    """(mixed q|k|v [T, conv_dim], z [T, n_v * d_v], b [T, n_v], a [T, n_v])."""
    n_k, n_v, d_k = c.key("ssm.group_count"), c.key("ssm.time_step_rank"), c.key("ssm.state_size")
    d_v = c.key("ssm.inner_size") // n_v
    t, r = h.shape[0], n_v // n_k
    if p + "attn_qkv.weight" in w:
        qkv, z = h @ w[p + "attn_qkv.weight"].T, h @ w[p + "attn_gate.weight"].T
    else:   # Qwen3-Next's in_proj_qkvz: per key head [q | k | v (r heads) | z (r heads)]
        m = (h @ w[p + "ssm_in.weight"].T).reshape(t, n_k, 2 * d_k + 2 * r * d_v)
        q, k = m[..., :d_k], m[..., d_k: 2 * d_k]
        v, z = m[..., 2 * d_k: 2 * d_k + r * d_v], m[..., 2 * d_k + r * d_v:]
        qkv = np.concatenate([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], axis=1)
        z = z.reshape(t, -1)
    if p + "ssm_ba.weight" in w:    # in_proj_ba: per key head [b (r heads) | a (r heads)]
        ba = (h @ w[p + "ssm_ba.weight"].T).reshape(t, n_k, 2 * r)
        return qkv, z, ba[..., :r].reshape(t, n_v), ba[..., r:].reshape(t, n_v)
    return qkv, z, h @ w[p + "ssm_beta.weight"].T, h @ w[p + "ssm_alpha.weight"].T


def _gated_delta_net(c: GGUFContents, cfg: Config, w: dict, p: str, h: np.ndarray, interleave: bool,
                     use_decay: bool) -> np.ndarray:
    n_k, n_v, d_k = c.key("ssm.group_count"), c.key("ssm.time_step_rank"), c.key("ssm.state_size")
    d_v = c.key("ssm.inner_size") // n_v
    t = h.shape[0]
    qkv, z, b, a = _projections(c, w, p, h)
    mixed = silu(_causal_conv(qkv, w[p + "ssm_conv1d.weight"]))
    q = _l2norm(mixed[:, : n_k * d_k].reshape(t, n_k, d_k), cfg.rms_eps)
    k = _l2norm(mixed[:, n_k * d_k: 2 * n_k * d_k].reshape(t, n_k, d_k), cfg.rms_eps)
    v = mixed[:, 2 * n_k * d_k:].reshape(t, n_v, d_v)
    g = w[p + "ssm_a"] * _softplus(a + w[p + "ssm_dt.bias"])          # [T, n_v]
    if not use_decay:
        g = np.zeros_like(g)
    beta = _sigmoid(b)
    out = np.zeros((t, n_v, d_v))
    for head in range(n_v):
        kh = head // (n_v // n_k) if interleave else head % n_k
        s = np.zeros((d_k, d_v))
        for i in range(t):
            s = s * np.exp(g[i, head])
            delta = (v[i, head] - s.T @ k[i, kh]) * beta[i, head]
            s = s + np.outer(k[i, kh], delta)
            out[i, head] = s.T @ q[i, kh] / np.sqrt(d_k)
    normed = rms_norm(out, w[p + "ssm_norm.weight"], cfg.rms_eps) * silu(z.reshape(t, n_v, d_v))
    return normed.reshape(t, -1) @ w[p + "ssm_out.weight"].T


def _gated_attention(c: GGUFContents, cfg: Config, w: dict, p: str, h: np.ndarray, use_attn_gate: bool) -> np.ndarray:
    t, hd = h.shape[0], cfg.head_dim
    qg = (h @ w[p + "attn_q.weight"].T).reshape(t, cfg.num_heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    q = rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)
    k = rms_norm((h @ w[p + "attn_k.weight"].T).reshape(t, cfg.num_kv_heads, hd), w[p + "attn_k_norm.weight"],
                 cfg.rms_eps)
    v = (h @ w[p + "attn_v.weight"].T).reshape(t, cfg.num_kv_heads, hd)
    sections = c.key("rope.dimension_sections")
    pos = np.arange(t)
    q, k = _rope(q, pos, cfg, sections), _rope(k, pos, cfg, sections)
    out = attention(q, k, v, cfg)
    if use_attn_gate:
        out = out * _sigmoid(gate.reshape(t, -1))
    return out @ w[p + "attn_output.weight"].T


def forward(c: GGUFContents, cfg: Config, tokens: list[int], interleave: bool | None = None,
            use_decay: bool = True, use_attn_gate: bool = True, use_shared_expert: bool = True) -> np.ndarray:
    """interleave: how value heads share key heads (None: the architecture's way);
    use_decay / use_attn_gate / use_shared_expert = False leave those parts out (negative
    controls in tests)."""
    w = c.tensors
    if interleave is None:
        interleave = c.arch == "qwen3next"
    interval = c.key("full_attention_interval", 4)
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        if (il + 1) % interval:
            x = x + _gated_delta_net(c, cfg, w, p, h, interleave, use_decay)
        else:
            x = x + _gated_attention(c, cfg, w, p, h, use_attn_gate)
        h = rms_norm(x, w[p + "post_attention_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" in w:
            x = x + moe_mlp(w, p, h, c.key("expert_used_count"), True)
            if use_shared_expert:
                shared = (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                    @ w[p + "ffn_down_shexp.weight"].T
                x = x + shared * _sigmoid(h @ w[p + "ffn_gate_inp_shexp.weight"])[:, None]
            continue
        x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
