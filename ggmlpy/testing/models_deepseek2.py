"""Tiny DeepSeek V2/V3 files: the layer writer `models_archs` uses for "deepseek2".

DEEPSEEK2_MLA is shaped like a converted DeepSeek V3 (or Kimi K2): queries through a low rank,
the absorbed MLA tensors attn_k_b/attn_v_b with key_length_mla/value_length_mla, one cached
"head" of kv_lora_rank + n_rot, a dense first layer, then experts with a sigmoid router, the
selection bias, weight normalisation and scale, and one shared expert. DEEPSEEK2_LEGACY is
an older conversion of DeepSeek-V2-Lite: the query without a low rank, attn_kv_b decompressing
K and V per head, a softmax router and no selection bias. DEEPSEEK2_V3 adds grouped routing
and YaRN to the first, DEEPSEEK2_TEMP an attention temperature to the second. `mla_keys` and
`legacy_keys` give the hyperparameters for other sizes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize

KV_RANK, NOPE, ROPE, HEAD_V = 32, 32, 16, 32


def mla_keys(kv_rank: int = KV_RANK, nope: int = NOPE, rope: int = ROPE, head_v: int = HEAD_V,
             q_rank: int = 32) -> dict[str, Any]:
    """The attention keys of an MLA file: one cached head of kv_rank + rope."""
    return {"attention.q_lora_rank": q_rank, "attention.kv_lora_rank": kv_rank,
            "attention.key_length": kv_rank + rope, "attention.value_length": kv_rank,
            "attention.key_length_mla": nope + rope, "attention.value_length_mla": head_v,
            "attention.head_count_kv": 1}


def legacy_keys(kv_rank: int = KV_RANK, nope: int = NOPE, rope: int = ROPE, head_v: int = HEAD_V,
                n_head: int = 4) -> dict[str, Any]:
    """The attention keys of a file from before the MLA split: every head a KV head."""
    return {"attention.q_lora_rank": 0, "attention.kv_lora_rank": kv_rank, "attention.key_length": nope + rope,
            "attention.value_length": head_v, "attention.head_count_kv": n_head}


_MOE_KEYS = {"leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_norm": True,
             "expert_weights_scale": 2.5, "expert_gating_func": 2}
DEEPSEEK2_MLA: dict[str, Any] = dict(
    n_layer=3, n_rot=ROPE, n_expert=8, n_expert_used=2, n_ff_exp=32,
    extra_keys={**mla_keys(), **_MOE_KEYS})
# DeepSeek V3's grouped routing (4 groups of 2 experts, the best 2 groups) and YaRN with its
# yarn_log_multiplier (stored x0.1), at prompt positions past the original context's tenth
DEEPSEEK2_V3: dict[str, Any] = dict(DEEPSEEK2_MLA, extra_keys={
    **DEEPSEEK2_MLA["extra_keys"], "expert_group_count": 4, "expert_group_used_count": 2,
    "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32,
    "rope.scaling.yarn_log_multiplier": 0.0707})
DEEPSEEK2_LEGACY: dict[str, Any] = dict(
    n_layer=3, n_rot=ROPE, n_expert=8, n_expert_used=3, n_ff_exp=32,
    extra_keys={**legacy_keys(), **_MOE_KEYS, "expert_weights_norm": False, "expert_weights_scale": 1.0,
                "expert_gating_func": 1})
# Mistral Large 3's attention temperature, growing every 3 positions (its files: 0.1 and 8192)
DEEPSEEK2_TEMP: dict[str, Any] = dict(DEEPSEEK2_LEGACY, extra_keys={
    **DEEPSEEK2_LEGACY["extra_keys"], "attention.temperature_scale": 0.5, "attention.temperature_length": 3})


def _heads(t: Any, name: str, n_in: int, n_out: int, n_head: int) -> None:
    """A [n_out, n_in] matrix per head, stacked: ggml ne (n_in, n_out, n_head)."""
    data = (t.rng.standard_normal((n_head, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    wtype = t.cfg.weight_type
    if wtype == GGMLType.F32:
        t.add(name, data)
    else:
        rows = quantize(data.reshape(-1, n_in), wtype)
        t.add(name, rows.reshape(n_head, n_out, -1), type=wtype, ne=(n_in, n_out, n_head))


def deepseek2_layer(t: Any, p: str) -> None:
    """One block: MLA (absorbed or legacy, by the keys), then a dense FFN (the leading
    layers) or experts with a shared expert."""
    c, k = t.cfg, t.cfg.extra_keys
    n_embd, n_head, n_rot = c.n_embd, c.n_head, c.n_rot
    # the sizes as the keys give them (a key left out, for a file a test expects refused,
    # keeps the default size)
    q_rank, kv_rank = k.get("attention.q_lora_rank", 0), k.get("attention.kv_lora_rank", KV_RANK)
    mla = "attention.key_length_mla" in k
    head_k = k["attention.key_length_mla" if mla else "attention.key_length"]
    head_v = k.get("attention.value_length_mla" if mla else "attention.value_length", HEAD_V)
    t.norm(p + "attn_norm.weight", n_embd)
    if q_rank:
        t.norm(p + "attn_q_a_norm.weight", q_rank)
        t.mat(p + "attn_q_a.weight", n_embd, q_rank)
        t.mat(p + "attn_q_b.weight", q_rank, n_head * head_k)
    else:
        t.mat(p + "attn_q.weight", n_embd, n_head * head_k)
    t.norm(p + "attn_kv_a_norm.weight", kv_rank)
    t.mat(p + "attn_kv_a_mqa.weight", n_embd, kv_rank + n_rot)
    if mla:
        _heads(t, p + "attn_k_b.weight", head_k - n_rot, kv_rank, n_head)
        _heads(t, p + "attn_v_b.weight", kv_rank, head_v, n_head)
    else:
        t.mat(p + "attn_kv_b.weight", kv_rank, n_head * (head_k - n_rot + head_v))
    t.mat(p + "attn_output.weight", n_head * head_v, n_embd)
    t.norm(p + "ffn_norm.weight", n_embd)
    if int(p.split(".")[1]) < k.get("leading_dense_block_count", 0):
        for name, n_in, n_out in (("gate", n_embd, c.n_ff), ("up", n_embd, c.n_ff), ("down", c.n_ff, n_embd)):
            t.mat(p + f"ffn_{name}.weight", n_in, n_out)
        return
    t.mat(p + "ffn_gate_inp.weight", n_embd, c.n_expert)
    if k.get("expert_gating_func") == 2:   # DeepSeek V3's selection bias goes with its sigmoid router
        t.bias(p + "exp_probs_b.bias", c.n_expert)
    t.experts(p + "ffn_gate_exps.weight", n_embd, c.n_ff_exp)
    t.experts(p + "ffn_up_exps.weight", n_embd, c.n_ff_exp)
    t.experts(p + "ffn_down_exps.weight", c.n_ff_exp, n_embd)
    n_shared = c.n_ff_exp * k["expert_shared_count"]
    t.mat(p + "ffn_gate_shexp.weight", n_embd, n_shared)
    t.mat(p + "ffn_up_shexp.weight", n_embd, n_shared)
    t.mat(p + "ffn_down_shexp.weight", n_shared, n_embd)
