"""DeepSeek V2/V3 as Hugging Face's DeepseekV3ForCausalLM computes it, with multi-head latent
attention in its plain (not absorbed) form: per token a compressed K/V row c = norm(x Wkv_a)[:r]
and a shared rope key (the last qk_rope_head_dim values); per head k_nope = c W_k,h and
v = c W_v,h; q from q_b_proj(norm(q_a_proj(x))) (or q_proj); RoPE on the rope dims in the
interleaved layout the checkpoints store (adjacent pairs); scores scaled by
1/sqrt(qk_nope_head_dim + qk_rope_head_dim). The first first_k_dense_replace layers are a
dense SwiGLU MLP, the others the routed experts (glm4moe's router: the file's gating
function, the selection bias where the file has one, normalised and scaled weights) plus the
shared experts. W_k,h and W_v,h come from attn_kv_b (older files) or attn_k_b / attn_v_b.
YaRN, grouped routing and the attention temperature are not modelled here."""
from __future__ import annotations

import dataclasses

import numpy as np

from tests.llama.models.oracles.common import Config, GGUFContents, base_config, rms_norm, rope, silu
from tests.llama.models.oracles.glm4moe import _experts


@dataclasses.dataclass
class DeepseekConfig(Config):
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0


def config(c: GGUFContents) -> DeepseekConfig:
    base = base_config(c)
    mla = c.key("attention.key_length_mla") is not None
    head_k = c.key("attention.key_length_mla") if mla else c.key("attention.key_length")
    head_v = c.key("attention.value_length_mla") if mla else c.key("attention.value_length")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Config)}
    fields.update(head_dim=head_k, rope_style="pairs", sliding_layers=[False] * base.num_layers)
    return DeepseekConfig(**fields, q_lora_rank=c.key("attention.q_lora_rank", 0),
                          kv_lora_rank=c.key("attention.kv_lora_rank"), qk_nope_head_dim=head_k - base.rotary_dim,
                          v_head_dim=head_v)


def _head_projections(w: dict, p: str, cfg: DeepseekConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per head, c -> k_nope [H, r, nope] and c -> v [H, r, v]."""
    h, r, nope, hv = cfg.num_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
    if p + "attn_kv_b.weight" in w:
        kv_b = w[p + "attn_kv_b.weight"].reshape(h, nope + hv, r)    # [out, in] per head
        return kv_b[:, :nope].transpose(0, 2, 1), kv_b[:, nope:].transpose(0, 2, 1)
    return w[p + "attn_k_b.weight"], w[p + "attn_v_b.weight"].transpose(0, 2, 1)


def _attention(w: dict, p: str, x: np.ndarray, pos: np.ndarray, cfg: DeepseekConfig) -> np.ndarray:
    n_tok, h, r, n_rot = x.shape[0], cfg.num_heads, cfg.kv_lora_rank, cfg.rotary_dim
    if cfg.q_lora_rank:
        q = rms_norm(x @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"], cfg.rms_eps)
        q = q @ w[p + "attn_q_b.weight"].T
    else:
        q = x @ w[p + "attn_q.weight"].T
    q = q.reshape(n_tok, h, cfg.head_dim)
    q_nope, q_pe = q[..., :cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim:]
    q_pe = rope(q_pe, pos, cfg.rope_theta, n_rot, cfg.rope_style)
    ckv = x @ w[p + "attn_kv_a_mqa.weight"].T
    c = rms_norm(ckv[:, :r], w[p + "attn_kv_a_norm.weight"], cfg.rms_eps)
    k_pe = rope(ckv[:, None, r:], pos, cfg.rope_theta, n_rot, cfg.rope_style)[:, 0]
    w_k, w_v = _head_projections(w, p, cfg)
    k_nope = np.einsum("tr,hrd->thd", c, w_k)
    v = np.einsum("tr,hrd->thd", c, w_v)
    s = (np.einsum("thd,shd->hts", q_nope, k_nope) + np.einsum("thd,sd->hts", q_pe, k_pe)) * cfg.head_dim ** -0.5
    causal = np.arange(n_tok)[None, :] <= np.arange(n_tok)[:, None]
    s = np.where(causal[None], s, -np.inf)
    probs = np.exp(s - s.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, v).reshape(n_tok, -1)
    return out @ w[p + "attn_output.weight"].T


def forward(c: GGUFContents, cfg: DeepseekConfig, tokens: list[int], use_shared_expert: bool = True) -> np.ndarray:
    w = c.tensors
    pos = np.arange(len(tokens))
    x = w["token_embd.weight"][tokens]
    for il in range(cfg.num_layers):
        p = f"blk.{il}."
        x = x + _attention(w, p, rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_eps), pos, cfg)
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if p + "ffn_gate_inp.weight" not in w:   # the leading dense layers
            x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            continue
        x = x + _experts(c, w, p, h, p + "exp_probs_b.bias" in w)
        if use_shared_expert:
            x = x + (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                @ w[p + "ffn_down_shexp.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg.rms_eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
