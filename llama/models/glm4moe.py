"""GLM-4.5 and GLM-4.5-Air (glm4moe): attention with optional q/k/v biases and q/k norms,
NeoX RoPE over the first `rope.dimension_count` dims of each head (partial rotary), an RMS
norm before the FFN stored as `post_attention_norm`, and a mixture of experts in every layer
after the first `leading_dense_block_count` (dense SwiGLU ones): a sigmoid router
(`expert_gating_func`, 2 unless the file says otherwise) whose choice is biased by
`exp_probs_b` but whose weights are not, normalised (`expert_weights_norm`) and scaled
(`expert_weights_scale`), plus `expert_shared_count` shared experts every token runs.

The file's last `nextn_predict_layers` blocks are the multi-token-prediction head
(llama.cpp's MTP graph, for speculative decoding): they are not part of the model's graph,
and their tensors are left unused. Mirrors llama.cpp's src/models/glm4-moe.cpp. GLM-4.5V's
multi-section RoPE (`rope.dimension_sections`) is refused.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, load_nextn, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.moe import Gating, build_moe_ffn, read_gating
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    sections = r.get("rope.dimension_sections", None)
    if sections is not None and len(sections) > 1 and sections[0] > 0 and sections[1] > 0:
        raise HParamsError(f"{r.key('rope.dimension_sections')}: multi-section RoPE (GLM-4.5V) is not supported")
    load_nextn(r, hp)
    load_experts(r, hp)
    if not hp.n_ff_exp:
        hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
    if not r.has("expert_shared_count"):
        raise HParamsError(f"required key {r.key('expert_shared_count')} is missing")
    hp.extra["n_expert_shared"] = r.int("expert_shared_count")
    hp.extra["n_layer_dense_lead"] = r.int("leading_dense_block_count", 0)
    hp.extra["expert_weights_norm"] = bool(r.get("expert_weights_norm", False))
    hp.extra["gating"] = read_gating(r, Gating.SIGMOID)


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    n_embd, n_ff_exp = hp.n_embd, hp.n_ff_exp
    n_ff_shexp = n_ff_exp * hp.extra["n_expert_shared"]
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, qkv_bias=Need.OPTIONAL, qk_norm=Need.OPTIONAL)
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
        if il < hp.extra["n_layer_dense_lead"]:
            t.add_gated_ffn(il, n_embd, hp.n_ff[il])
            continue
        t.add_moe_ffn(il, n_embd, n_ff_exp, hp.n_expert, probs_bias=Need.REQUIRED)
        if n_ff_shexp:
            t.add_shared_experts(il, n_embd, n_ff_shexp)
    t.ignore_nextn(hp)


def build(g: LlmGraph) -> Tensor:
    hp, b = g.hp, g.b

    def ffn(layer, ffn_inp: Tensor, il: int) -> Tensor:
        cur = g.cb(g.build_norm(ffn_inp, layer.attn_post_norm, None, NormType.RMS, il), "post_attn_norm", il)
        if il < hp.extra["n_layer_dense_lead"]:
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.SILU, il)
        else:
            routed = build_moe_ffn(g, cur, layer, FfnOp.SILU, hp.extra["expert_weights_norm"], il, hp.extra["gating"])
            if hp.extra["n_expert_shared"]:
                shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                     layer.ffn_down_shexp, None, FfnOp.SILU, il)
                routed = b.add(routed, g.cb(shared, "ffn_shexp_out", il))
            cur = g.cb(routed, "ffn_out", il)
        return g.cb(b.add(cur, ffn_inp), "l_out", il)

    return g.build_decoder(ffn)


register(Architecture("glm4moe", load_hparams, tensors, build))
