"""Gemma 4 (text) as Hugging Face's modeling code describes it, token-parallel in float64.

- embeddings times sqrt(hidden_size); RMS norms multiply by their weight as stored (Gemma 4's
  converter writes w itself, not 1 + w);
- layer_types: sliding layers see the last `sliding_window` positions, with their own head
  size and RoPE base; full layers use "proportional" RoPE, here the file's frequency factors
  dividing each pair's frequency (a huge factor leaves a pair unrotated);
- q_norm and k_norm per head with weights, v_norm without; attention scaling 1.0; a layer
  without v_proj uses its key projection as value;
- the last num_kv_shared_layers layers reuse the keys and values of the last earlier layer
  of their type;
- per-layer inputs: embed_tokens_per_layer(ids) * sqrt(d_pl) plus the RMS-normed projection
  of the scaled embeddings (times hidden_size ** -0.5), the sum times 2 ** -0.5; each layer
  adds post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(x)) * its
  input));
- the MoE variant runs the dense MLP and the experts side by side: the router scores
  rms_norm(x) * scale * hidden_size ** -0.5, the top-k softmax probabilities are
  renormalised and multiplied by each expert's per_expert_scale;
- each layer's output times layer_scalar; the final logits soft-capped.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tests.llama.models.oracles.common import Config, GGUFContents, attention, base_config, gelu_tanh, rms_norm


def config(c: GGUFContents) -> Config:
    cfg = base_config(c, sliding_window=c.key("attention.sliding_window"),
                      rope_local_theta=c.key("rope.freq_base_swa", 10000.0),
                      final_softcap=c.key("final_logit_softcapping", 0.0), query_scale=1.0)
    cfg.sliding_layers = [bool(x) for x in c.key("attention.sliding_window_pattern")]
    return cfg


def _rope(x: np.ndarray, pos: np.ndarray, theta: float, factors: np.ndarray | None) -> np.ndarray:
    """rotate_half RoPE over the whole head, pair i's frequency theta^(-2i/d) / factors[i]."""
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2) / d)
    if factors is not None:
        inv_freq = inv_freq / factors
    ang = pos[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _per_layer_inputs(c: GGUFContents, cfg: Config, tokens: list[int], x: np.ndarray) -> np.ndarray | None:
    w, n_pl = c.tensors, c.key("embedding_length_per_layer_input", 0)
    if not n_pl:
        return None
    t, n_layer = len(tokens), cfg.num_layers
    emb = w["per_layer_token_embd.weight"][tokens].reshape(t, n_layer, n_pl) * np.sqrt(n_pl)
    proj = (x @ w["per_layer_model_proj.weight"].T).reshape(t, n_layer, n_pl) * cfg.hidden_size ** -0.5
    proj = rms_norm(proj, w["per_layer_proj_norm.weight"], cfg.rms_eps)
    return (proj + emb) * 2 ** -0.5


def _moe(c: GGUFContents, cfg: Config, p: str, x: np.ndarray) -> np.ndarray:
    w, top_k = c.tensors, c.key("expert_used_count")
    router_in = rms_norm(x, 1.0, cfg.rms_eps) * w[p + "ffn_gate_inp.scale"] * cfg.hidden_size ** -0.5
    h = rms_norm(x, w[p + "pre_ffw_norm_2.weight"], cfg.rms_eps)
    gate_up, down = w[p + "ffn_gate_up_exps.weight"], w[p + "ffn_down_exps.weight"]
    n_ff = gate_up.shape[1] // 2
    scale = w[p + "ffn_down_exps.scale"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        logits = w[p + "ffn_gate_inp.weight"] @ router_in[t]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:top_k]
        weights = probs[chosen] / probs[chosen].sum()
        for e, wt in zip(chosen, weights):
            gu = gate_up[e] @ h[t]
            out[t] += wt * scale[e] * (down[e] @ (gelu_tanh(gu[:n_ff]) * gu[n_ff:]))
    return rms_norm(out, w[p + "post_ffw_norm_2.weight"], cfg.rms_eps)


def forward(c: GGUFContents, cfg: Config, tokens: list[int], share_kv: bool = True,
            use_per_layer: bool = True, use_factors: bool = True) -> np.ndarray:
    """The switches turn features off for the negative controls: the shared KV layers then
    use their own keys, no per-layer inputs, RoPE without the frequency factors."""
    w = c.tensors
    pos = np.arange(len(tokens), dtype=np.float64)
    x = w["token_embd.weight"][tokens] * np.sqrt(cfg.hidden_size)
    per_layer = _per_layer_inputs(c, cfg, tokens, x) if use_per_layer else None
    kv_heads = c.key("attention.head_count_kv")
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * cfg.num_layers
    first_shared = cfg.num_layers - (c.key("attention.shared_kv_layers", 0) if share_kv else 0)
    kv_of_type: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
    for il in range(cfg.num_layers):
        p, sliding = f"blk.{il}.", cfg.sliding_layers[il]
        head = c.key("attention.key_length_swa") if sliding else cfg.head_dim
        lcfg = dataclasses.replace(cfg, head_dim=head, num_kv_heads=kv_heads[il])
        theta = cfg.rope_local_theta if sliding else cfg.rope_theta
        factors = None if sliding or not use_factors else w["rope_freqs.weight"]
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(len(tokens), cfg.num_heads, head)
        q = _rope(rms_norm(q, w[p + "attn_q_norm.weight"], cfg.rms_eps), pos, theta, factors)
        if il < first_shared:
            k_proj = (h @ w[p + "attn_k.weight"].T).reshape(len(tokens), kv_heads[il], head)
            v_proj = ((h @ w[p + "attn_v.weight"].T).reshape(len(tokens), kv_heads[il], head)
                      if p + "attn_v.weight" in w else k_proj)
            k = _rope(rms_norm(k_proj, w[p + "attn_k_norm.weight"], cfg.rms_eps), pos, theta, factors)
            kv_of_type[sliding] = (k, rms_norm(v_proj, 1.0, cfg.rms_eps))
        k, v = kv_of_type[sliding]
        attn = attention(q, k, v, lcfg, cfg.sliding_window if sliding else 0) @ w[p + "attn_output.weight"].T
        x = x + rms_norm(attn, w[p + "post_attention_norm.weight"], cfg.rms_eps)

        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        mlp = (gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        if p + "ffn_gate_inp.weight" in w:
            mlp = rms_norm(mlp, w[p + "post_ffw_norm_1.weight"], cfg.rms_eps) + _moe(c, cfg, p, x)
        x = x + rms_norm(mlp, w[p + "post_ffw_norm.weight"], cfg.rms_eps)

        if per_layer is not None:
            gate = gelu_tanh(x @ w[p + "inp_gate.weight"].T) * per_layer[:, il]
            x = x + rms_norm(gate @ w[p + "proj.weight"].T, w[p + "post_norm.weight"], cfg.rms_eps)
        if p + "layer_output_scale.weight" in w:
            x = x * w[p + "layer_output_scale.weight"]
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    if cfg.final_softcap:
        logits = np.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits
