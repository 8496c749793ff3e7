"""DeepSeek V2/V3 and the families built on them (Kimi K2, DeepSeek-V2-Lite, GigaChat 3,
Mistral Large 3): llama.cpp's `deepseek2`. Mirrors its src/models/deepseek2.cpp.

Attention is multi-head *latent* attention (MLA): each token's keys and values are
compressed to one `kv_lora_rank` row (`attn_kv_a_mqa`, then `attn_kv_a_norm`) plus a
`rope.dimension_count` part that carries the position (RoPE on its own, shared by the
heads). Queries come from `attn_q` or, through a low rank, `attn_q_a` → `attn_q_a_norm` →
`attn_q_b`; each head's query is [nope | rope].

- Files converted with `key_length_mla`/`value_length_mla` (and `attn_k_b`/`attn_v_b`) run
  the absorbed form: the cache holds the compressed row and the rope part, one "head" of
  kv_lora_rank + n_rot per token, V being its first kv_lora_rank values; each head's
  nope query is multiplied into the compressed space by `attn_k_b`, and each head's output
  is decompressed by `attn_v_b` (the `v_mla` of LlmGraph.build_attn).
- Older files (`attn_kv_b`) decompress K and V per head and attend as usual (every head a KV
  head), with the rope part repeated over the heads.

The scores are scaled by mscale² / sqrt(head size decompressed), mscale being YaRN's
magnitude with DeepSeek's `yarn_log_multiplier` (stored ×0.1 by the converter). Layers after
`leading_dense_block_count` run experts (softmax or sigmoid routing, the V3 selection bias,
grouped routing, weight normalisation and scale) beside `expert_shared_count` shared
experts. Mistral Large 3's attention temperature (`attention.temperature_scale`) scales the
queries per position. The file's last `nextn_predict_layers` blocks (the multi-token-
prediction head) are left unused.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from ggmlpy.ir import N_TOKENS, GGMLType, Tensor
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.graph_inputs import InpAttnTemp
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, load_nextn, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.moe import Gating, build_moe_ffn, read_gating
from llama.weights import Need, TensorTable

GLM47_LITE_VOCAB = 154880   # GLM-4.7-Flash's files carry no gating function: sigmoid


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    require_rms_eps(r, hp)
    load_nextn(r, hp)
    hp.extra["n_layer_dense_lead"] = r.int("leading_dense_block_count", 0)
    hp.n_lora_q = r.int("attention.q_lora_rank", 0)
    hp.n_lora_kv = r.int("attention.kv_lora_rank", required=True)
    hp.n_embd_head_k_mla = r.int("attention.key_length_mla", 0)
    hp.n_embd_head_v_mla = r.int("attention.value_length_mla", 0)
    if bool(hp.n_embd_head_k_mla) != bool(hp.n_embd_head_v_mla):
        raise HParamsError(f"{r.key('attention.key_length_mla')} and {r.key('attention.value_length_mla')} "
                           f"must both be given or both be absent")
    if hp.is_mla and (hp.head_k(0) != hp.n_lora_kv + hp.n_rot or hp.head_v(0) != hp.n_lora_kv
                      or any(n != 1 for n in hp.n_head_kv)):
        raise HParamsError(f"{hp.arch}: an MLA file caches one head of kv_lora_rank + n_rot "
                           f"({hp.n_lora_kv} + {hp.n_rot}); key_length {hp.head_k(0)}, value_length "
                           f"{hp.head_v(0)} and head_count_kv {hp.n_head_kv[0]} say otherwise")
    if head_k_full(hp) <= hp.n_rot:
        raise HParamsError(f"{hp.arch}: the key head ({head_k_full(hp)}) must be wider than its rotated part "
                           f"({hp.n_rot})")
    n_ff_exp = r.per_layer("expert_feed_forward_length", hp.extra["n_layer_all"], required=True)
    load_experts(r, hp)
    hp.n_ff_exp = n_ff_exp[0]
    hp.extra["n_expert_shared"] = r.int("expert_shared_count", required=True)
    hp.extra["expert_weights_norm"] = bool(r.get("expert_weights_norm", False))
    # DeepSeek V2 files have no gating function: softmax, except GLM-4.7-Flash's
    glm47_lite = hp.extra["n_layer_all"] in (47, 48) and hp.n_vocab == GLM47_LITE_VOCAB
    hp.extra["gating"] = read_gating(r, Gating.SIGMOID if glm47_lite else Gating.SOFTMAX)
    if r.has("rope.scaling.yarn_log_multiplier"):   # the converter stores 0.1 x mscale_all_dim
        hp.rope_yarn_log_mul = float(r.get("rope.scaling.yarn_log_multiplier")) / 0.1
        if hp.rope_yarn_log_mul != 1.0:
            hp.rope_yarn_mscale = hp.rope_yarn_log_mul
    hp.extra["attn_temp_scale"] = float(r.get("attention.temperature_scale", 0.0))
    hp.extra["attn_temp_length"] = r.int("attention.temperature_length", 0)
    if hp.extra["attn_temp_scale"] and hp.extra["attn_temp_length"] <= 0:
        raise HParamsError(f"{r.key('attention.temperature_scale')} needs a positive "
                           f"{r.key('attention.temperature_length')}")


def head_k_full(hp: HParams) -> int:
    """A query head's size before absorption: nope + rope (llama.cpp's n_embd_head_k_mla())."""
    return hp.n_embd_head_k_mla or hp.head_k(0)


def head_v_full(hp: HParams) -> int:
    """A head's output size once decompressed (n_embd_head_v_mla())."""
    return hp.n_embd_head_v_mla or hp.head_v(0)


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    n_embd, n_head, n_rot = hp.n_embd, hp.n_head[0], hp.n_rot
    hk, hv, q_rank, kv_rank = head_k_full(hp), head_v_full(hp), hp.n_lora_q, hp.n_lora_kv
    n_ff_shexp = hp.n_ff_exp * hp.extra["n_expert_shared"]
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        if q_rank:
            t.add_layer(il, "attn_q_a_norm", "attn_q_a_norm.weight", (q_rank,))
            t.add_layer(il, "wq_a", "attn_q_a.weight", (n_embd, q_rank))
            t.add_layer(il, "wq_b", "attn_q_b.weight", (q_rank, n_head * hk))
        else:
            t.add_layer(il, "wq", "attn_q.weight", (n_embd, n_head * hk))
        t.add_layer(il, "attn_kv_a_norm", "attn_kv_a_norm.weight", (kv_rank,))
        t.add_layer(il, "wkv_a_mqa", "attn_kv_a_mqa.weight", (n_embd, kv_rank + n_rot))
        if hp.is_mla:
            t.add_layer(il, "wk_b", "attn_k_b.weight", (hk - n_rot, kv_rank, n_head))
            t.add_layer(il, "wv_b", "attn_v_b.weight", (kv_rank, hv, n_head))
        else:
            t.add_layer(il, "wkv_b", "attn_kv_b.weight", (kv_rank, n_head * (hk - n_rot + hv)))
        t.add_layer(il, "wo", "attn_output.weight", (n_head * hv, n_embd))
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        if il < hp.extra["n_layer_dense_lead"]:
            t.add_gated_ffn(il, n_embd, hp.n_ff[il])
            continue
        t.add_moe_ffn(il, n_embd, hp.n_ff_exp, hp.n_expert, probs_bias=Need.OPTIONAL, gate_up=Need.OPTIONAL)
        t.add_shared_experts(il, n_embd, n_ff_shexp)
    t.ignore_nextn(hp)


def kq_scale(hp: HParams) -> float:
    """mscale² / sqrt(query head): YaRN's magnitude scale applied to the scores, not to the
    rotated dims (llama.cpp cancels the attn_factor adjustment of llama_context first)."""
    rope = hp.rope_args(0)
    log_scale = math.log(1.0 / rope["freq_scale"])
    attn_factor_org = rope["attn_factor"] * (1.0 + 0.1 * log_scale)
    mscale = attn_factor_org * (1.0 + 0.1 * hp.rope_yarn_log_mul * log_scale)
    return mscale * mscale / math.sqrt(head_k_full(hp))


def build_query(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, il: int) -> Tensor:
    """The heads' queries [nope + rope, n_head, n_tokens], directly or through the low rank."""
    b, hp = g.b, g.hp
    if hp.n_lora_q:
        q = g.cb(g.build_lora_mm(layer.wq_a, cur), "q", il)
        q = g.cb(g.build_norm(q, layer.attn_q_a_norm, None, NormType.RMS, il), "q", il)
        q = g.build_lora_mm(layer.wq_b, q)
    else:
        q = g.build_lora_mm(layer.wq, cur)
    return g.cb(b.reshape(q, head_k_full(hp), hp.n_head[il], cur.ne[1]), "q", il)


def build_attention(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, pos: Tensor, attn,
                    temp: Tensor | None, il: int) -> Tensor:
    """The layer's attention output [n_embd, n_tokens] (kqv_out through attn_output)."""
    b, hp = g.b, g.hp
    n_head, n_rot, kv_rank, n_tokens = hp.n_head[il], hp.n_rot, hp.n_lora_kv, cur.ne[1]
    nope = head_k_full(hp) - n_rot
    rope = hp.rope_args(il)
    q = build_query(g, layer, cur, il)
    q_nope = b.view(q, (nope, n_head, n_tokens), (q.nb[1], q.nb[2]), 0)
    q_pe = b.view(q, (n_rot, n_head, n_tokens), (q.nb[1], q.nb[2]), q.nb[0] * nope)
    q_pe = g.cb(b.rope_ext(q_pe, pos, None, **rope), "q_pe", il)

    kv_cmpr_pe = g.cb(g.build_lora_mm(layer.wkv_a_mqa, cur), "kv_cmpr_pe", il)   # [kv_rank + n_rot, n_tokens]
    row = kv_cmpr_pe.nb[1]
    kv_cmpr = b.view(kv_cmpr_pe, (kv_rank, n_tokens), (row,), 0)
    k_pe = b.view(kv_cmpr_pe, (n_rot, 1, n_tokens), (row, row), kv_cmpr_pe.nb[0] * kv_rank)
    k_pe = g.cb(b.rope_ext(k_pe, pos, None, **rope), "k_pe", il)
    kv_cmpr = g.cb(g.build_norm(kv_cmpr, layer.attn_kv_a_norm, None, NormType.RMS, il), "kv_cmpr", il)

    if hp.is_mla:
        # each head's nope query in the compressed space: [kv_rank, n_tokens, n_head]
        absorbed = g.cb(b.mul_mat(g.w(layer.wk_b), b.permute(q_nope, 0, 2, 1, 3)), "q_nope_absorbed", il)
        q_cur = g.cb(b.concat(b.permute(absorbed, 0, 2, 1, 3), q_pe, 0), "Qcur", il)
        v_cur = b.reshape(kv_cmpr, kv_rank, 1, n_tokens)   # what K's first kv_rank values hold
        k_cur = g.cb(b.concat(v_cur, k_pe, 0), "Kcur", il)
        v_mla = layer.wv_b
    else:
        hv = head_v_full(hp)
        kv = g.cb(g.build_lora_mm(layer.wkv_b, kv_cmpr), "kv", il)             # [n_head * (nope + hv), n_tokens]
        head_row = kv.nb[0] * (nope + hv)
        k_nope = b.view(kv, (nope, n_head, n_tokens), (head_row, head_row * n_head), 0)
        v_cur = g.cb(b.cont(b.view(kv, (hv, n_head, n_tokens), (head_row, head_row * n_head), kv.nb[0] * nope)),
                     "Vcur", il)
        q_cur = g.cb(b.concat(q_nope, q_pe, 0), "Qcur", il)
        # the rope part, the same for every head: k_pe broadcast over zeros of the heads' shape
        k_pe_heads = b.add(b.scale(q_pe, 0.0), k_pe)
        k_cur = g.cb(b.concat(k_nope, k_pe_heads, 0), "Kcur", il)
        v_mla = None
    if temp is not None:
        q_cur = g.cb(b.mul(q_cur, temp), "Qcur_attn_temp_scaled", il)
    return g.build_attn(attn, layer.wo, None, q_cur, k_cur, v_cur, kq_scale(hp), il, v_mla=v_mla)


def build(g: LlmGraph) -> Tensor:
    hp, m, b = g.hp, g.model, g.b
    inp_l = g.build_inp_embd(m.w.tok_embd)
    temp = None
    if hp.extra["attn_temp_scale"]:
        g.inputs.append(InpAttnTemp(hp.extra["attn_temp_length"], hp.extra["attn_temp_scale"]))
        temp = b.input("inp_attn_scale", GGMLType.F32, (1, 1, N_TOKENS))
    inp = g.build_layer_inputs()
    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        cur = build_attention(g, layer, cur, inp.pos, inp.attn, temp, il)
        cur, inp_sa = g.select_out_rows(cur, inp_l, inp.out_ids, il)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)
        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        if il < hp.extra["n_layer_dense_lead"]:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.SILU, il)
        else:
            routed = build_moe_ffn(g, cur, layer, FfnOp.SILU, hp.extra["expert_weights_norm"], il,
                                   hp.extra["gating"])
            shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                 layer.ffn_down_shexp, None, FfnOp.SILU, il)
            cur = g.cb(b.add(routed, g.cb(shared, "ffn_shexp", il)), "ffn_out", il)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)
    return g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)


register(Architecture("deepseek2", load_hparams, tensors, build))
